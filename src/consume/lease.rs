//! Holding on to a delivery: the worker's renewals (every quarter lease) that keep a job this
//! consumer's while it waits or runs. A running scan's watch ends when the
//! marker is lost or no renewal is known to have held for ¾ of a lease ([`Silence::must_stop`]), at
//! that deadline even while a renewal call still waits.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::handoff::Scanner;
use super::marker::MarkerStore;
use super::schedule::{self, Renewal, Silence, Stop};
use super::source::{Delivery, JobSource};
use super::worker::Worker;

impl<S: JobSource, X: Scanner, M: MarkerStore> Worker<S, X, M> {
    /// Renews the delivery and the marker every quarter lease; ends when the scan must stop.
    pub(super) async fn watch(&self, d: &Delivery<S::Handle>, token: &str, attempt: u64) -> Stop {
        let mut tick = quarter_lease(self.lease);
        let mut last_held = Instant::now();
        loop {
            // A round may outlast the silence a scan is allowed (a stalled call waits out its
            // timeout): the scan stops when the silence ends, not when the call gives up.
            let mut silence_ends = last_held + Silence::allowed(self.lease);
            if crate::bug!(StopWaitsForStalledRenewal) {
                silence_ends += Duration::from_secs(crate::rules::unix::DAY_SECS.unsigned_abs());
            }
            let round = async {
                tick.tick().await;
                let sent = Instant::now();
                (sent, self.renew(d, Some((token, attempt))).await)
            };
            let Ok((sent, renewal)) = tokio::time::timeout_at(silence_ends, round).await else {
                return Stop::LeaseLost;
            };
            if renewal == Renewal::Held {
                last_held = sent;
            }
            let silence = Silence {
                since_held: last_held.elapsed(),
                lease: self.lease,
            };
            if silence.must_stop(renewal) {
                return Stop::LeaseLost;
            }
        }
    }

    /// Renews the delivery, then the marker of `attempt` if given: how the marker's renewal went.
    async fn renew(&self, d: &Delivery<S::Handle>, attempt: Option<(&str, u64)>) -> Renewal {
        if let Err(e) = self.source.extend(d).await {
            tracing::warn!(error = %e, "cannot renew a job's lease");
        }
        let Some((token, mine)) = attempt else {
            return Renewal::Unknown;
        };
        match self.markers.claim(self.ask(d, token, mine)).await {
            Ok(schedule::MarkerClaim::Claimed(_)) => Renewal::Held,
            Ok(_) => Renewal::Lost,
            Err(e) => {
                tracing::warn!(error = %e, "cannot renew a scan's marker");
                Renewal::Unknown
            }
        }
    }

    /// `fut`, renewing the hold on `d` (and the marker of `attempt`, if given) every quarter lease.
    pub(super) async fn renewing<F: Future>(
        &self,
        d: &Delivery<S::Handle>,
        attempt: Option<(&str, u64)>,
        fut: F,
    ) -> F::Output {
        let mut fut = std::pin::pin!(fut);
        let mut tick = quarter_lease(self.lease);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                // A done marker stays done: claim.lua never overwrites it.
                _ = tick.tick() => {
                    self.renew(d, attempt).await;
                }
            }
        }
    }
}

/// Ticks every quarter `lease`, the first a quarter lease from now.
fn quarter_lease(lease: Duration) -> tokio::time::Interval {
    let quarter = lease / 4;
    let mut tick = tokio::time::interval_at(Instant::now() + quarter, quarter);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}
