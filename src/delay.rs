//! Step 6: spending the delay within the platform's limits.
//!
//! An HTTP API cuts every integration off at 30 s and Lambda bills every
//! millisecond spent asleep, so the handler never sleeps past
//! `min(Lambda remaining time, gateway timeout) − margin`. Whatever does not
//! fit is deferred onto the queued job (SQS `DelaySeconds`, `notBefore`), not
//! dropped: the scan starts no sooner than the full delay after the request.

use std::time::Duration;

use crate::config::words::DelayMode;

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GATEWAY: Duration = Duration::from_millis(29_000);
    const MARGIN: Duration = Duration::from_millis(1_000);

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
