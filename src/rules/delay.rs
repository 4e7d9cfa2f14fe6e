//! Step 6: spending the delay within the platform's limits.
//!
//! An HTTP API cuts every integration off at 30 s and Lambda bills every
//! millisecond spent asleep, so the handler never sleeps past
//! `min(Lambda remaining time, gateway timeout) − margin`. Whatever does not
//! fit is deferred onto the queued job (SQS `DelaySeconds`, `notBefore`), not
//! dropped: the scan starts no sooner than the full delay after the request.
//!
//! Every request asleep holds one Lambda environment, so the number asleep
//! at once is bounded across every gate process (`QUOTA_MAX_ASLEEP`): a
//! scan sleeps only in a [`Bed`], a lease in the store that ends by itself
//! when its sleep does ([`bed_until`]). A scan that finds every bed taken
//! sleeps nothing and defers its whole delay: its start does not move.

use std::time::Duration;

use uuid::Uuid;

use crate::rules::modes::DelayMode;
use crate::rules::unix::UnixMillis;

/// The most SQS can hold a message back.
pub const MAX_QUEUE_DEFERRAL: Duration = Duration::from_secs(900);

/// How one delay is split between sleeping now and deferring the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayPlan {
    /// The whole delay owed.
    pub total: Duration,
    /// Slept in the handler before answering.
    pub sleep: Duration,
    /// Held back on the queued job.
    pub deferred: Duration,
}

/// The time left to answer at all: the earlier of the Lambda deadline and
/// the gateway timeout.
pub fn ceiling(remaining: Option<Duration>, gateway_timeout: Duration) -> Duration {
    remaining.map_or(gateway_timeout, |r| r.min(gateway_timeout))
}

/// The budget the handler may sleep: the [`ceiling`] less the margin, which
/// is kept for the enqueue and the response.
pub fn budget(
    remaining: Option<Duration>,
    gateway_timeout: Duration,
    margin: Duration,
) -> Duration {
    ceiling(remaining, gateway_timeout).saturating_sub(margin)
}

/// Splits `total` in `mode` given the sleep `budget`.
pub fn plan(total: Duration, mode: DelayMode, budget: Duration) -> DelayPlan {
    let sleep = match mode {
        DelayMode::Sleep => total.min(budget),
        DelayMode::Defer => Duration::ZERO,
    };
    DelayPlan {
        total,
        sleep,
        deferred: total - sleep,
    }
}

impl DelayPlan {
    /// The plan of a sleep woken after `slept` (the process is stopping):
    /// what was slept, in whole milliseconds rounded down, and the rest of
    /// the delay deferred onto the job. The total, and so the job's
    /// `notBefore`, is unchanged: the scan still starts no sooner than its
    /// delay after the request, however early its answer came.
    pub fn cut_short(self, slept: Duration) -> Self {
        let slept = Duration::from_millis(u64::try_from(slept.as_millis()).unwrap_or(u64::MAX));
        let sleep = self.sleep.min(slept);
        Self {
            total: self.total,
            sleep,
            deferred: self.total - sleep,
        }
    }
}

/// How long a bed is held past its sleep: the sleep starts a little after
/// the arrival its lease is counted from (the count and the pacing step
/// come first), so the lease outlasts the sleep.
pub const BED_GRACE: Duration = Duration::from_secs(1);

/// The store key of the beds every gate process shares: a sorted set of
/// leases, each scored by the instant it ends ([`bed_until`]).
pub const BEDS_KEY: &str = "quota:asleep";

/// A scan's ask for a bed: one of `max_asleep`, to sleep at most
/// `budget_ms` of the delay it owes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BedAsk {
    /// The lease's name (the scan's id): one lease per scan.
    pub id: Uuid,
    pub budget_ms: u64,
    /// `QUOTA_MAX_ASLEEP`.
    pub max_asleep: u32,
}

/// A bed asked alone, outside a pacing step: for a scan that arrived at
/// `arrival` and owes `wait_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoneBed {
    pub ask: BedAsk,
    pub arrival: UnixMillis,
    pub wait_ms: u64,
}

/// What a scan found among the beds: whether it took one (and may sleep),
/// and how many requests were asleep fleet-wide then (itself included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bed {
    pub taken: bool,
    pub asleep: u32,
}

/// When the bed of a scan that arrived at `arrival` and owes `wait_ms` is
/// free again: once it has slept what it may (at most `budget_ms`), and
/// [`BED_GRACE`]. A request killed in its sleep frees its bed then too.
pub fn bed_until(arrival: UnixMillis, wait_ms: u64, budget_ms: u64) -> UnixMillis {
    arrival
        .saturating_add(Duration::from_millis(wait_ms.min(budget_ms)))
        .saturating_add(BED_GRACE)
}

/// The beds' answer to `ask`, for a scan that arrived at `arrival` and
/// owes `wait_ms`: the leases of `leases` that ended by then are dropped,
/// and a bed is taken (its lease, ending at [`bed_until`], kept) if fewer
/// than `ask.max_asleep` are held. The in-memory store's rule; `bed.lua`
/// is the same on Valkey.
pub fn take_bed(
    leases: &mut Vec<UnixMillis>,
    ask: &BedAsk,
    arrival: UnixMillis,
    wait_ms: u64,
) -> Bed {
    leases.retain(|end| *end > arrival);
    let held = u32::try_from(leases.len()).unwrap_or(u32::MAX);
    if held >= ask.max_asleep {
        return Bed {
            taken: false,
            asleep: held,
        };
    }
    leases.push(bed_until(arrival, wait_ms, ask.budget_ms));
    Bed {
        taken: true,
        asleep: held + 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GATEWAY: Duration = Duration::from_millis(29_000);
    const MARGIN: Duration = Duration::from_millis(1_000);

    /// A woken sleep keeps its total and defers what it did not sleep, in
    /// whole milliseconds rounded down (so the deferral errs late); a wake
    /// after the sleep's end changes nothing.
    #[test]
    fn cut_short_defers_the_rest() {
        let hard = plan(
            Duration::from_secs(60),
            DelayMode::Sleep,
            Duration::from_secs(28),
        );
        let ms = Duration::from_millis;
        let table = [
            (Duration::ZERO, ms(0), ms(60_000)),
            (Duration::from_micros(2_500_900), ms(2_500), ms(57_500)),
            (ms(28_000), ms(28_000), ms(32_000)),
            (ms(40_000), ms(28_000), ms(32_000)),
        ];
        for (slept, sleep, deferred) in table {
            let cut = hard.cut_short(slept);
            assert_eq!(
                (cut.total, cut.sleep, cut.deferred),
                (hard.total, sleep, deferred)
            );
        }
        let none = plan(Duration::ZERO, DelayMode::Sleep, ms(28_000));
        assert_eq!(none.cut_short(ms(5)), none);
    }

    /// Behind the HTTP API a hard delay sleeps 28 s and defers 32 s.
    #[test]
    fn hard_delay_behind_gateway() {
        let b = budget(Some(Duration::from_secs(35)), GATEWAY, MARGIN);
        assert_eq!(b, Duration::from_secs(28));
        let p = plan(Duration::from_secs(60), DelayMode::Sleep, b);
        assert_eq!(p.sleep, Duration::from_secs(28));
        assert_eq!(p.deferred, Duration::from_secs(32));
    }

    /// The soft delay fits the budget whole.
    #[test]
    fn soft_delay_fits() {
        let p = plan(
            Duration::from_secs(5),
            DelayMode::Sleep,
            budget(None, GATEWAY, MARGIN),
        );
        assert_eq!(
            (p.sleep, p.deferred),
            (Duration::from_secs(5), Duration::ZERO)
        );
    }

    /// The Lambda deadline caps the sleep below the gateway's.
    #[test]
    fn lambda_deadline_caps() {
        let b = budget(Some(Duration::from_secs(3)), GATEWAY, MARGIN);
        assert_eq!(b, Duration::from_secs(2));
        assert_eq!(
            budget(Some(Duration::from_millis(500)), GATEWAY, MARGIN),
            Duration::ZERO
        );
    }

    /// Defer mode sleeps nothing.
    #[test]
    fn defer_mode() {
        let p = plan(
            Duration::from_secs(60),
            DelayMode::Defer,
            Duration::from_secs(28),
        );
        assert_eq!(
            (p.sleep, p.deferred),
            (Duration::ZERO, Duration::from_secs(60))
        );
    }

    /// Beds: taken up to the cap, refused beyond it, and free again once
    /// a lease ends (its sleep, at most the budget, and a second), whether
    /// or not its sleeper woke.
    #[test]
    fn beds_are_leases() {
        let mut leases = Vec::new();
        let at = |ms| UnixMillis(ms);
        let ask = |max_asleep| BedAsk {
            id: Uuid::nil(),
            budget_ms: 28_000,
            max_asleep,
        };
        assert_eq!(bed_until(at(0), 5_000, 28_000), at(6_000));
        assert_eq!(bed_until(at(0), 60_000, 28_000), at(29_000));
        for asleep in 1..=2 {
            let bed = take_bed(&mut leases, &ask(2), at(0), 5_000);
            assert_eq!(
                bed,
                Bed {
                    taken: true,
                    asleep
                }
            );
        }
        let full = take_bed(&mut leases, &ask(2), at(5_999), 5_000);
        assert_eq!(
            full,
            Bed {
                taken: false,
                asleep: 2
            }
        );
        let freed = take_bed(&mut leases, &ask(2), at(6_000), 5_000);
        assert_eq!(
            freed,
            Bed {
                taken: true,
                asleep: 1
            }
        );
        assert!(!take_bed(&mut leases, &ask(0), at(6_000), 5_000).taken);
    }

    proptest! {
        /// Nothing is lost: sleep + deferred is the whole delay, and sleep fits the budget.
        #[test]
        fn nothing_lost(total_ms in 0u64..200_000, budget_ms in 0u64..40_000, defer in any::<bool>()) {
            let mode = if defer { DelayMode::Defer } else { DelayMode::Sleep };
            let p = plan(Duration::from_millis(total_ms), mode, Duration::from_millis(budget_ms));
            prop_assert_eq!(p.sleep + p.deferred, p.total);
            prop_assert!(p.sleep <= Duration::from_millis(budget_ms));
        }
    }
}
