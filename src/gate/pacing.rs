//! Step 6 for a fresh scan: its delay (paced where the pacing rule applies), its sleep lease, and
//! the refusal of a full line, remembered ([`super::refused`]) so the line's next scans are refused
//! without the store (`known_refused`, on the request path).

use std::time::Duration;

use tracing::Instrument;

use super::attempt::Attempt;
use super::trace::step;
use super::wiring::Gate;
use crate::gate::error::GateError;
use crate::io::queue::ScanQueue;
use crate::io::store::{PaceArgs, QuotaStore};
use crate::rules::decide::decide;
use crate::rules::delay::{LoneSleepAsk, SleepLease};
use crate::rules::pace::Paced;
use crate::rules::settle::{self, Charge, DelayRule, Failure, Scan};
use crate::rules::unix::{UnixSecs, duration_ms};

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    /// A scan past the backlog cap is refused and its count taken back.
    pub(super) async fn delay_of(
        &self,
        attempt: &Attempt,
        scan: &Scan,
    ) -> Result<(Duration, Option<SleepLease>), GateError> {
        match settle::delay_rule(&scan.charge, self.shadow(), self.config.policy.pacing) {
            DelayRule::Fixed(delay) if delay.is_zero() => Ok((delay, None)),
            // Only an over-quota scan is paced: those steps stay off a within-quota scan's future.
            DelayRule::Fixed(delay) => {
                let sleep_lease = self.sleep_lease(attempt, scan, delay);
                let span = step!("pace", attempt.trace_id());
                Ok((delay, Box::pin(sleep_lease.instrument(span)).await))
            }
            DelayRule::Pace(tier_delay) => {
                let paced = self.paced(attempt, scan, tier_delay);
                Box::pin(paced.instrument(step!("pace", attempt.trace_id()))).await
            }
        }
    }

    /// A sleep lease asked alone, for a fixed `delay` no pacing step carries (`QUOTA_PACING=off`).
    async fn sleep_lease(
        &self,
        attempt: &Attempt,
        scan: &Scan,
        delay: Duration,
    ) -> Option<SleepLease> {
        let ask = attempt.sleep_ask(&self.config.policy, scan.scan_id)?;
        let taken = self.store.take_sleep_lease(LoneSleepAsk {
            ask,
            arrival: scan.received_ms,
            wait_ms: duration_ms(delay),
        });
        self.bounded(taken).await.ok()
    }

    async fn paced(
        &self,
        attempt: &Attempt,
        scan: &Scan,
        tier_delay: Duration,
    ) -> Result<(Duration, Option<SleepLease>), GateError> {
        let Charge::Counted { count, .. } = &scan.charge else {
            return Ok((tier_delay, None));
        };
        // Each line's own tier delay: the subject's, and each level's.
        let subject = decide(count.used, &attempt.limits.with_grant(count.grant));
        let levels = attempt.pace_lanes();
        let args = PaceArgs {
            key: &attempt.key,
            levels: &levels,
            record: attempt.claim.as_ref().map(|c| c.record.as_str()),
            arrival_ms: scan.received_ms,
            delay_ms: duration_ms(subject.delay),
            max_backlog_ms: duration_ms(self.config.policy.max_backlog),
            reset_at: count.reset_at,
            sleep_ask: attempt.sleep_ask(&self.config.policy, scan.scan_id),
        };
        let paced = self.bounded(self.store.pace(args)).await;
        if let Err(e) = &paced {
            tracing::warn!(error = %e, "pacing failed; using the tier's delay");
        }
        let (retry_after_ms, levels_ms) = match settle::paced_delay(paced.ok(), tier_delay) {
            Paced::Slot {
                delay_ms,
                sleep_lease,
            } => return Ok((Duration::from_millis(delay_ms), sleep_lease)),
            Paced::Full {
                retry_after_ms,
                levels_ms,
            } => (retry_after_ms, levels_ms),
        };
        Box::pin(self.apply(attempt, scan, Failure::BacklogFull)).await;
        // Remembered: the subject and each full level until its own retry, never past its reset.
        let until = |ms: u64, reset_at: UnixSecs| {
            let at = scan.received_ms.saturating_add(Duration::from_millis(ms));
            at.min(reset_at.millis())
        };
        let now = attempt.now_ms;
        let subject_until = until(retry_after_ms, count.reset_at);
        self.refused.remember(&attempt.key, subject_until, now);
        for (level, ms) in levels.iter().zip(levels_ms).filter(|(_, ms)| *ms > 0) {
            self.refused
                .remember(level.key, until(ms, level.reset_at), now);
        }
        // Never past the counter's reset: from then the scan is within quota.
        Err(GateError::backlog_full(
            retry_after_ms,
            Some(count.seconds_to_reset()),
        ))
    }
}
