//! One delivery's life: held until its `notBefore`, a run slot, the
//! `scanId` marker, the hand-off, and what [`schedule::after_scan`] says after.
//! Each delivery is a task of its own, so a held job never holds up a due
//! one; the run slots (`--concurrency`) bound only hand-offs.
//!
//! The worker is generic over its [`JobSource`] and its [`Scanner`], and
//! reads time from the [`QueueClock`] it is given, so its scheduling is
//! tested with paused Tokio time and no server (`worker_tests.rs`).
//!
//! **Leases.** A held job's delivery is renewed every quarter lease. A due
//! job waiting for a run slot is *not* renewed: if this consumer's scans
//! keep it busy past a lease, another consumer takes the job over. A
//! running scan renews its delivery and its marker every quarter lease
//! ([`Keeper::watch`]); when the marker is lost, or no renewal is
//! known to have held for ¾ of a lease ([`schedule::must_stop`]), the
//! scanner is stopped (its process group killed) at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};

use super::clock::QueueClock;
use super::error::{ConsumeError, Stop};
use super::handoff::{Attempt, Ended, Scanner};
use super::lease::{Keeper, Tokens};
use super::marker::Markers;
use super::meter::{ConsumeMeter, Event};
use super::schedule::{self, AfterScan, RetryPolicy, ScanResult, Step};
use super::source::{Delivery, GivenUp, JobSource};

/// How long to wait before trying again when Valkey (markers, acks) fails.
const STORE_RETRY: Duration = Duration::from_millis(250);

/// How long calls that must not be lost (done, release, ack) are still
/// tried once the grace period is over (within the consumer's own
/// `KILL_WAIT`).
const LAST_TRIES: Duration = Duration::from_secs(2);

/// Everything a job task needs, shared by all of them.
pub struct Worker<S: JobSource, X: Scanner> {
    pub source: S,
    pub markers: Markers,
    pub scanner: X,
    /// Hand-offs at once (`--concurrency` permits).
    pub run_slots: Arc<Semaphore>,
    pub policy: RetryPolicy,
    pub lease: Duration,
    pub scan_timeout: Duration,
    pub meter: ConsumeMeter,
    pub clock: Arc<QueueClock>,
    /// Turns true on SIGTERM: held jobs are given back, no new hand-off starts.
    pub stopping: watch::Receiver<bool>,
    /// Turns true when the grace period is over: running scans are killed.
    pub killing: watch::Receiver<bool>,
    pub tokens: Tokens,
}

/// How a wait ended.
enum Waited<T> {
    Done(T),
    Stopping,
}

/// Whether the worker is done with a delivery.
type Finished = bool;

impl<S: JobSource, X: Scanner> Worker<S, X> {
    /// What renews this worker's deliveries and markers.
    fn keeper(&self) -> Keeper<'_, S> {
        Keeper {
            source: &self.source,
            markers: &self.markers,
            clock: &self.clock,
            lease: self.lease,
        }
    }

    fn wait_for(&self, d: &Delivery<S::Handle>) -> Duration {
        schedule::hold(d.job.not_before_ms, self.clock.now_ms())
    }

    /// Runs `d` to its end: acked, dead-lettered, handed back to the queue,
    /// or given back on stop.
    pub async fn process(&self, d: Delivery<S::Handle>) {
        let mut failures = 0;
        // One token per attempt, kept until it has run: a claim that timed
        // out but landed is this task's own, and a retry of it gets in (as
        // the same attempt). Each run takes a new one (below), so its claim
        // is a new attempt with the next number, even where the last run's
        // marker is still there under the old token (a renewal sent during
        // a stall that landed late).
        let mut token = self.tokens.next();
        loop {
            let wait = self.wait_for(&d);
            if !wait.is_zero() {
                if self.later(&d, wait, true).await {
                    return;
                }
                continue;
            }
            let Waited::Done(Ok(slot)) = self.unless_stopping(self.run_slots.acquire()).await
            else {
                return self.source.give_back(&d, Duration::ZERO).await;
            };
            let now = self.clock.now_ms();
            let attempt = match self
                .markers
                .claim(d.job.scan_id, &token, 0, self.lease, now)
                .await
            {
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim a scan's marker; trying again");
                    drop(slot);
                    tokio::time::sleep(STORE_RETRY).await;
                    continue;
                }
                Ok(claim) => match schedule::on_claim(claim, self.lease) {
                    Step::Run(attempt) => attempt,
                    Step::AckDuplicate => {
                        self.meter.record(Event::Duplicate);
                        return self.ack(&d).await;
                    }
                    Step::Later(after) => {
                        drop(slot);
                        if self.later(&d, after, false).await {
                            return;
                        }
                        continue;
                    }
                },
            };
            let ended = self.hand_off(&d, &token, attempt).await;
            drop(slot);
            let end = (attempt, ended);
            if self.after_hand_off(&d, &token, end, &mut failures).await {
                return;
            }
            token = self.tokens.next();
        }
    }

    /// Carries out what a hand-off's end calls for.
    async fn after_hand_off(
        &self,
        d: &Delivery<S::Handle>,
        token: &str,
        (attempt, ended): (u64, Result<(), Ended>),
        failures: &mut u32,
    ) -> Finished {
        match ended {
            Ok(()) => {
                self.succeeded(d, token, attempt).await;
                true
            }
            Err(Ended::Stopped(Stop::LeaseLost)) => {
                // Not this attempt's scan any more: no failure of ours. The
                // marker says what next (done: ack; busy: later); it is
                // released only if this attempt's token still holds it (a
                // renewal that landed late), so the next attempt need not
                // wait that lease out. Once: the lease ends it anyway.
                self.meter.record(Event::LeaseLost);
                tracing::warn!(scan_id = %d.job.scan_id, attempt, "lost the scan's lease: scanner stopped");
                if let Err(e) = self.markers.release(d.job.scan_id, token).await {
                    tracing::warn!(error = %e, "cannot release a lost lease's marker; it expires");
                }
                self.later(d, self.lease / 2, false).await
            }
            Err(Ended::Stopped(Stop::Shutdown)) => {
                // The scanner is gone: free the marker, so whoever takes the
                // job over need not wait out the lease.
                self.until_ok("release", || self.markers.release(d.job.scan_id, token))
                    .await;
                self.source.give_back(d, Duration::ZERO).await;
                true
            }
            Err(e) => {
                if e == Ended::Stopped(Stop::Timeout) {
                    self.meter.record(Event::TimedOut);
                }
                *failures += 1;
                !self.failed(d, token, *failures, &e.to_string()).await
            }
        }
    }

    /// Come back after `after`: through the queue (`true`: forget it) or
    /// here. `held` says the job waits for its `notBefore` (metered as held).
    async fn later(&self, d: &Delivery<S::Handle>, after: Duration, held: bool) -> Finished {
        match self.source.deliver_later(d, after).await {
            Ok(true) => return true,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand a job back to the queue; holding it here")
            }
        }
        if held {
            self.meter.held(1);
        }
        let wait = self.unless_stopping(tokio::time::sleep(after));
        let waited = self.keeper().renewing(d, None, wait);
        let waited = waited.await;
        if held {
            self.meter.held(-1);
        }
        if let Waited::Stopping = waited {
            self.source.give_back(d, self.wait_for(d)).await;
            return true;
        }
        false
    }

    async fn hand_off(
        &self,
        d: &Delivery<S::Handle>,
        token: &str,
        attempt: u64,
    ) -> Result<(), Ended> {
        self.source.started(d, attempt).await;
        let start = self.clock.now_ms();
        self.meter.record(Event::Started {
            lateness_ms: schedule::lateness_ms(start, d.job.not_before_ms),
        });
        tracing::info!(scan_id = %d.job.scan_id, tier = d.job.tier.as_str(), attempt, "scan started");
        let mut killing = self.killing.clone();
        let stop = async {
            tokio::select! {
                () = tokio::time::sleep(self.scan_timeout) => Stop::Timeout,
                stop = self.keeper().watch(d, token, attempt) => stop,
                _ = killing.wait_for(|k| *k) => Stop::Shutdown,
            }
        };
        let attempt = Attempt {
            delivery: d,
            number: attempt,
        };
        self.scanner.run(attempt, stop).await
    }

    /// Marks the scan done, then acks it: a crash between the two leaves an
    /// entry that the next consumer acks without running. Until done is
    /// recorded the delivery and the marker stay renewed, so a slow Valkey
    /// does not let the finished scan be taken over and run again.
    async fn succeeded(&self, d: &Delivery<S::Handle>, token: &str, attempt: u64) {
        self.meter.record(Event::Succeeded);
        let done = self.until_ok("mark done", || self.markers.done(d.job.scan_id));
        self.keeper()
            .renewing(d, Some((token, attempt)), done)
            .await;
        self.ack(d).await;
    }

    /// Acknowledges `d`, trying for at most one lease: after that the queue
    /// delivers it again, and its done marker has it acked without running.
    async fn ack(&self, d: &Delivery<S::Handle>) {
        let acked = tokio::time::timeout(self.lease, self.until_ok("ack", || self.source.ack(d)));
        if acked.await.is_err() {
            tracing::warn!(scan_id = %d.job.scan_id, "cannot acknowledge a finished job; its redelivery will be");
        }
    }

    /// After a failed hand-off; `true`: try again here.
    async fn failed(
        &self,
        d: &Delivery<S::Handle>,
        token: &str,
        failures: u32,
        error: &str,
    ) -> bool {
        self.meter.record(Event::Failed);
        tracing::warn!(scan_id = %d.job.scan_id, failures, error, "scan failed");
        self.until_ok("release", || self.markers.release(d.job.scan_id, token))
            .await;
        match schedule::after_scan(ScanResult::Failed, failures, &self.policy) {
            AfterScan::RetryAfter(wait) => !self.later(d, wait, false).await,
            AfterScan::DeadLetter | AfterScan::Ack => {
                self.meter.record(Event::DeadLettered);
                self.until_ok("dead-letter", || {
                    self.source.dead_letter(d, GivenUp { failures, error })
                })
                .await;
                false
            }
        }
    }

    /// Retries `op` until it succeeds, or [`LAST_TRIES`] after the grace
    /// period ended: a stalled Valkey must not turn a run job into a lost
    /// ack (it would run again) or a lost release.
    async fn until_ok<F, Fut>(&self, what: &str, op: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), ConsumeError>>,
    {
        let mut killing = self.killing.clone();
        let give_up = async {
            let _ = killing.wait_for(|k| *k).await;
            tokio::time::sleep(LAST_TRIES).await;
        };
        let mut give_up = std::pin::pin!(give_up);
        loop {
            let e = tokio::select! {
                done = op() => match done {
                    Ok(()) => return,
                    Err(e) => e,
                },
                () = &mut give_up => {
                    tracing::error!("{what}: given up, the grace period is over");
                    return;
                }
            };
            tracing::warn!(error = %e, "{what} failed; trying again");
            tokio::time::sleep(STORE_RETRY).await;
        }
    }

    /// `fut`, unless the consumer starts stopping first.
    async fn unless_stopping<F: Future>(&self, fut: F) -> Waited<F::Output> {
        let mut stopping = self.stopping.clone();
        // Stopping first: once it is on, no new hand-off starts.
        tokio::select! {
            biased;
            _ = stopping.wait_for(|s| *s) => Waited::Stopping,
            out = fut => Waited::Done(out),
        }
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
