//! The writes after a scan's end: a failure's [`Settlement`] carried out, and a keyed scan's answer
//! saved. Both go behind everything the attempt sent, on the same connection while it lives.

use std::time::Duration;

use bytes::Bytes;
use http::Response;
use tokio::time::Instant;
use uuid::Uuid;

use super::attempt::Attempt;
use super::wiring::Gate;
use crate::gate::error::GateError;
use crate::io::queue::ScanQueue;
use crate::io::store::{
    Claim, CountFailed, NoAnswer, QuotaKey, QuotaStore, RecordField, RecordState, RecordUpdate,
    Refund, SendError,
};
use crate::rules::level::Level;
use crate::rules::settle::{
    AfterStoreFailure, Charge, Failure, Scan, Settlement, after_store_failure, level_refund,
    levels_refunded, settle,
};
use crate::rules::unix::UnixSecs;

/// The longest a failed settlement is retried: the client waits for its answer meanwhile, and a
/// failover that has not moved the endpoint by then will not soon.
pub(super) const SETTLE_WITHIN: Duration = Duration::from_secs(5);

/// The first retry's wait, doubling up to [`RETRY_MOST`]. Each try itself waits up to the store
/// timeout for a connection, so these only space out tries that fail at once.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_millis(500);

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    /// Settles a failed scan: the subject's [`Settlement`], then each level's refund behind it.
    pub(super) async fn apply(&self, attempt: &Attempt, scan: &Scan, failure: Failure) {
        let (scan_id, charge) = (scan.scan_id, &scan.charge);
        let keyed = attempt.keyed();
        let mut settlement = settle(charge, keyed, failure);
        if crate::bug!(RefundOfUnsentCount) && *charge == Charge::Unmetered {
            settlement = Settlement::Refund {
                period_end: UnixSecs(i64::MAX),
            };
        }
        let levels: Vec<(&QuotaKey, UnixSecs)> =
            if levels_refunded(charge, keyed, failure) && !crate::bug!(LevelNotRefunded) {
                let refund = |l: &'_ Level| level_refund(l.count.as_ref()?, attempt.period_end);
                let levels = attempt.levels.iter();
                levels.filter_map(|l| Some((&l.key, refund(l)?))).collect()
            } else {
                Vec::new()
            };
        // Levels go in the subject's refund command: a keyed refund not the claim's takes none.
        if matches!(settlement, Settlement::Refund { .. }) && !crate::bug!(LevelRefundUnguarded) {
            return self
                .settle_subject(attempt, scan_id, settlement, &levels)
                .await;
        }
        // Refused outright while the subject's count never happened:
        // what a level counted alone (a cluster node) goes back.
        self.settle_subject(attempt, scan_id, settlement, &[]).await;
        for (key, period_end) in levels {
            let refund = Refund {
                key,
                period_end,
                levels: &[],
                record: None,
                now: attempt.now(),
            };
            if let Err(e) = self.store.refund(refund).await {
                tracing::warn!(error = %e, "could not take a level's count back");
            }
        }
    }

    /// The count failed: settle what it may have left, then refuse or go on unmetered.
    pub(super) async fn store_failed(
        &self,
        attempt: &mut Attempt,
        failed: CountFailed,
    ) -> Result<Charge, GateError> {
        let e = failed.error;
        let scope = attempt.identity.scope;
        // An open breaker is one outage, already logged when it opened.
        if matches!(e, SendError::Skipped) {
            tracing::debug!(%scope, "quota store skipped: breaker open");
        } else {
            tracing::warn!(error = %e, %scope, "quota store failed");
        }
        let charge = Charge::after_store_error(e.may_land(), attempt.period_end);
        let mode = self.config.store.fail_mode;
        let failure = Failure::Store { mode };
        // Each level as the store found it, or sharing the subject's fate.
        let shared = || {
            vec![
                Err(NoAnswer {
                    may_land: e.may_land()
                });
                attempt.levels.len()
            ]
        };
        attempt.counted(failed.levels.unwrap_or_else(shared));
        self.apply(attempt, &Scan::fresh(attempt, charge), failure)
            .await;
        // Settled once: no level count is left for a later failure to take back.
        attempt.levels.iter_mut().for_each(|l| l.count = None);
        let mut answer = after_store_failure(&charge, attempt.keyed(), mode);
        if crate::bug!(UnknownCountQueuedUnmetered) && answer == AfterStoreFailure::Unsettled {
            answer = AfterStoreFailure::Unmetered;
        }
        match answer {
            AfterStoreFailure::Refuse => Err(GateError::StoreUnavailable),
            AfterStoreFailure::Unsettled => Err(GateError::StoreUnsettled),
            AfterStoreFailure::Unmetered => Ok(Charge::Unmetered),
        }
    }

    /// Carries out the subject's [`Settlement`], retrying while a failure says it did not happen
    /// (or twice changes nothing) until it lands or [`settle_by`] passes. A retry on a fresh
    /// connection is not ordered behind what the attempt sent before, so only what [`may_repeat`]
    /// allows is resent. Still short, it is logged: a failed refund leaves the subject one scan
    /// short for the day, a failed release makes the retry wait out the lease.
    async fn settle_subject(
        &self,
        attempt: &Attempt,
        scan_id: Uuid,
        settlement: Settlement,
        levels: &[(&QuotaKey, UnixSecs)],
    ) {
        let until = settle_by(attempt, Instant::now());
        let (mut backoff, mut tries) = (RETRY_FIRST, 0u32);
        let error = loop {
            tries += 1;
            // Each try is bounded by the store's timeout; the first is always made, however late
            // (a stalled queue can take the whole deadline, and its count is still refunded).
            let e = match self.settle_once(attempt, scan_id, settlement, levels).await {
                Ok(()) => return,
                Err(e) => e,
            };
            let left = until.saturating_duration_since(Instant::now());
            if !may_repeat(settlement, attempt.keyed(), &e) || left <= backoff {
                break e;
            }
            tracing::debug!(error = %e, ?settlement, tries, "settling a failed scan again");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MOST);
        };
        tracing::warn!(error = %error, ?settlement, tries, "could not settle a failed scan");
    }

    /// One try at `settlement`; `Nothing` and a release unclaimed have nothing to send.
    async fn settle_once(
        &self,
        attempt: &Attempt,
        scan_id: Uuid,
        settlement: Settlement,
        levels: &[(&QuotaKey, UnixSecs)],
    ) -> Result<(), SendError> {
        match (settlement, &attempt.claim) {
            (Settlement::Nothing, _) | (Settlement::Release, None) => Ok(()),
            (Settlement::Refund { period_end }, claim) => {
                let refund = Refund {
                    key: &attempt.key,
                    period_end,
                    levels,
                    record: claim.as_ref().map(|c| (c.record.as_str(), scan_id)),
                    now: attempt.now(),
                };
                self.store.refund(refund).await
            }
            (Settlement::Release, Some(claim)) => {
                self.store
                    .release(&claim.record, scan_id, attempt.now())
                    .await
            }
        }
    }

    /// Saves a keyed scan's answer for its repeats. If this fails, a repeat finds the record
    /// pending and queues the same job again after its lease (which the stream deduplicates).
    pub(super) async fn save(
        &self,
        claim: &Claim,
        scan_id: Uuid,
        response: &Response<Bytes>,
        now: UnixSecs,
    ) {
        let fields = [
            (RecordField::State, RecordState::Done.as_str().to_owned()),
            (RecordField::ScanId, scan_id.to_string()),
            (RecordField::Fingerprint, claim.fingerprint.clone()),
            (RecordField::Response, crate::gate::respond::save(response)),
        ];
        let update = RecordUpdate {
            record: &claim.record,
            fields: &fields,
            now,
        };
        if let Err(e) = self.store.update_record(update).await {
            tracing::warn!(error = %e, "could not save an idempotent answer");
        }
    }
}

/// Retries stop by the answer's deadline: a lease ends there and the client no longer waits.
fn settle_by(attempt: &Attempt, now: Instant) -> Instant {
    attempt.deadline().min(now + SETTLE_WITHIN)
}

/// Whether a settlement that failed with `error` may be sent again: if never sent, always; if
/// unanswered, only what is safe twice; if refused, never. A release and a keyed refund act only
/// while the record names the scan (a keyed refund deletes it), so twice is once; an unkeyed
/// refund is a bare `DECR`, so a repeat could take a second count.
fn may_repeat(settlement: Settlement, keyed: bool, error: &SendError) -> bool {
    if error.never_sent() {
        return true;
    }
    match error {
        SendError::Unanswered => match settlement {
            Settlement::Release => true,
            Settlement::Refund { .. } => keyed,
            Settlement::Nothing => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is sent again after each failure: anything never sent; after
    /// no answer, a release and a keyed refund (safe twice), never an
    /// unkeyed refund; nothing the store refused.
    #[test]
    fn what_may_be_sent_again() {
        let refund = Settlement::Refund {
            period_end: UnixSecs(0),
        };
        let not_sent = SendError::NotSent("down".into());
        let refused = SendError::Refused("ERR".into());
        let unanswered = SendError::Unanswered;
        let open = SendError::Skipped;
        let table = [
            (Settlement::Release, true, &not_sent, true),
            (Settlement::Release, true, &open, true),
            (Settlement::Release, true, &unanswered, true),
            (Settlement::Release, true, &refused, false),
            (refund, true, &not_sent, true),
            (refund, true, &unanswered, true),
            (refund, true, &refused, false),
            (refund, false, &not_sent, true),
            (refund, false, &open, true),
            (refund, false, &unanswered, false),
            (refund, false, &refused, false),
            (Settlement::Nothing, false, &unanswered, false),
        ];
        for (settlement, keyed, error, again) in table {
            assert_eq!(
                may_repeat(settlement, keyed, error),
                again,
                "{settlement:?}, keyed {keyed}, {error:?}"
            );
        }
    }
}
