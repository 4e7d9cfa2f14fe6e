//! The writes that follow a scan's end: a failure's [`Settlement`] carried
//! out, and a keyed scan's answer saved for its repeats. Both are sent
//! behind everything the attempt sent before, on the same connection.
//! Here too the one answer to a failed enqueue ([`queue_failed`]), for
//! counted and exempt scans alike.

use bytes::Bytes;
use http::Response;
use uuid::Uuid;

use super::attempt::Attempt;
use super::wiring::Gate;
use crate::bugs::{self, Bug};
use crate::error::{GateError, Queued};
use crate::queue::ScanQueue;
use crate::settle::{Failure, Metering, Settlement, level_refund, levels_refunded, settle};
use crate::store::{Claim, Lane, QuotaStore, RecordField, RecordState, RecordUpdate, Refund};
use crate::unix::UnixSecs;

impl<S: QuotaStore, Q: ScanQueue> Gate<S, Q> {
    /// Carries out a [`Settlement`]. A refund that fails leaves the subject
    /// one scan short for the day (logged, not retried: the client got a
    /// 503 either way); a release that fails makes the retry wait out the
    /// lease.
    ///
    /// The rule is [`settle`]'s for the subject and [`levels_refunded`]'s
    /// for the levels above it: each level's count (`lanes`, in the
    /// attempt's order) is taken back from its own period
    /// ([`level_refund`]), behind the subject's.
    pub(super) async fn apply(
        &self,
        attempt: &Attempt,
        scan_id: Uuid,
        metering: &Metering,
        failure: Failure,
        lanes: &[Lane],
    ) {
        let keyed = attempt.keyed();
        let mut settlement = settle(metering, keyed, failure);
        if bugs::on(Bug::RefundOfUnsentCount) && *metering == Metering::Unmetered {
            settlement = Settlement::Refund {
                period_end: UnixSecs(i64::MAX),
            };
        }
        self.settle_subject(attempt, scan_id, settlement).await;
        if !levels_refunded(metering, keyed, failure) || bugs::on(Bug::LevelNotRefunded) {
            return;
        }
        for (key, lane) in attempt.level_keys.iter().zip(lanes) {
            let Some(period_end) = level_refund(lane, attempt.period_end) else {
                continue;
            };
            let refund = Refund {
                key,
                period_end,
                record: None,
                now: attempt.now(),
            };
            if let Err(e) = self.store.refund(refund).await {
                tracing::warn!(error = %e, "could not take a level's count back");
            }
        }
    }

    /// Carries out the subject's [`Settlement`].
    async fn settle_subject(&self, attempt: &Attempt, scan_id: Uuid, settlement: Settlement) {
        let done = match (settlement, &attempt.claim) {
            (Settlement::Nothing, _) | (Settlement::Release, None) => return,
            (Settlement::Refund { period_end }, claim) => {
                let refund = Refund {
                    key: &attempt.key,
                    period_end,
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
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, ?settlement, "could not settle a failed scan");
        }
    }

    /// Saves a keyed scan's answer, for its repeats: the state, the scanId,
    /// the fingerprint and the answer. If this fails, a repeat finds the
    /// record pending and queues the same job again once its lease is over
    /// (which the stream deduplicates).
    pub(super) async fn save(
        &self,
        claim: &Claim,
        scan_id: Uuid,
        response: &Response<Bytes>,
        now: UnixSecs,
    ) {
        let fields = [
            (RecordField::State, RecordState::Done.name().to_owned()),
            (RecordField::ScanId, scan_id.to_string()),
            (RecordField::Fingerprint, claim.fingerprint.clone()),
            (RecordField::Response, crate::respond::save(response)),
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

/// What the client is told of a failed enqueue: a refused job was not
/// queued; one whose fate is unknown may still be.
pub(super) fn queue_failed(failure: Failure) -> GateError {
    let queued = match failure {
        Failure::NotQueued => Queued::No,
        Failure::QueueUnknown | Failure::Store { .. } | Failure::BacklogFull => Queued::Unknown,
    };
    GateError::QueueFailed { queued }
}
