//! One delivery's life: held until its `notBefore`, a run slot, the `scanId` marker, the hand-off,
//! then what [`schedule::after_hand_off`] says ([`Next`]). Each delivery is a task of its own, so a
//! held job never holds up a due one. A held job's delivery is renewed every quarter lease; a due
//! job waiting for a run slot is not, so another consumer takes it over after a lease.

use std::future::Future;
use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;
use tracing::field::display;

use super::clock::QueueClock;
use super::error::ConsumeError;
use super::handoff::{Attempt, Ended, Scanner, hand_off_of};
use super::marker::{MarkerAsk, MarkerStore, Markers, Tokens};
use super::meter::{ConsumeMeter, Event};
use super::schedule::{self, Due, MarkerClaim, Next, RetryPolicy, Stop};
use super::slots::RunSlots;
use super::source::{Delivery, GivenUp, JobSource};

/// How long to wait before trying again when Valkey (markers, acks) fails.
const STORE_RETRY: Duration = Duration::from_millis(250);

/// How long calls that must not be lost (done, release, ack) are still tried after the grace.
const LAST_TRIES: Duration = Duration::from_secs(2);

/// Everything a job task needs, shared by all of them.
pub struct Worker<S: JobSource, X: Scanner, M: MarkerStore = Markers> {
    pub source: S,
    pub markers: M,
    pub scanner: X,
    /// Hand-offs at once (`--concurrency`), within quota first.
    pub run_slots: Arc<RunSlots>,
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

/// Whether a job waits for its `notBefore` (metered as held) or for a busy marker or a backoff.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    ForNotBefore,
    Otherwise,
}

/// One attempt: the marker token it claimed with, and the number the claim gave it.
#[derive(Clone, Copy)]
struct Run<'a> {
    token: &'a str,
    number: u64,
}

impl<S: JobSource, X: Scanner, M: MarkerStore> Worker<S, X, M> {
    fn due(&self, d: &Delivery<S::Handle>) -> Due {
        Due {
            not_before: d.job.not_before_at(),
            now: self.clock.now(),
        }
    }

    /// Runs `d` to its end (acked, dead-lettered, handed back to the queue, or given back on stop)
    /// in a span that names its `scanId` and trace.
    pub async fn process(&self, d: Delivery<S::Handle>) {
        let trace_id = d.job.trace.as_ref().map(|t| display(t.trace_id));
        let span = tracing::info_span!("job", scanId = %d.job.scan_id, traceId = trace_id);
        let _ = self.run_to_end(d).instrument(span).await;
    }

    async fn run_to_end(&self, d: Delivery<S::Handle>) -> ControlFlow<()> {
        let mut failures = 0;
        // One token per attempt: a claim that timed out but landed is this task's own, so its retry
        // gets in. Each run takes a new token: its claim is a new attempt even past a late renewal.
        let mut token = self.tokens.next();
        loop {
            let wait = self.due(&d).hold();
            if !wait.is_zero() {
                self.later(&d, wait, Held::ForNotBefore).await?;
                continue;
            }
            let waiting = self.meter.waiting(d.job.lane());
            let slot = self.run_slots.acquire(d.job.lane(), d.job.tenant());
            let slot = self.unless_stopping(slot).await;
            drop(waiting);
            let Some(slot) = slot else {
                self.source.give_back(&d, Duration::ZERO).await;
                return Break(());
            };
            let number = match self.markers.claim(self.ask(&d, &token, 0)).await {
                Ok(MarkerClaim::Claimed(number)) => number,
                Ok(claim @ (MarkerClaim::Done | MarkerClaim::Gone)) => {
                    return self.let_go(&d, claim).await;
                }
                Ok(MarkerClaim::Busy) => {
                    drop(slot);
                    let after = schedule::come_back(self.lease);
                    self.later(&d, after, Held::Otherwise).await?;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot claim a scan's marker; trying again");
                    drop(slot);
                    tokio::time::sleep(STORE_RETRY).await;
                    continue;
                }
            };
            let run = Run {
                token: &token,
                number,
            };
            let ended = self.hand_off(&d, run).await;
            drop(slot);
            self.carry_out(&d, run, &ended, &mut failures).await?;
            if !crate::bug!(SameTokenAfterLostLease) {
                token = self.tokens.next();
            }
        }
    }

    /// Lets go of a job not to run: a duplicate, or one whose entry is gone from its stream.
    async fn let_go(&self, d: &Delivery<S::Handle>, claim: MarkerClaim) -> ControlFlow<()> {
        if claim == MarkerClaim::Done {
            self.meter.record(Event::Duplicate);
        } else {
            tracing::warn!(
                scan_id = %d.job.scan_id,
                "the job's entry is gone from the stream (a failover lost its landing): \
                 not run; the gate's retry of its key queues it again"
            );
        }
        self.ack(d).await;
        Break(())
    }

    /// `token`'s claim of `d`'s marker: a new attempt (`mine` 0) names the stream entry it checks
    /// is still there; a renewal of attempt `mine` does not.
    pub(super) fn ask<'a>(
        &'a self,
        d: &'a Delivery<S::Handle>,
        token: &'a str,
        mine: u64,
    ) -> MarkerAsk<'a> {
        MarkerAsk {
            scan: d.job.scan_id,
            entry: self.source.entry(d).filter(|_| mine == 0),
            token,
            mine,
            lease: self.lease,
            now: self.clock.now(),
        }
    }

    /// Carries out [`schedule::after_hand_off`]'s answer: `Continue` runs the job again here.
    async fn carry_out(
        &self,
        d: &Delivery<S::Handle>,
        run: Run<'_>,
        ended: &Result<(), Ended>,
        failures: &mut u32,
    ) -> ControlFlow<()> {
        let next =
            schedule::after_hand_off(hand_off_of(ended), *failures, &self.policy, self.lease);
        if let Next::ReleaseThenRetry { failures: n, .. }
        | Next::ReleaseThenDeadLetter { failures: n } = next
        {
            *failures = n;
        }
        self.record_end(d, run, ended, *failures);
        let release = || self.markers.release(d.job.scan_id, run.token);
        match next {
            Next::MarkDoneThenAck => {
                self.mark_done(d, run).await;
                self.ack(d).await;
                Break(())
            }
            Next::ReleaseIfMineThenLater(after) => {
                if let Err(e) = release().await {
                    tracing::warn!(error = %e, "cannot release a lost lease's marker; it expires");
                }
                self.later(d, after, Held::Otherwise).await
            }
            Next::ReleaseThenGiveBack => {
                self.until_ok("release", release).await;
                self.source.give_back(d, Duration::ZERO).await;
                Break(())
            }
            Next::ReleaseThenRetry { after, .. } => {
                self.until_ok("release", release).await;
                self.later(d, after, Held::Otherwise).await
            }
            Next::ReleaseThenDeadLetter { failures } => {
                self.until_ok("release", release).await;
                self.meter.record(Event::DeadLettered);
                let error = &ended.as_ref().err().map(Ended::to_string);
                let error = error.as_deref().unwrap_or_default();
                let why = GivenUp { failures, error };
                self.until_ok("dead-letter", || self.source.dead_letter(d, why))
                    .await;
                Break(())
            }
        }
    }

    fn record_end(
        &self,
        d: &Delivery<S::Handle>,
        run: Run<'_>,
        ended: &Result<(), Ended>,
        failures: u32,
    ) {
        let (scan_id, attempt) = (d.job.scan_id, run.number);
        match ended {
            Ok(()) => self.meter.record(Event::Succeeded),
            Err(Ended::Stopped(Stop::LeaseLost)) => {
                self.meter.record(Event::LeaseLost);
                tracing::warn!(%scan_id, attempt, "lost the scan's lease: scanner stopped");
            }
            Err(Ended::Stopped(Stop::Shutdown)) => {}
            Err(e) => {
                if *e == Ended::Stopped(Stop::Timeout) {
                    self.meter.record(Event::TimedOut);
                }
                self.meter.record(Event::Failed);
                tracing::warn!(%scan_id, attempt, failures, error = %e, "scan failed");
            }
        }
    }

    /// Come back after `after`: through the queue (`Break`: forget it) or here (`Continue`).
    async fn later(&self, d: &Delivery<S::Handle>, after: Duration, held: Held) -> ControlFlow<()> {
        match self.source.deliver_later(d, after).await {
            Ok(true) => return Break(()),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot hand a job back to the queue; holding it here")
            }
        }
        let metered = held == Held::ForNotBefore;
        if metered {
            self.meter.held(1);
        }
        let wait = self.unless_stopping(tokio::time::sleep(after));
        let waited = self.renewing(d, None, wait).await;
        if metered {
            self.meter.held(-1);
        }
        if waited.is_none() {
            self.source.give_back(d, self.due(d).hold()).await;
            return Break(());
        }
        Continue(())
    }

    async fn hand_off(&self, d: &Delivery<S::Handle>, run: Run<'_>) -> Result<(), Ended> {
        self.source.started(d, run.number).await;
        let lateness_ms = self.due(d).lateness_ms();
        let lane = d.job.lane();
        self.meter.record(Event::Started { lateness_ms, lane });
        tracing::info!(scan_id = %d.job.scan_id, tier = d.job.tier.as_str(), attempt = run.number, "scan started");
        let mut killing = self.killing.clone();
        let stop = async {
            tokio::select! {
                () = tokio::time::sleep(self.scan_timeout) => Stop::Timeout,
                stop = self.watch(d, run.token, run.number) => stop,
                _ = killing.wait_for(|k| *k) => Stop::Shutdown,
            }
        };
        let attempt = Attempt {
            delivery: d,
            number: run.number,
        };
        self.scanner.run(attempt, stop).await
    }

    /// Marks done until recorded, renewing meanwhile so a slow Valkey cannot let the scan rerun.
    async fn mark_done(&self, d: &Delivery<S::Handle>, run: Run<'_>) {
        let scan = d.job.scan_id;
        if crate::bug!(DoneNotAwaitedBeforeAck) {
            let _ = self.markers.done(scan).await;
            return;
        }
        let done = self.until_ok("mark done", || self.markers.done(scan));
        self.renewing(d, Some((run.token, run.number)), done).await;
    }

    /// Acknowledges `d`, trying for one lease at most: a redelivery then finds its done marker.
    async fn ack(&self, d: &Delivery<S::Handle>) {
        let acked = tokio::time::timeout(self.lease, self.until_ok("ack", || self.source.ack(d)));
        if acked.await.is_err() {
            tracing::warn!(scan_id = %d.job.scan_id, "cannot acknowledge a finished job; its redelivery will be");
        }
    }

    /// Retries `op` until it succeeds, or [`LAST_TRIES`] after the grace period: a stalled Valkey
    /// must not turn a run job into a lost ack (it would run again) or a lost release.
    async fn until_ok<F, Fut>(&self, what: &str, op: F)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), ConsumeError>>,
    {
        let mut killing = self.killing.clone();
        let mut give_up = std::pin::pin!(async {
            let _ = killing.wait_for(|k| *k).await;
            tokio::time::sleep(LAST_TRIES).await;
        });
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

    /// `fut`, unless the consumer starts stopping first (`None`).
    async fn unless_stopping<F: Future>(&self, fut: F) -> Option<F::Output> {
        let mut stopping = self.stopping.clone();
        // Stopping first: once it is on, no new hand-off starts.
        tokio::select! {
            biased;
            _ = stopping.wait_for(|s| *s) => None,
            out = fut => Some(out),
        }
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
