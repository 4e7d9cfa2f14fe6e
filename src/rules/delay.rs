//! Step 6: spending the delay within the platform's limits. An HTTP API cuts integrations off
//! at 30 s and Lambda bills every millisecond asleep, so the handler sleeps at most `min(Lambda
//! remaining time, gateway timeout) − margin` and defers the rest onto the queued job. Each request
//! asleep holds a Lambda environment, so a scan sleeps only on a [`SleepLease`]: a lease of a
//! fleet-wide counting semaphore of `QUOTA_MAX_ASLEEP`, which ends with its sleep, so a killed
//! process leaks none. With none free, it defers it all.

use std::time::Duration;

use uuid::Uuid;

use crate::rules::modes::DelayMode;
use crate::rules::unix::{UnixMillis, duration_ms};

/// The most SQS can hold a message back.
pub const MAX_QUEUE_DEFERRAL: Duration = Duration::from_secs(900);

/// How one delay is split between sleeping now and deferring the job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DelayPlan {
    pub total: Duration,
    pub sleep: Duration,
    pub deferred: Duration,
}

/// The time left to answer at all: the earlier of the Lambda deadline and the gateway timeout.
pub fn ceiling(remaining: Option<Duration>, gateway_timeout: Duration) -> Duration {
    remaining.map_or(gateway_timeout, |r| r.min(gateway_timeout))
}

/// What the handler may sleep: the [`ceiling`] less the margin kept for the enqueue and answer.
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
    /// The plan of a sleep woken after `slept` (stopping): the rest deferred, the total unchanged.
    pub fn cut_short(self, slept: Duration) -> Self {
        let slept = Duration::from_millis(duration_ms(slept));
        plan(self.total, DelayMode::Sleep, self.sleep.min(slept))
    }
}

/// A sleep lease outlasts its sleep by this: the sleep starts after the count and pacing step.
pub const SLEEP_LEASE_GRACE: Duration = Duration::from_secs(1);

/// The sleep leases every gate process shares: a sorted set of leases scored by when each ends.
pub const ASLEEP_KEY: &str = "quota:asleep";

/// A scan's ask for one of `max_asleep` sleep leases, to sleep at most `budget_ms` of its delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SleepAsk {
    /// The lease's name (the scan's id): one lease per scan.
    pub id: Uuid,
    pub budget_ms: u64,
    pub max_asleep: u32,
}

/// A sleep lease asked alone, outside a pacing step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoneSleepAsk {
    pub ask: SleepAsk,
    pub arrival: UnixMillis,
    pub wait_ms: u64,
}

/// Whether a scan took a sleep lease, and how many requests were asleep fleet-wide (itself
/// included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SleepLease {
    pub taken: bool,
    pub asleep: u32,
}

/// When a sleep lease is free again: once its scan has slept what it may, plus
/// [`SLEEP_LEASE_GRACE`].
pub fn sleep_lease_until(arrival: UnixMillis, wait_ms: u64, budget_ms: u64) -> UnixMillis {
    arrival
        .saturating_add(Duration::from_millis(wait_ms.min(budget_ms)))
        .saturating_add(SLEEP_LEASE_GRACE)
}

/// The sleep leases' answer to `ask`, dropping ended leases: the in-memory store's rule, as
/// `sleep_lease.lua`.
pub fn take_sleep_lease(
    leases: &mut Vec<UnixMillis>,
    ask: &SleepAsk,
    arrival: UnixMillis,
    wait_ms: u64,
) -> SleepLease {
    leases.retain(|end| *end > arrival);
    let held = u32::try_from(leases.len()).unwrap_or(u32::MAX);
    if held >= ask.max_asleep {
        return SleepLease {
            taken: false,
            asleep: held,
        };
    }
    leases.push(sleep_lease_until(arrival, wait_ms, ask.budget_ms));
    SleepLease {
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

    /// Sleep leases: taken up to the cap, refused beyond it, and free again once
    /// a lease ends (its sleep, at most the budget, and a second), whether
    /// or not its sleeper woke.
    #[test]
    fn sleep_leases_are_bounded() {
        let mut leases = Vec::new();
        let at = |ms| UnixMillis(ms);
        let ask = |max_asleep| SleepAsk {
            id: Uuid::nil(),
            budget_ms: 28_000,
            max_asleep,
        };
        assert_eq!(sleep_lease_until(at(0), 5_000, 28_000), at(6_000));
        assert_eq!(sleep_lease_until(at(0), 60_000, 28_000), at(29_000));
        for asleep in 1..=2 {
            let sleep_lease = take_sleep_lease(&mut leases, &ask(2), at(0), 5_000);
            assert_eq!(
                sleep_lease,
                SleepLease {
                    taken: true,
                    asleep
                }
            );
        }
        let full = take_sleep_lease(&mut leases, &ask(2), at(5_999), 5_000);
        assert_eq!(
            full,
            SleepLease {
                taken: false,
                asleep: 2
            }
        );
        let freed = take_sleep_lease(&mut leases, &ask(2), at(6_000), 5_000);
        assert_eq!(
            freed,
            SleepLease {
                taken: true,
                asleep: 1
            }
        );
        assert!(!take_sleep_lease(&mut leases, &ask(0), at(6_000), 5_000).taken);
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
