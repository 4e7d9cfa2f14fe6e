//! The consumer as a Lambda function (`QUOTA_ROLE=consume`) on SQS events, answering with the
//! messages to leave on their queue. Each goes through `consume`'s own [`Worker`] and markers; near
//! the deadline running scans are stopped and handed back, else Lambda redelivers the whole batch.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use lambda_runtime::{LambdaEvent, service_fn};
use tokio::sync::watch;

use crate::config::{Config, QueueTarget};
use crate::consume::clock::QueueClock;
use crate::consume::handoff::Handoff;
use crate::consume::marker::{Markers, Tokens};
use crate::consume::meter::ConsumeMeter;
use crate::consume::schedule::RetryPolicy;
use crate::consume::slots::RunSlots;
use crate::consume::source::sqs::SqsSource;
use crate::consume::source::sqs_batch::{BatchResponse, SOURCE, SqsBatch, SqsEvent};
use crate::consume::worker::Worker;

/// Which handler the `bootstrap` binary serves.
pub const ROLE: &str = "QUOTA_ROLE";
/// The scanner the consumer function POSTs each due job to.
pub const SCANNER_URL: &str = "SCANNER_URL";

/// The marker lease and a held message's visibility renewal, as `consume`'s default `--lease`.
const LEASE: Duration = Duration::from_secs(30);
/// How long before the invocation's deadline running scans are stopped.
pub const STOP_BEFORE_DEADLINE: Duration = Duration::from_secs(5);
/// The longest one scan may run: Lambda's own limit.
const SCAN_TIMEOUT: Duration = Duration::from_secs(900);
/// A failed scan's message comes back after this; the queue's `maxReceiveCount` bounds the tries.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// What the `bootstrap` binary is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The gate: API Gateway events in.
    Gate,
    /// The consumer: SQS events in.
    Consume,
}

impl Role {
    /// `QUOTA_ROLE` as `lookup` has it.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        match lookup(ROLE).as_deref() {
            None | Some("" | "gate") => Ok(Self::Gate),
            Some("consume") => Ok(Self::Consume),
            Some(other) => Err(format!("{ROLE}: {other:?} is not gate or consume")),
        }
    }
}

/// The consumer function's parts, built once per cold start.
pub struct Consumer {
    /// The queues it reads: the scan queue and the over lane's.
    lanes: Arc<[SqsSource]>,
    markers: Markers,
    clock: Arc<QueueClock>,
    scanner: Handoff,
    meter: ConsumeMeter,
}

impl Consumer {
    /// From the process environment (secret references read).
    pub async fn from_env() -> Result<Self, String> {
        let config = crate::io::secrets::config_from_env()
            .await
            .map_err(|e| e.to_string())?;
        let scanner = std::env::var(SCANNER_URL).unwrap_or_default();
        let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let meter = ConsumeMeter::new(&config.metrics_namespace, SOURCE, true);
        Self::new(&config, &scanner, &sdk, meter)
    }

    /// A consumer of `config`'s queues handing jobs to the `scanner` URL.
    pub fn new(
        config: &Config,
        scanner: &str,
        sdk: &aws_config::SdkConfig,
        meter: ConsumeMeter,
    ) -> Result<Self, String> {
        if scanner.is_empty() {
            return Err(format!("{SCANNER_URL}: required with {ROLE}=consume"));
        }
        let scanner = Handoff::post(scanner, None).map_err(|e| format!("{SCANNER_URL}: {e}"))?;
        let QueueTarget::Sqs(within) = &config.queue else {
            return Err(format!(
                "SCAN_QUEUE_URL: the consumer function reads an SQS queue ({ROLE}=consume)"
            ));
        };
        let urls = std::iter::once(within.as_str()).chain(config.queue_over.as_deref());
        let lanes = urls.map(|url| SqsSource::new(sdk, url, LEASE)).collect();
        let ops = crate::consume::ops_valkey(config)?;
        let alone = "this environment only; a message SQS delivers twice may run twice";
        let (markers, clock) = crate::consume::sqs_markers(ops, within, config, alone);
        Ok(Self {
            lanes,
            markers,
            clock,
            scanner,
            meter,
        })
    }

    /// Runs one SQS event's jobs, each to its end or the deadline `remaining` away.
    pub async fn handle(&self, event: SqsEvent, remaining: Option<Duration>) -> BatchResponse {
        if let Err(e) = self.clock.sync().await {
            tracing::warn!(error = %e, "cannot read Valkey's clock; timing by the last reading");
        }
        let ids: Vec<String> = event.records.iter().map(|r| r.message_id.clone()).collect();
        let source = SqsBatch::new(self.lanes.clone());
        let deliveries = source.deliveries(event.records);
        let (stop, stopping) = watch::channel(false);
        let worker = self.worker(source, deliveries.len(), stopping);
        let runs =
            futures_util::future::join_all(deliveries.into_iter().map(|d| worker.process(d)));
        let deadline = async move {
            match remaining {
                Some(left) => tokio::time::sleep(left.saturating_sub(STOP_BEFORE_DEADLINE)).await,
                None => std::future::pending().await,
            }
            tracing::warn!("the invocation's deadline is near: stopping its scans");
            let _ = stop.send(true);
            // Held until the runs end: a closed channel reads as stopping too.
            std::future::pending::<()>().await;
        };
        tokio::select! {
            _ = runs => {}
            () = deadline => {}
        }
        // Out before the environment is frozen.
        crate::io::stdout::LineWriter::stdout()
            .drain(Duration::from_secs(1))
            .await;
        worker.source.response(ids.iter().map(String::as_str))
    }

    /// This invocation's worker: all `jobs` run at once, and stop when `stopping` turns true.
    fn worker(
        &self,
        source: SqsBatch,
        jobs: usize,
        stopping: watch::Receiver<bool>,
    ) -> Worker<SqsBatch, Handoff> {
        Worker {
            source,
            markers: self.markers.clone(),
            scanner: self.scanner.clone(),
            run_slots: RunSlots::new(jobs.max(1), 4),
            policy: RetryPolicy {
                max_attempts: std::num::NonZeroU32::MAX,
                base: RETRY_AFTER,
                cap: RETRY_AFTER,
            },
            lease: LEASE,
            scan_timeout: SCAN_TIMEOUT,
            meter: self.meter.clone(),
            clock: self.clock.clone(),
            killing: stopping.clone(),
            stopping,
            tokens: Tokens::new(SOURCE.to_owned()),
        }
    }
}

/// Serves SQS events until the runtime stops.
pub async fn run(consumer: Arc<Consumer>) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let consumer = consumer.clone();
        async move {
            let remaining = super::lambda::time_left(&event.context);
            Ok::<_, Infallible>(consumer.handle(event.payload, remaining).await)
        }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `QUOTA_ROLE` picks the handler; unset is the gate; anything else is refused, by name.
    #[test]
    fn roles() {
        let role = |v: Option<&str>| Role::from_lookup(|_| v.map(str::to_owned));
        assert_eq!(role(None), Ok(Role::Gate));
        assert_eq!(role(Some("gate")), Ok(Role::Gate));
        assert_eq!(role(Some("consume")), Ok(Role::Consume));
        assert!(
            role(Some("consumer"))
                .unwrap_err()
                .starts_with("QUOTA_ROLE")
        );
    }
}
