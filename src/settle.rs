//! The rules of recovery, as pure functions: what a repeat of an
//! `Idempotency-Key` gets ([`on_repeat`]), and what every failure leaves to
//! put right ([`settle`]). Like [`crate::decide`], they take no client and
//! no clock; [`crate::gate`] only carries their answers out.
//!
//! The one fact they rest on: a command that was never sent did not happen,
//! and one that was sent and not answered may still run, in order, after
//! everything sent before it on the same connection. So a count that may
//! still land is put right by a command sent *behind* it (a refund, or the
//! release of a keyed scan's lease, which lets its retry settle it with the
//! true count), never by pretending it did not happen.

use std::time::Duration;

use crate::config::words::FailMode;
use crate::decide::Decision;
use crate::record::{Claim, Count, Record};

/// How long after its expected end an attempt is still given, in the
/// `Retry-After` of a 409: the enqueue and the saving of its answer.
pub const ATTEMPT_GRACE_MS: i64 = 1_000;

/// How a scan was metered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metering {
    /// Counted, with the decision on its count.
    Counted { count: Count, decision: Decision },
    /// Accepted uncounted: the count was never sent (fail open).
    Unmetered,
    /// The count was sent and not answered: it may still land, in the
    /// period that ends at `period_end` (unix s).
    Unknown { period_end: i64 },
}

impl Metering {
    /// The job's and the logs' tier: `within`, `soft`, `hard` or `unmetered`.
    pub fn tier(&self) -> &'static str {
        match self {
            Self::Counted { decision, .. } => decision.tier.as_str(),
            Self::Unmetered | Self::Unknown { .. } => "unmetered",
        }
    }

    /// The count, 0 when not counted.
    pub fn used(&self) -> u64 {
        match self {
            Self::Counted { count, .. } => count.used,
            Self::Unmetered | Self::Unknown { .. } => 0,
        }
    }
}

/// What a repeat of a key gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repeat {
    /// The first attempt answered: replay its answer (saved JSON).
    Replay(String),
    /// The key was used with another body.
    Mismatch,
    /// The first attempt is still running: come back in `retry_after` s.
    InProgress { retry_after: u64 },
    /// The first attempt gave up without settling (or died): take over its
    /// lease and finish its scan, under its `scanId`.
    TakeOver,
}

/// The rule for a key seen before. `sleep_cap` is the longest the first
/// attempt may have slept (nothing in `defer` mode), so a 409's
/// `Retry-After` says when that attempt will have ended, not when its lease
/// (the longest it could take) runs out.
pub fn on_repeat(record: &Record, claim: &Claim, now_ms: i64, sleep_cap: Duration) -> Repeat {
    if record.fingerprint != claim.fingerprint {
        return Repeat::Mismatch;
    }
    if record.is_done()
        && let Some(saved) = &record.response
    {
        return Repeat::Replay(saved.clone());
    }
    if now_ms < record.lease_until_ms {
        let slept = record.delay_ms.map_or(0, |d| {
            d.min(u64::try_from(sleep_cap.as_millis()).unwrap_or(u64::MAX))
        });
        let expected_end = record
            .received_ms
            .saturating_add(i64::try_from(slept).unwrap_or(i64::MAX))
            .saturating_add(ATTEMPT_GRACE_MS)
            .min(record.lease_until_ms);
        let wait_ms = u64::try_from(expected_end - now_ms).unwrap_or(0);
        return Repeat::InProgress {
            retry_after: wait_ms.div_ceil(1000).max(1),
        };
    }
    Repeat::TakeOver
}

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The count got no answer, or was never sent; `mode` decides whether
    /// the scan goes on unmetered (open) or is refused (closed).
    Store { mode: FailMode },
    /// The subject's paced backlog is full: refused, not counted.
    BacklogFull,
    /// The queue refused the job: nothing was queued.
    NotQueued,
    /// The queue did not answer: the job may still land.
    QueueUnknown,
}

/// What a failure leaves to put right, sent behind everything the attempt
/// sent before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Take one count of the period ending at `period_end` back (and a
    /// keyed scan's record, if it is still this attempt's).
    Refund { period_end: i64 },
    /// Keep the count and the record, and free the record's lease: the
    /// outcome is unknown, and the keyed retry settles it (one job, one
    /// count).
    Release,
    /// Nothing was counted, or what was counted stands.
    Nothing,
}

/// The one rule for every failure path.
pub fn settle(metering: &Metering, keyed: bool, failure: Failure) -> Settlement {
    use Failure::{BacklogFull, NotQueued, QueueUnknown, Store};
    use Metering::{Counted, Unknown, Unmetered};
    match (metering, keyed, failure) {
        // A refused scan is not counted.
        (Counted { count, .. }, _, BacklogFull | NotQueued) => Settlement::Refund {
            period_end: count.reset_at,
        },
        // The job may land: a keyed scan keeps its count for its retry to
        // settle; an unkeyed one has no retry to settle it, so a late job
        // runs uncounted rather than a missing one being charged.
        (Counted { .. }, true, QueueUnknown) => Settlement::Release,
        (Counted { count, .. }, false, QueueUnknown) => Settlement::Refund {
            period_end: count.reset_at,
        },
        // A count that may land: closed mode promises "not counted"; an
        // unkeyed scan that goes on unmetered must not be charged either.
        (
            Unknown { period_end },
            _,
            Store {
                mode: FailMode::Closed,
            },
        )
        | (Unknown { period_end }, false, _) => Settlement::Refund {
            period_end: *period_end,
        },
        // A keyed one is not queued: its retry finds the landed claim and
        // queues the scan with its true count and delay.
        (Unknown { .. }, true, _) => Settlement::Release,
        // An unmetered keyed scan's record (written before its job) names
        // its scanId; free it so a retry re-queues that same job.
        (Unmetered, true, QueueUnknown) => Settlement::Release,
        (Unmetered, _, _) | (Counted { .. }, _, Store { .. }) => Settlement::Nothing,
    }
}

/// What the client is told after a store failure, per [`settle`]'s rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterStoreFailure {
    /// Refused with 503: not counted (closed mode; or a keyed scan whose
    /// count was never sent, which cannot see whether an earlier attempt
    /// of its key was counted or is still running: going on unmetered
    /// would queue it a second time, under another `scanId`).
    Refuse,
    /// Refused with 503: the count may land, nothing queued; the keyed
    /// retry settles it.
    Unsettled,
    /// Accepted unmetered (open mode).
    Unmetered,
}

/// The answer to a request whose count failed.
pub fn after_store_failure(metering: &Metering, keyed: bool, mode: FailMode) -> AfterStoreFailure {
    match (mode, metering, keyed) {
        (FailMode::Closed, _, _) => AfterStoreFailure::Refuse,
        (FailMode::Open, Metering::Unknown { .. }, true) => AfterStoreFailure::Unsettled,
        (FailMode::Open, Metering::Unmetered, true) => AfterStoreFailure::Refuse,
        (FailMode::Open, _, _) => AfterStoreFailure::Unmetered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{Limits, decide};
    use std::num::NonZeroU32;
    use uuid::Uuid;

    const RESET: i64 = 1_796_083_200;

    fn counted() -> Metering {
        let limits = Limits {
            limit: NonZeroU32::new(1).unwrap(),
            soft_window: 0,
            warn_at: NonZeroU32::new(100).unwrap(),
            soft_delay: Duration::from_secs(5),
            hard_delay: Duration::from_secs(60),
        };
        Metering::Counted {
            count: Count {
                used: 2,
                reset_at: RESET,
                now: RESET - 100,
                grant: 0,
            },
            decision: decide(2, &limits),
        }
    }

    /// A scan's tier and count as its job and logs carry them: never passed
    /// off as counted when it was not.
    #[test]
    fn tier_and_count() {
        assert_eq!(counted().tier(), "hard");
        assert_eq!(counted().used(), 2);
        for uncounted in [Metering::Unmetered, Metering::Unknown { period_end: 7 }] {
            assert_eq!(uncounted.tier(), "unmetered");
            assert_eq!(uncounted.used(), 0);
        }
    }

    /// Every (metering × keyed × failure) triple and its settlement.
    #[test]
    fn settlement_table() {
        use Failure::*;
        use Settlement::*;
        let open = Store {
            mode: FailMode::Open,
        };
        let closed = Store {
            mode: FailMode::Closed,
        };
        let unknown = Metering::Unknown { period_end: 7 };
        let refund_count = Refund { period_end: RESET };
        let table: [(Metering, bool, Failure, Settlement); 32] = [
            (counted(), false, open, Nothing),
            (counted(), false, closed, Nothing),
            (counted(), false, BacklogFull, refund_count),
            (counted(), false, NotQueued, refund_count),
            (counted(), false, QueueUnknown, refund_count),
            (counted(), true, open, Nothing),
            (counted(), true, closed, Nothing),
            (counted(), true, BacklogFull, refund_count),
            (counted(), true, NotQueued, refund_count),
            (counted(), true, QueueUnknown, Release),
            (Metering::Unmetered, false, open, Nothing),
            (Metering::Unmetered, false, closed, Nothing),
            (Metering::Unmetered, false, BacklogFull, Nothing),
            (Metering::Unmetered, false, NotQueued, Nothing),
            (Metering::Unmetered, false, QueueUnknown, Nothing),
            (Metering::Unmetered, true, open, Nothing),
            (Metering::Unmetered, true, closed, Nothing),
            (Metering::Unmetered, true, BacklogFull, Nothing),
            (Metering::Unmetered, true, NotQueued, Nothing),
            (Metering::Unmetered, true, QueueUnknown, Release),
            (unknown, false, open, Refund { period_end: 7 }),
            (unknown, false, closed, Refund { period_end: 7 }),
            (unknown, false, BacklogFull, Refund { period_end: 7 }),
            (unknown, false, NotQueued, Refund { period_end: 7 }),
            (unknown, false, QueueUnknown, Refund { period_end: 7 }),
            (unknown, true, open, Release),
            (unknown, true, closed, Refund { period_end: 7 }),
            (unknown, true, BacklogFull, Release),
            (unknown, true, NotQueued, Release),
            (unknown, true, QueueUnknown, Release),
            // The same rows hold whatever the count was.
            (counted(), true, BacklogFull, refund_count),
            (counted(), false, QueueUnknown, refund_count),
        ];
        for (metering, keyed, failure, expected) in table {
            assert_eq!(
                settle(&metering, keyed, failure),
                expected,
                "{metering:?} keyed={keyed} {failure:?}"
            );
        }
    }

    /// A count that may land is never answered as "not counted" without a refund behind it.
    #[test]
    fn store_failure_answers() {
        use AfterStoreFailure::*;
        let unknown = Metering::Unknown { period_end: 7 };
        let table = [
            (unknown, false, FailMode::Open, Unmetered),
            (unknown, true, FailMode::Open, Unsettled),
            (unknown, false, FailMode::Closed, Refuse),
            (unknown, true, FailMode::Closed, Refuse),
            (Metering::Unmetered, false, FailMode::Open, Unmetered),
            (Metering::Unmetered, true, FailMode::Open, Refuse),
            (Metering::Unmetered, false, FailMode::Closed, Refuse),
            (Metering::Unmetered, true, FailMode::Closed, Refuse),
        ];
        for (metering, keyed, mode, expected) in table {
            assert_eq!(after_store_failure(&metering, keyed, mode), expected);
            // Refusing an unknown count always refunds it; accepting one
            // unmetered without a key refunds it too.
            if let Metering::Unknown { .. } = metering {
                let s = settle(&metering, keyed, Failure::Store { mode });
                match expected {
                    Refuse | Unmetered => assert!(matches!(s, Settlement::Refund { .. })),
                    Unsettled => assert_eq!(s, Settlement::Release),
                }
            }
        }
    }

    fn record(state_done: bool, lease_until_ms: i64, delay_ms: Option<u64>) -> (Record, Claim) {
        let claim = Claim {
            record: "quota:ip:{d}:idem:k".into(),
            scan_id: Uuid::now_v7(),
            fingerprint: "fp".into(),
            received_ms: 10_000,
            lease_until_ms,
        };
        let mut r = Record::claimed(&claim, 3, RESET);
        r.delay_ms = delay_ms;
        if state_done {
            r.state = crate::record::RecordState::Done;
            r.response = Some("{}".into());
        }
        (r, claim)
    }

    /// Every repeat state and its answer.
    #[test]
    fn repeat_table() {
        let cap = Duration::from_secs(28);
        // (done, lease end, delay, now, fingerprint matches) → answer
        let table = [
            (
                true,
                39_000,
                None,
                12_000,
                true,
                Repeat::Replay("{}".into()),
            ),
            (true, 39_000, None, 12_000, false, Repeat::Mismatch),
            (false, 39_000, None, 12_000, false, Repeat::Mismatch),
            // In flight, within tier: done 1 s after arrival at the latest.
            (
                false,
                39_000,
                None,
                10_500,
                true,
                Repeat::InProgress { retry_after: 1 },
            ),
            // In flight, sleeping 5 s: 4 s after arrival, 2 s left.
            (
                false,
                39_000,
                Some(5_000),
                14_000,
                true,
                Repeat::InProgress { retry_after: 2 },
            ),
            // A 60 s delay sleeps the cap (28 s) at most, never past the lease.
            (
                false,
                39_000,
                Some(60_000),
                20_000,
                true,
                Repeat::InProgress { retry_after: 19 },
            ),
            // Lease over (or released): take over.
            (false, 39_000, Some(5_000), 39_000, true, Repeat::TakeOver),
            (false, 0, None, 10_500, true, Repeat::TakeOver),
            // Done without a saved answer: take over, re-queue under its id.
            (true, 39_000, None, 40_000, true, Repeat::TakeOver),
        ];
        for (done, until, delay, now, same, expected) in table {
            let (mut r, claim) = record(done, until, delay);
            if done && expected == Repeat::TakeOver {
                r.response = None;
            }
            if !same {
                r.fingerprint = "other".into();
            }
            assert_eq!(on_repeat(&r, &claim, now, cap), expected, "{r:?} at {now}");
        }
    }
}
