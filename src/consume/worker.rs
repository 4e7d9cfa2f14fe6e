//! One delivery's life: held until its `notBefore`, a run slot, the
//! `scanId` marker, the hand-off, and what [`schedule::settle`] says after.
//! Each delivery is a task of its own, so a held job never holds up a due
//! one; the run slots (`--concurrency`) bound only hand-offs.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};

use super::handoff::Handoff;
use super::marker::Markers;
use super::meter::{ConsumeMeter, Event};
use super::now_ms;
use super::schedule::{self, Outcome, RetryPolicy, Settlement, Step};
use super::source::{AnySource, Delivery};

/// How long to wait before trying again when Valkey (markers, acks) fails.
const STORE_RETRY: Duration = Duration::from_millis(250);

/// Everything a job task needs, shared by all of them.
pub struct Worker {
    pub source: AnySource,
    pub markers: Markers,
    pub handoff: Handoff,
    pub run_slots: Arc<Semaphore>,
    pub policy: RetryPolicy,
    pub lease: Duration,
    pub meter: ConsumeMeter,
    /// Turns true on SIGTERM: held jobs are given back, no new hand-off starts.
    pub stopping: watch::Receiver<bool>,
    pub consumer: String,
    attempts: AtomicU64,
}

/// How a wait ended.
enum Waited<T> {
    Done(T),
    Stopping,
}

impl Worker {
    pub fn new(parts: WorkerParts) -> Self {
        let WorkerParts {
            source,
            markers,
            handoff,
            concurrency,
            policy,
            lease,
            meter,
            stopping,
            consumer,
        } = parts;
        Self {
            source,
            markers,
            handoff,
            run_slots: Arc::new(Semaphore::new(concurrency)),
            policy,
            lease,
            meter,
            stopping,
            consumer,
            attempts: AtomicU64::new(0),
        }
    }

    /// A token unique to one attempt of this process.
    fn token(&self) -> String {
        let n = self.attempts.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.consumer)
    }

    /// Runs `d` to its end: acked, dead-lettered, handed back to the queue,
    /// or given back on stop.
    pub async fn process(&self, d: Delivery) {
        let mut failures = 0;
        // One token for the whole delivery: a claim that timed out but
        // landed is this task's own, and a retry of it gets in.
        let token = self.token();
        loop {
            let wait = schedule::hold(d.job.not_before_ms, now_ms());
            if !wait.is_zero() {
                if self.queue_holds(&d, wait).await {
                    return;
                }
                self.meter.held(1);
                let waited =
                    self.renewing(&d, None, self.unless_stopping(tokio::time::sleep(wait)));
                let waited = waited.await;
                self.meter.held(-1);
                if let Waited::Stopping = waited {
                    return self.source.give_back(&d).await;
                }
            }
            let slot = self.unless_stopping(self.run_slots.acquire());
            let Waited::Done(Ok(slot)) = self.renewing(&d, None, slot).await else {
                return self.source.give_back(&d).await;
            };
            match self.markers.claim(d.job.scan_id, &token, self.lease).await {
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim a scan's marker; trying again");
                    drop(slot);
                    tokio::time::sleep(STORE_RETRY).await;
                    continue;
                }
                Ok(claim) => match schedule::on_claim(claim, self.lease) {
                    Step::Run => {}
                    Step::AckDuplicate => {
                        self.meter.record(Event::Duplicate);
                        return self.until_ok("ack", || self.source.ack(&d)).await;
                    }
                    Step::Later(after) => {
                        drop(slot);
                        if self.later(&d, after).await {
                            return;
                        }
                        continue;
                    }
                },
            }
            match self.hand_off(&d, &token).await {
                Ok(()) => return self.succeeded(&d).await,
                Err(error) => {
                    failures += 1;
                    drop(slot);
                    if !self.failed(&d, &token, failures, &error).await {
                        return;
                    }
                }
            }
        }
    }

    /// For SQS: lets the queue hold a job not yet due. `true`: forget it.
    async fn queue_holds(&self, d: &Delivery, wait: Duration) -> bool {
        match self.source.deliver_later(d, wait).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand a job back to the queue; holding it here");
                false
            }
        }
    }

    /// Come back after `after`: through the queue (`true`: forget it) or here.
    async fn later(&self, d: &Delivery, after: Duration) -> bool {
        if self.queue_holds(d, after).await {
            return true;
        }
        let waited = self.renewing(d, None, self.unless_stopping(tokio::time::sleep(after)));
        if let Waited::Stopping = waited.await {
            self.source.give_back(d).await;
            return true;
        }
        false
    }

    async fn hand_off(&self, d: &Delivery, token: &str) -> Result<(), String> {
        let start = now_ms();
        self.meter.record(Event::Started {
            lateness_ms: schedule::lateness_ms(start, d.job.not_before_ms),
        });
        tracing::info!(scan_id = %d.job.scan_id, tier = d.job.tier, "scan started");
        self.renewing(d, Some(token), self.handoff.run(d)).await
    }

    async fn succeeded(&self, d: &Delivery) {
        self.meter.record(Event::Succeeded);
        // Done first, then ack: a crash between the two leaves an entry
        // that the next consumer acks without running.
        self.until_ok("mark done", || self.markers.done(d.job.scan_id))
            .await;
        self.until_ok("ack", || self.source.ack(d)).await;
    }

    /// After a failed hand-off; `true`: try again here.
    async fn failed(&self, d: &Delivery, token: &str, failures: u32, error: &str) -> bool {
        self.meter.record(Event::Failed);
        tracing::warn!(scan_id = %d.job.scan_id, failures, error, "scan failed");
        self.until_ok("release", || self.markers.release(d.job.scan_id, token))
            .await;
        match schedule::settle(Outcome::Failed, failures, &self.policy) {
            Settlement::RetryAfter(wait) => !self.later(d, wait).await,
            Settlement::DeadLetter | Settlement::Ack => {
                self.meter.record(Event::DeadLettered);
                self.until_ok("dead-letter", || {
                    self.source.dead_letter(d, failures, error)
                })
                .await;
                false
            }
        }
    }

    /// Retries `op` until it succeeds: a stalled Valkey must not turn a run
    /// job into a lost ack (it would run again) or a lost release.
    async fn until_ok<F, Fut>(&self, what: &str, op: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        loop {
            match op().await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "{what} failed; trying again");
                    tokio::time::sleep(STORE_RETRY).await;
                }
            }
        }
    }

    /// `fut`, unless the consumer starts stopping first.
    async fn unless_stopping<F: Future>(&self, fut: F) -> Waited<F::Output> {
        let mut stopping = self.stopping.clone();
        tokio::select! {
            out = fut => Waited::Done(out),
            _ = stopping.wait_for(|s| *s) => Waited::Stopping,
        }
    }

    /// `fut`, renewing this consumer's hold on `d` (and the marker of the
    /// attempt `token`, if any) every quarter lease meanwhile.
    async fn renewing<F: Future>(&self, d: &Delivery, token: Option<&str>, fut: F) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        let mut tick = tokio::time::interval(self.lease / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                out = &mut fut => return out,
                _ = tick.tick() => self.renew(d, token).await,
            }
        }
    }

    async fn renew(&self, d: &Delivery, token: Option<&str>) {
        if let Err(e) = self.source.extend(d).await {
            tracing::warn!(error = %e, "cannot renew a job's lease");
        }
        if let Some(token) = token {
            match self.markers.claim(d.job.scan_id, token, self.lease).await {
                Ok(schedule::Claim::Claimed) => {}
                Ok(other) => tracing::error!(scan_id = %d.job.scan_id, ?other,
                    "lost the scan's marker while it runs (stalled longer than the lease?)"),
                Err(e) => tracing::warn!(error = %e, "cannot renew a scan's marker"),
            }
        }
    }
}

/// What [`Worker::new`] is built from.
pub struct WorkerParts {
    pub source: AnySource,
    pub markers: Markers,
    pub handoff: Handoff,
    pub concurrency: usize,
    pub policy: RetryPolicy,
    pub lease: Duration,
    pub meter: ConsumeMeter,
    pub stopping: watch::Receiver<bool>,
    pub consumer: String,
}
