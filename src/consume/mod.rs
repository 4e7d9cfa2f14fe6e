//! `quota-gate consume`: the consumer that honours `notBefore` and runs each `scanId` once (a
//! stream or the spool cannot hold a job back, SQS only for 900 s). It holds each job until its
//! `notBefore` in a task of its own and hands due jobs to the scanner ([`handoff`]), at most
//! `--concurrency` at once, within-quota ones first ([`slots`]).
//!
//! A scanner dies with its consumer ([`guard`]) and is killed at `--scan-timeout` or when its lease
//! is lost. On SIGTERM the consumer reads nothing more, gives held jobs back, and gives running
//! hand-offs `--grace` before killing them: nothing is acknowledged that did not run.

pub mod clock;
pub mod error;
pub mod guard;
pub mod handoff;
pub mod lease;
pub mod listen;
pub mod marker;
pub mod meter;
pub mod options;
pub mod post;
pub mod schedule;
pub mod slots;
pub mod source;
pub mod sync;
pub mod worker;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::task::AbortOnDropHandle;

use crate::config::{Config, QueueTarget};
use crate::io::connection::Valkey;
use crate::io::eviction_watch::{Watch, until_refused};
use crate::io::meter::emf::Sink;
use crate::io::meter::store::{Process, StoreMeter};
use crate::io::queue::stream::lane_key;
use crate::io::stdout::LineWriter;
use crate::rules::job::Lane;
use clock::QueueClock;
use handoff::Handoff;
use marker::{Markers, Tokens};
use meter::ConsumeMeter;
use source::JobSource;
use source::stream::StreamSource;
use worker::Worker;

pub use options::ConsumeArgs;

/// How long killed hand-offs get to be reaped after the grace period.
const KILL_WAIT: Duration = Duration::from_secs(5);

const LOCAL: crate::io::clock::Clock = crate::io::clock::Clock::System;

const NO_VALKEY: &str = "a valkey-stream source needs VALKEY_URL";

/// A connection to `config`'s Valkey for marker and ack calls: the store's bound, with room for a
/// busy machine.
pub fn ops_valkey(config: &Config) -> Result<Option<Valkey>, String> {
    let timeout = config.store.timeout.max(Duration::from_secs(1));
    Valkey::from_config_within(config, timeout).map_err(|e| e.to_string())
}

/// `VALKEY_WAIT_REPLICAS`: the replicas a claim and a done marker must reach.
fn wait_replicas(config: &Config) -> u32 {
    config.store.valkey.as_ref().map_or(0, |v| v.wait_replicas)
}

/// The markers and clock of the SQS queue `url` (`sqs:<name>`, the same for the consumer and the
/// consumer function): on `ops` if there is a Valkey, else kept in `alone` (the text a warning
/// then ends with).
pub fn sqs_markers(
    ops: Option<Valkey>,
    url: &str,
    config: &Config,
    alone: &str,
) -> (Markers, Arc<QueueClock>) {
    let Some(ops) = ops else {
        tracing::warn!("no VALKEY_URL: scanId markers are kept in {alone}");
        return (Markers::local(), QueueClock::local(LOCAL));
    };
    let key = format!("sqs:{}", source::sqs::queue_name(url));
    let markers = Markers::valkey(ops.clone(), &key, wait_replicas(config));
    (markers, QueueClock::new(LOCAL, Some(ops)))
}

/// Everything but the source that a consumer is built from.
struct Parts {
    args: ConsumeArgs,
    handoff: Handoff,
    config: Config,
}

/// Runs the consumer until `shutdown` ends (or the end of standard input).
pub async fn run(
    args: ConsumeArgs,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let handoff = args.handoff()?;
    guard::keep_from_the_scanner();
    if let Some(addr) = args.metrics_listen {
        listen::serve_metrics(addr).await?;
    }
    let target = args.source(&config.queue)?;
    let ops = ops_valkey(&config)?;
    // Ready when the Valkey it reads or marks on answers (none for stdin).
    let probed = ops.clone().filter(|_| target != QueueTarget::Spool);
    let _health = match args.health_listen {
        Some(addr) => Some(listen::serve_health(addr, probed).await?),
        None => None,
    };
    let parts = Parts {
        args,
        handoff,
        config,
    };
    match target {
        QueueTarget::Spool => {
            let open = source::stdin::StdinSource::open(parts.args.journal.as_deref()).await;
            let (source, started) = open.map_err(|e| e.to_string())?;
            let (markers, clock) = (Markers::local_after(started), QueueClock::local(LOCAL));
            parts
                .drive(vec![source], markers, clock, None, shutdown)
                .await
        }
        QueueTarget::ValkeyStream(key) => parts.run_stream(&key, ops, shutdown).await,
        QueueTarget::Sqs(url) => parts.run_sqs(&url, ops, shutdown).await,
    }
}

impl Parts {
    /// Starts the store's eviction watch, if any: an evicting store loses jobs and markers too.
    async fn watch_store(&self, ops: Option<&Valkey>) -> Result<Option<Watch>, String> {
        let Some(ops) = ops else { return Ok(None) };
        let emf = (!self.args.no_emf).then(|| Sink::Background(LineWriter::stdout(), None));
        let meter = StoreMeter::new(&self.config.metrics_namespace, Process::Consume, emf);
        let watch = crate::io::eviction_watch::start(ops, &self.config.store, meter).await?;
        Ok(Some(watch))
    }

    /// [`Parts::drive`] on the stream `key`'s two lanes ([`lane_key`]).
    async fn run_stream(
        self,
        key: &str,
        ops: Option<Valkey>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), String> {
        let ops = ops.ok_or(NO_VALKEY)?;
        let watch = self.watch_store(Some(&ops)).await?;
        let (a, consumer) = (&self.args, &self.args.consumer_name());
        let mut sources = Vec::new();
        for lane in [Lane::Within, Lane::Over] {
            // A blocking read holds its connection: one per lane.
            let reads = ops_valkey(&self.config)?.ok_or(NO_VALKEY)?;
            let key = lane_key(key, lane);
            let open = StreamSource::open(reads, ops.clone(), &key, &a.group, consumer, a.lease);
            sources.push(open.await.map_err(|e| e.to_string())?);
        }
        crate::io::queue::stream::warn_without_persistence(&ops, key).await;
        let markers = Markers::valkey(ops.clone(), key, wait_replicas(&self.config));
        let clock = QueueClock::new(LOCAL, Some(ops));
        self.drive(sources, markers, clock, watch, shutdown).await
    }

    /// [`Parts::drive`] on the SQS queue `url` (and its over lane), with markers and clock on `ops`
    /// if any.
    async fn run_sqs(
        self,
        url: &str,
        ops: Option<Valkey>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), String> {
        let over = self.args.over_lane(&self.config)?;
        let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let lanes = std::iter::once(url).chain(over.as_deref());
        let sources = lanes
            .map(|url| source::sqs::SqsSource::new(&sdk, url, self.args.lease))
            .collect();
        let watch = self.watch_store(ops.as_ref()).await?;
        let alone =
            "this process only; a message SQS delivers twice to two consumers may run twice";
        let (markers, clock) = sqs_markers(ops, url, &self.config, alone);
        self.drive(sources, markers, clock, watch, shutdown).await
    }

    /// Runs one consumer on `sources` (a queue's lanes) until `shutdown`, the sources' end, or
    /// `watch` refusing the store.
    async fn drive<S: JobSource>(
        self,
        sources: Vec<S>,
        markers: Markers,
        clock: Arc<QueueClock>,
        watch: Option<Watch>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), String> {
        let (shutdown, refusal) = until_refused(watch, shutdown);
        let (args, handoff) = (&self.args, &self.handoff);
        let consumer = args.consumer_name();
        if let Err(e) = clock.sync().await {
            tracing::warn!(error = %e, "cannot read Valkey's clock yet; timing by this machine's until it answers");
        }
        let _sync = AbortOnDropHandle::new(tokio::spawn(clock.clone().keep_in_sync()));
        let name = sources.first().map_or("none", JobSource::name);
        let meter = ConsumeMeter::new(&self.config.metrics_namespace, name, !args.no_emf);
        let (stop, stopping) = watch::channel(false);
        let (kill, killing) = watch::channel(false);
        let _signal = AbortOnDropHandle::new(tokio::spawn(async move {
            shutdown.await;
            tracing::info!("stopping: no new jobs; running ones get the grace period");
            let _ = stop.send(true);
            // Held until the consumer ends: a closed channel would read as "not stopping".
            std::future::pending::<()>().await;
        }));
        tracing::info!(source = name, consumer, "quota-gate consuming");
        // The lanes share the run slots (within quota first) and the markers.
        let run_slots = slots::RunSlots::new(args.concurrency.get(), args.over_every.get());
        let lanes = sources.into_iter().map(|source| {
            let worker = Arc::new(Worker {
                source,
                markers: markers.clone(),
                scanner: handoff.clone(),
                run_slots: run_slots.clone(),
                policy: args.retry_policy(),
                lease: args.lease,
                scan_timeout: args.scan_timeout,
                meter: meter.clone(),
                clock: clock.clone(),
                stopping: stopping.clone(),
                killing: killing.clone(),
                tokens: Tokens::new(consumer.clone()),
            });
            let (stopping, kill) = (stopping.clone(), &kill);
            async move {
                let tasks = intake(worker, args.max_held.get(), stopping.clone()).await;
                finish(tasks, args.grace, stopping, kill).await;
            }
        });
        futures_util::future::join_all(lanes).await;
        LineWriter::stdout().drain(Duration::from_secs(2)).await;
        refusal.or(Ok(()))
    }
}

/// Reads jobs and starts a task for each, at most `max_held` unfinished, until stopping (then gives
/// back what the source buffers) or the end of input. Public for the simulator.
pub async fn intake<S: JobSource, X: handoff::Scanner, M: marker::MarkerStore>(
    worker: Arc<Worker<S, X, M>>,
    max_held: usize,
    mut stopping: watch::Receiver<bool>,
) -> JoinSet<()> {
    let room = Arc::new(Semaphore::new(max_held));
    let mut tasks = JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let read = async {
            let permit = room.clone().acquire_owned().await;
            let free = room.available_permits() + 1;
            (permit, worker.source.next(free.min(64)).await)
        };
        // Stopping first: once it is on, nothing more is read.
        let (first, next) = tokio::select! {
            biased;
            _ = stopping.wait_for(|s| *s) => {
                for d in worker.source.drain().await {
                    worker.source.give_back(&d, Duration::ZERO).await;
                }
                return tasks;
            }
            read = read => read,
        };
        let deliveries = match next {
            Ok(Some(d)) => d,
            Ok(None) => {
                tracing::info!("end of input: finishing the jobs read");
                return tasks;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read jobs; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let mut first = first.ok();
        for d in deliveries {
            let permit = first
                .take()
                .or_else(|| room.clone().try_acquire_owned().ok());
            let worker = worker.clone();
            tasks.spawn(async move {
                let _permit = permit;
                worker.process(d).await;
            });
        }
    }
}

/// Waits for the tasks, after stopping `grace` more; then kills the rest, waiting [`KILL_WAIT`].
async fn finish(
    mut tasks: JoinSet<()>,
    grace: Duration,
    mut stopping: watch::Receiver<bool>,
    kill: &watch::Sender<bool>,
) {
    let stop_then_grace = async {
        let _ = stopping.wait_for(|s| *s).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        () = async { while tasks.join_next().await.is_some() {} } => return,
        () = stop_then_grace => {}
    }
    tracing::warn!(
        jobs = tasks.len(),
        "grace period over: killing the scanners still running"
    );
    let _ = kill.send(true);
    let reaped = tokio::time::timeout(KILL_WAIT, async {
        while tasks.join_next().await.is_some() {}
    });
    if reaped.await.is_err() {
        tasks.shutdown().await;
    }
}
