//! The rules of recovery, as pure functions, resting on one fact: a command never sent did not
//! happen, and one sent and not answered may still run, after everything sent before it on its
//! connection. So a count that may still land is put right by a command sent behind it (a refund,
//! or a keyed scan's lease released for its retry to settle), never by pretending otherwise.

use std::time::Duration;

use uuid::Uuid;

use crate::rules::count::{Count, LevelCount, NoAnswer};
use crate::rules::decide::{Decision, Limits, decide};
use crate::rules::delay::DelayPlan;
use crate::rules::level::LevelName;
use crate::rules::modes::{FailMode, Pacing};
use crate::rules::outcome::Metered;
use crate::rules::pace::Paced;
use crate::rules::record::{Claim, Record, RecordState};
use crate::rules::unix::{UnixMillis, UnixSecs};

/// Added to an attempt's expected end in a 409's `Retry-After`: its enqueue and saved answer.
pub const ATTEMPT_GRACE: Duration = Duration::from_secs(1);

/// What the count charged a scan; failures are settled on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    /// `decision`: the most severe of the subject's and its levels', set by `level`.
    Counted {
        count: Count,
        decision: Decision,
        level: LevelName,
    },
    /// Accepted uncounted: the count was never sent (fail open).
    Unmetered,
    /// Sent and not answered: it may still land, in the period ending at `period_end`.
    Unknown { period_end: UnixSecs },
}

impl Charge {
    /// A count sent (`may_land`) may still land; one never sent did not happen.
    pub fn after_store_error(may_land: bool, period_end: UnixSecs) -> Self {
        if may_land {
            Self::Unknown { period_end }
        } else {
            Self::Unmetered
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

/// What a repeat of a key gets: the saved answer, a mismatch (another body), come back in
/// `retry_after` s (still running), or a take-over of the abandoned lease to finish its scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repeat {
    Replay(String),
    Mismatch,
    InProgress { retry_after: u64 },
    TakeOver,
}

/// The rule for a key seen before; a 409 waits for the first attempt's end, not its lease's.
pub fn on_repeat(
    record: &Record,
    claim: &Claim,
    now_ms: UnixMillis,
    sleep_cap: Duration,
) -> Repeat {
    if record.fingerprint != claim.fingerprint {
        return Repeat::Mismatch;
    }
    if record.state == RecordState::Done
        && let Some(saved) = &record.response
    {
        return Repeat::Replay(saved.clone());
    }
    if now_ms < record.lease_until_ms {
        let slept = Duration::from_millis(record.delay_ms.unwrap_or(0)).min(sleep_cap);
        let end = record.received_ms.saturating_add(slept + ATTEMPT_GRACE);
        let end = end.min(record.lease_until_ms);
        let wait_ms = u64::try_from(end.get() - now_ms.get()).unwrap_or(0);
        return Repeat::InProgress {
            retry_after: wait_ms.div_ceil(1000).max(1),
        };
    }
    Repeat::TakeOver
}

/// A take-over's result (`taken`: the store's answer): `None` when won; else come back in a second.
pub fn on_take_over(taken: Option<bool>) -> Option<u64> {
    (taken != Some(true)).then_some(1)
}

/// The scan that goes ahead: a fresh one, or one a retry took over from an abandoned attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Every job of a keyed scan carries its record's scanId.
    pub scan_id: Uuid,
    pub charge: Charge,
    /// When the scan arrived (the first attempt's, when resumed).
    pub received_ms: UnixMillis,
    /// Taken over, with its plan: not slept or paced again; what is left of the delay holds the
    /// job back.
    pub resumed: Option<DelayPlan>,
}

impl Scan {
    /// What the meter is told: a fresh uncounted scan is one whose count failed; a resumed one was
    /// counted, if at all, by its first attempt.
    pub fn metered(&self, delay: Duration, shadow: bool) -> Metered {
        match self.charge {
            Charge::Counted {
                decision, level, ..
            } => Metered::Counted {
                tier: decision.tier,
                reminder: decision.reminder,
                delay,
                shadow,
                level,
            },
            Charge::Unmetered | Charge::Unknown { .. } if self.resumed.is_none() => {
                Metered::StoreFailed
            }
            Charge::Unmetered | Charge::Unknown { .. } => Metered::Uncounted,
        }
    }
}

/// How a taken-over scan goes on; never paced again, as its job may already be queued and run.
pub fn resume(
    record: &Record,
    limits: Limits,
    grant: u64,
    now_ms: UnixMillis,
    shadow: bool,
) -> Scan {
    let charge = if record.count == 0 {
        Charge::Unmetered
    } else {
        Charge::Counted {
            count: Count {
                used: record.count,
                reset_at: record.reset_at,
                now: now_ms.secs(),
                grant,
            },
            decision: decide(record.count, &limits.with_grant(grant)),
            level: LevelName::Subject,
        }
    };
    let total = match &charge {
        Charge::Counted { .. } if shadow => Duration::ZERO,
        Charge::Counted { decision, .. } => record
            .delay_ms
            .map_or(decision.delay, Duration::from_millis),
        Charge::Unmetered | Charge::Unknown { .. } => Duration::ZERO,
    };
    let owed = record
        .received_ms
        .saturating_add(total)
        .get()
        .saturating_sub(now_ms.get());
    Scan {
        scan_id: record.scan_id,
        charge,
        received_ms: record.received_ms,
        resumed: Some(DelayPlan {
            total,
            sleep: Duration::ZERO,
            deferred: Duration::from_millis(u64::try_from(owed).unwrap_or(0)).min(total),
        }),
    }
}

/// Where a fresh scan's delay comes from: exactly this (none within quota, unmetered or in shadow
/// mode, so enforce inherits no backlog), or a pacing slot at least this tier delay after the
/// subject's last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayRule {
    Fixed(Duration),
    Pace(Duration),
}

/// The rule for a fresh scan's delay: an uncounted scan waits for nothing.
pub fn delay_rule(charge: &Charge, shadow: bool, pacing: Pacing) -> DelayRule {
    match charge {
        Charge::Counted { decision, .. } => decided_delay_rule(decision, shadow, pacing),
        Charge::Unmetered | Charge::Unknown { .. } => DelayRule::Fixed(Duration::ZERO),
    }
}

/// The delay rule of a scan counted as `decision` decided (and of `GET /quota`'s prediction).
pub fn decided_delay_rule(decision: &Decision, shadow: bool, pacing: Pacing) -> DelayRule {
    if shadow || decision.delay.is_zero() {
        return DelayRule::Fixed(Duration::ZERO);
    }
    match pacing {
        Pacing::On => DelayRule::Pace(decision.delay),
        Pacing::Off => DelayRule::Fixed(decision.delay),
    }
}

/// A pacing step's result; without an answer, the counted scan gets its tier's delay, no sleep
/// lease.
pub fn paced_delay(answer: Option<Paced>, tier_delay: Duration) -> Paced {
    answer.unwrap_or(Paced::Slot {
        delay_ms: crate::rules::unix::duration_ms(tier_delay),
        sleep_lease: None,
    })
}

/// A failed enqueue: refused or unanswered. A `resumed` scan's first attempt may have queued the
/// job, so even a refusal leaves it unknown.
pub fn queue_failure(timed_out: bool, resumed: bool) -> Failure {
    if timed_out || resumed {
        Failure::QueueUnknown
    } else {
        Failure::NotQueued
    }
}

/// What went wrong: the count (`mode` decides between unmetered and refused), a full backlog
/// (refused, not counted), or a queue that refused the job or did not answer (it may still land).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Store { mode: FailMode },
    BacklogFull,
    NotQueued,
    QueueUnknown,
}

/// What a failure leaves to put right, sent behind everything the attempt sent before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Refund one count of the period ending at `period_end` (and the record, if still ours).
    Refund { period_end: UnixSecs },
    /// Keep the count and record, free the lease: the keyed retry settles the unknown outcome.
    Release,
    /// Nothing was counted, or what was counted stands.
    Nothing,
}

/// The one rule for every failure path.
pub fn settle(charge: &Charge, keyed: bool, failure: Failure) -> Settlement {
    use Charge::{Counted, Unknown, Unmetered};
    use Failure::{BacklogFull, NotQueued, QueueUnknown, Store};
    match (charge, keyed, failure) {
        // A refused scan is not counted.
        (Counted { count, .. }, _, BacklogFull | NotQueued) => Settlement::Refund {
            period_end: count.reset_at,
        },
        // May land: the keyed retry settles it; unkeyed, refund rather than charge for a lost job.
        (Counted { .. }, true, QueueUnknown) => Settlement::Release,
        (Counted { count, .. }, false, QueueUnknown) => Settlement::Refund {
            period_end: count.reset_at,
        },
        // May land: closed mode promised "not counted"; an unkeyed unmetered scan is not charged.
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
        // Keyed, not queued: its retry finds the landed claim and queues it with its true count.
        (Unknown { .. }, true, _) => Settlement::Release,
        // A taken-over uncounted scan's record names its scanId: freed, a retry re-queues that job.
        (Unmetered, true, QueueUnknown) => Settlement::Release,
        (Unmetered, _, _) | (Counted { .. }, _, Store { .. }) => Settlement::Nothing,
    }
}

/// Whether a failure refunds the scan's levels too: yes with the subject's refund or an outright
/// refusal, no when its keyed retry settles it. Which counts to take back is [`level_refund`]'s.
pub fn levels_refunded(charge: &Charge, keyed: bool, failure: Failure) -> bool {
    match settle(charge, keyed, failure) {
        Settlement::Refund { .. } => true,
        Settlement::Release => false,
        Settlement::Nothing => match failure {
            Failure::BacklogFull | Failure::NotQueued => true,
            Failure::QueueUnknown => false,
            Failure::Store { mode } => {
                after_store_failure(charge, keyed, mode) == AfterStoreFailure::Refuse
            }
        },
    }
}

/// The period a level's refund takes from: the count's own, or `period_end` if it may still land.
pub fn level_refund(count: &LevelCount, period_end: UnixSecs) -> Option<UnixSecs> {
    match count {
        Ok(count) => Some(count.reset_at),
        Err(NoAnswer { may_land: true }) => Some(period_end),
        Err(NoAnswer { may_land: false }) => None,
    }
}

/// What the client is told after a store failure, per [`settle`]'s rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterStoreFailure {
    /// 503, not counted: closed mode, or a keyed scan whose count was not sent (lest it queue
    /// twice).
    Refuse,
    /// 503: the count may land, nothing queued; the keyed retry settles it.
    Unsettled,
    Unmetered,
}

/// The answer to a request whose count failed.
pub fn after_store_failure(charge: &Charge, keyed: bool, mode: FailMode) -> AfterStoreFailure {
    match (mode, charge, keyed) {
        (FailMode::Closed, _, _) => AfterStoreFailure::Refuse,
        (FailMode::Open, Charge::Unknown { .. }, true) => AfterStoreFailure::Unsettled,
        (FailMode::Open, Charge::Unmetered, true) => AfterStoreFailure::Refuse,
        (FailMode::Open, _, _) => AfterStoreFailure::Unmetered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    const RESET: UnixSecs = UnixSecs(1_796_083_200);
    /// The end of the period an unanswered count may land in.
    const END: UnixSecs = UnixSecs(7);

    /// The `used`th scan of a period that ends at `RESET`, 100 s before it.
    fn count(used: u64) -> Count {
        Count {
            used,
            reset_at: RESET,
            now: UnixSecs(RESET.get() - 100),
            grant: 0,
        }
    }

    /// Checks each row `(charge, flag, input, expected)` of a rule that
    /// reads a charge, a flag named `flag_name`, and one more input.
    fn check_rows<I: Copy + std::fmt::Debug, E: PartialEq + std::fmt::Debug>(
        flag_name: &str,
        rows: &[(Charge, bool, I, E)],
        rule: impl Fn(&Charge, bool, I) -> E,
    ) {
        for (charge, flag, input, expected) in rows {
            assert_eq!(
                &rule(charge, *flag, *input),
                expected,
                "{charge:?} {flag_name}={flag} {input:?}"
            );
        }
    }

    fn counted() -> Charge {
        let limits = Limits {
            limit: NonZeroU32::new(1).unwrap(),
            soft_window: 0,
            warn_at: NonZeroU32::new(100).unwrap(),
            soft_delay: Duration::from_secs(5),
            hard_delay: Duration::from_secs(60),
        };
        Charge::Counted {
            count: count(2),
            decision: decide(2, &limits),
            level: LevelName::Subject,
        }
    }

    /// A scan's count as its job carries it: never passed off as counted
    /// when it was not.
    #[test]
    fn count_of_a_metering() {
        assert_eq!(counted().used(), 2);
        for uncounted in [Charge::Unmetered, Charge::Unknown { period_end: END }] {
            assert_eq!(uncounted.used(), 0);
        }
    }

    /// The decided tier of a charge, `unmetered` when not counted.
    fn tier_of(charge: &Charge) -> &'static str {
        match charge {
            Charge::Counted { decision, .. } => decision.tier.as_str(),
            Charge::Unmetered | Charge::Unknown { .. } => "unmetered",
        }
    }

    /// The first scan of a period ending at `RESET`: within quota.
    fn within() -> Charge {
        Charge::Counted {
            count: count(1),
            decision: Decision {
                tier: crate::rules::decide::Tier::Within,
                delay: Duration::ZERO,
                remaining: 0,
                reminder: false,
            },
            level: LevelName::Subject,
        }
    }

    /// Every (charge × keyed × failure) triple and its settlement.
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
        let unknown = Charge::Unknown { period_end: END };
        let within = within();
        let refund_count = Refund { period_end: RESET };
        let table: [(Charge, bool, Failure, Settlement); 32] = [
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
            (Charge::Unmetered, false, open, Nothing),
            (Charge::Unmetered, false, closed, Nothing),
            (Charge::Unmetered, false, BacklogFull, Nothing),
            (Charge::Unmetered, false, NotQueued, Nothing),
            (Charge::Unmetered, false, QueueUnknown, Nothing),
            (Charge::Unmetered, true, open, Nothing),
            (Charge::Unmetered, true, closed, Nothing),
            (Charge::Unmetered, true, BacklogFull, Nothing),
            (Charge::Unmetered, true, NotQueued, Nothing),
            (Charge::Unmetered, true, QueueUnknown, Release),
            (unknown, false, open, Refund { period_end: END }),
            (unknown, false, closed, Refund { period_end: END }),
            (unknown, false, BacklogFull, Refund { period_end: END }),
            (unknown, false, NotQueued, Refund { period_end: END }),
            (unknown, false, QueueUnknown, Refund { period_end: END }),
            (unknown, true, open, Release),
            (unknown, true, closed, Refund { period_end: END }),
            (unknown, true, BacklogFull, Release),
            (unknown, true, NotQueued, Release),
            (unknown, true, QueueUnknown, Release),
            // A refund takes back the count's own period, whatever the
            // count and its tier were (these two are within quota).
            (within, true, BacklogFull, refund_count),
            (within, false, QueueUnknown, refund_count),
        ];
        check_rows("keyed", &table, settle);
    }

    /// Every (charge × keyed × failure) and whether the levels above the
    /// subject are refunded: with the subject's refund, never where its
    /// retry settles it, and always where the scan is refused outright.
    #[test]
    fn level_settlement_table() {
        use Failure::*;
        let open = Store {
            mode: FailMode::Open,
        };
        let closed = Store {
            mode: FailMode::Closed,
        };
        let unknown = Charge::Unknown { period_end: END };
        let unmetered = Charge::Unmetered;
        let table: [(Charge, bool, Failure, bool); 30] = [
            (counted(), false, BacklogFull, true),
            (counted(), false, NotQueued, true),
            (counted(), false, QueueUnknown, true),
            (counted(), true, BacklogFull, true),
            (counted(), true, NotQueued, true),
            // The keyed retry settles it: one count at every level.
            (counted(), true, QueueUnknown, false),
            (counted(), false, open, false),
            (counted(), true, open, false),
            (counted(), false, closed, true),
            (counted(), true, closed, true),
            (unknown, false, open, true),
            (unknown, false, closed, true),
            (unknown, false, BacklogFull, true),
            (unknown, false, NotQueued, true),
            (unknown, false, QueueUnknown, true),
            (unknown, true, open, false),
            (unknown, true, closed, true),
            (unknown, true, BacklogFull, false),
            (unknown, true, NotQueued, false),
            (unknown, true, QueueUnknown, false),
            // Never sent: what a level counted alone goes with a refusal,
            // and stays with a scan that runs.
            (unmetered, false, open, false),
            (unmetered, false, closed, true),
            (unmetered, true, open, true),
            (unmetered, true, closed, true),
            (unmetered, false, BacklogFull, true),
            (unmetered, false, NotQueued, true),
            (unmetered, false, QueueUnknown, false),
            (unmetered, true, BacklogFull, true),
            (unmetered, true, NotQueued, true),
            (unmetered, true, QueueUnknown, false),
        ];
        check_rows("keyed", &table, levels_refunded);
        // Wherever the subject is refunded, so is every level.
        for (charge, keyed, failure, _) in table {
            if matches!(settle(&charge, keyed, failure), Settlement::Refund { .. }) {
                assert!(levels_refunded(&charge, keyed, failure));
            }
        }
    }

    /// A level's refund: its own period, the period it may land in, or nothing.
    #[test]
    fn level_refund_periods() {
        let c = count(3);
        assert_eq!(level_refund(&Ok(c), END), Some(RESET));
        assert_eq!(
            level_refund(&Err(NoAnswer { may_land: true }), END),
            Some(END)
        );
        assert_eq!(level_refund(&Err(NoAnswer { may_land: false }), END), None);
    }

    /// A count that may land is never answered as "not counted" without a refund behind it.
    #[test]
    fn store_failure_answers() {
        use AfterStoreFailure::*;
        let unknown = Charge::Unknown { period_end: END };
        let table = [
            (unknown, false, FailMode::Open, Unmetered),
            (unknown, true, FailMode::Open, Unsettled),
            (unknown, false, FailMode::Closed, Refuse),
            (unknown, true, FailMode::Closed, Refuse),
            (Charge::Unmetered, false, FailMode::Open, Unmetered),
            (Charge::Unmetered, true, FailMode::Open, Refuse),
            (Charge::Unmetered, false, FailMode::Closed, Refuse),
            (Charge::Unmetered, true, FailMode::Closed, Refuse),
        ];
        for (charge, keyed, mode, expected) in table {
            assert_eq!(after_store_failure(&charge, keyed, mode), expected);
            // Refusing an unknown count always refunds it; accepting one
            // unmetered without a key refunds it too.
            if let Charge::Unknown { .. } = charge {
                let s = settle(&charge, keyed, Failure::Store { mode });
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
            received_ms: UnixMillis(10_000),
            lease_until_ms: UnixMillis(lease_until_ms),
        };
        let mut r = Record::claimed(&claim, 3, RESET);
        r.delay_ms = delay_ms;
        if state_done {
            r.state = crate::rules::record::RecordState::Done;
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
            let at = UnixMillis(now);
            assert_eq!(on_repeat(&r, &claim, at, cap), expected, "{r:?} at {now}");
        }
    }

    /// A failed count is unknown when it may land, unmetered when it was never sent.
    #[test]
    fn metering_after_store_error() {
        assert_eq!(
            Charge::after_store_error(true, END),
            Charge::Unknown { period_end: END }
        );
        assert_eq!(Charge::after_store_error(false, END), Charge::Unmetered);
    }

    /// Only a take-over the store confirmed goes on; lost or unanswered, 409 in a second.
    #[test]
    fn take_over_table() {
        for (taken, expected) in [(Some(true), None), (Some(false), Some(1)), (None, Some(1))] {
            assert_eq!(on_take_over(taken), expected, "{taken:?}");
        }
    }

    /// A resumed scan keeps its record's scanId, count and paced delay;
    /// without a paced delay it takes its tier's; what is left of the delay
    /// after now holds the job back; shadow and uncounted scans owe nothing.
    #[test]
    fn resume_table() {
        let limits = Limits {
            limit: std::num::NonZeroU32::new(1).unwrap(),
            soft_window: 1,
            warn_at: std::num::NonZeroU32::new(100).unwrap(),
            soft_delay: Duration::from_secs(5),
            hard_delay: Duration::from_secs(60),
        };
        let ms = Duration::from_millis;
        // (count, paced delay, grant, now, shadow) → (total, deferred, tier)
        let table = [
            (
                2,
                Some(7_000),
                0,
                12_000,
                false,
                ms(7_000),
                ms(5_000),
                "soft",
            ),
            (2, None, 0, 12_000, false, ms(5_000), ms(3_000), "soft"),
            (3, None, 0, 12_000, false, ms(60_000), ms(58_000), "hard"),
            // The grant raises the limit the tier is decided on.
            (2, None, 1, 12_000, false, ms(0), ms(0), "within"),
            // Past its start: nothing left to hold back.
            (2, Some(1_000), 0, 12_000, false, ms(1_000), ms(0), "soft"),
            (3, Some(9_000), 0, 12_000, true, ms(0), ms(0), "hard"),
            (0, Some(9_000), 0, 12_000, false, ms(0), ms(0), "unmetered"),
        ];
        for (count, delay_ms, grant, now, shadow, total, deferred, tier) in table {
            let (mut r, _) = record(false, 0, delay_ms);
            r.count = count;
            let resumed = resume(&r, limits, grant, UnixMillis(now), shadow);
            let row = format!("count={count} delay={delay_ms:?} grant={grant} shadow={shadow}");
            assert_eq!(resumed.scan_id, r.scan_id, "{row}");
            assert_eq!(resumed.received_ms, UnixMillis(10_000), "{row}");
            assert_eq!(resumed.charge.used(), count, "{row}");
            assert_eq!(tier_of(&resumed.charge), tier, "{row}");
            assert_eq!(
                resumed.resumed,
                Some(DelayPlan {
                    total,
                    sleep: Duration::ZERO,
                    deferred
                }),
                "{row}"
            );
        }
    }

    /// Where a fresh scan's delay comes from.
    #[test]
    fn delay_rule_table() {
        let hard = counted();
        let within = within();
        let minute = Duration::from_secs(60);
        let table = [
            (hard, false, Pacing::On, DelayRule::Pace(minute)),
            (hard, false, Pacing::Off, DelayRule::Fixed(minute)),
            (hard, true, Pacing::On, DelayRule::Fixed(Duration::ZERO)),
            (hard, true, Pacing::Off, DelayRule::Fixed(Duration::ZERO)),
            (within, false, Pacing::On, DelayRule::Fixed(Duration::ZERO)),
            (
                Charge::Unmetered,
                false,
                Pacing::On,
                DelayRule::Fixed(Duration::ZERO),
            ),
            (
                Charge::Unknown { period_end: END },
                false,
                Pacing::On,
                DelayRule::Fixed(Duration::ZERO),
            ),
        ];
        check_rows("shadow", &table, delay_rule);
    }

    /// A pacing answer, or none: the slot, a refusal, or the tier's delay.
    #[test]
    fn paced_delay_table() {
        let tier = Duration::from_secs(5);
        let sleep_lease = Some(crate::rules::delay::SleepLease {
            taken: true,
            asleep: 3,
        });
        let slot = Paced::Slot {
            delay_ms: 12_000,
            sleep_lease,
        };
        let full = Paced::Full {
            retry_after_ms: 900,
            levels_ms: vec![0, 900],
        };
        let tier_slot = Paced::Slot {
            delay_ms: 5_000,
            sleep_lease: None,
        };
        let table = [
            (Some(slot.clone()), slot),
            (Some(full.clone()), full),
            (None, tier_slot),
        ];
        for (answer, expected) in table {
            assert_eq!(paced_delay(answer.clone(), tier), expected, "{answer:?}");
        }
    }

    /// A refusal is "not queued" only for a fresh scan.
    #[test]
    fn queue_failure_table() {
        let table = [
            (false, false, Failure::NotQueued),
            (true, false, Failure::QueueUnknown),
            (false, true, Failure::QueueUnknown),
            (true, true, Failure::QueueUnknown),
        ];
        for (timed_out, resumed, expected) in table {
            assert_eq!(queue_failure(timed_out, resumed), expected);
        }
    }
}
