//! Step 5: the decision, a pure function of the count and the limits (pinned by table tests).

use std::num::NonZeroU32;
use std::time::Duration;

use crate::rules::unix::duration_ms;

/// The limits that apply to one subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Daily ceiling (L).
    pub limit: NonZeroU32,
    /// Over-quota scans that get the soft delay (W_soft).
    pub soft_window: u32,
    /// Delay for scans L+1 … L+W_soft.
    pub soft_delay: Duration,
    /// Delay for every scan beyond L+W_soft.
    pub hard_delay: Duration,
    /// Scans used from which the response carries a reminder (T_warn).
    pub warn_at: NonZeroU32,
}

impl Limits {
    /// The limits with `grant` extra scans on the daily ceiling, saturating at the largest.
    pub fn with_grant(self, grant: u64) -> Self {
        let raised = u64::from(self.limit.get()).saturating_add(grant);
        let raised = u32::try_from(raised).unwrap_or(u32::MAX);
        Self {
            limit: NonZeroU32::new(raised).unwrap_or(self.limit),
            ..self
        }
    }
}

words! {
    /// Which side of the quota a scan falls on.
    #[derive(Hash)]
    Tier {
        Within = "within",
        Soft = "soft",
        Hard = "hard",
    }
}

/// What the gate does with one scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub tier: Tier,
    /// The whole delay owed before the scan may start.
    pub delay: Duration,
    /// Scans left today, after this one.
    pub remaining: u64,
    pub reminder: bool,
}

/// Decides on the `count`-th scan of the day (1-based, this scan included).
pub fn decide(count: u64, limits: &Limits) -> Decision {
    let limit = u64::from(limits.limit.get());
    let (tier, delay) = if count <= limit {
        (Tier::Within, Duration::ZERO)
    } else if count <= limit + u64::from(limits.soft_window) {
        (Tier::Soft, limits.soft_delay)
    } else {
        (Tier::Hard, limits.hard_delay)
    };
    Decision {
        tier,
        delay,
        remaining: limit.saturating_sub(count),
        reminder: count >= u64::from(limits.warn_at.get()),
    }
}

/// What enforcement would have done with a scan (shadow mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShadowVerdict {
    pub tier: &'static str,
    pub delay_ms: u64,
}

impl ShadowVerdict {
    /// The verdict for a scan decided in `tier` with the tier's `delay`.
    pub fn new(tier: Tier, delay: Duration) -> Self {
        Self {
            tier: tier.as_str(),
            delay_ms: duration_ms(delay),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits(limit: u32, window: u32, warn_at: u32) -> Limits {
        Limits {
            limit: NonZeroU32::new(limit).unwrap(),
            soft_window: window,
            soft_delay: Duration::from_millis(5_000),
            hard_delay: Duration::from_millis(60_000),
            warn_at: NonZeroU32::new(warn_at).unwrap(),
        }
    }

    /// The seed's table, at every boundary of the default anonymous quota.
    #[test]
    fn boundaries() {
        let l = limits(33, 30, 200);
        let soft = Duration::from_secs(5);
        let hard = Duration::from_secs(60);
        for (count, tier, delay, remaining) in [
            (1, Tier::Within, Duration::ZERO, 32),
            (32, Tier::Within, Duration::ZERO, 1),
            (33, Tier::Within, Duration::ZERO, 0),
            (34, Tier::Soft, soft, 0),
            (63, Tier::Soft, soft, 0),
            (64, Tier::Hard, hard, 0),
            (10_000, Tier::Hard, hard, 0),
        ] {
            let d = decide(count, &l);
            assert_eq!(
                (d.tier, d.delay, d.remaining),
                (tier, delay, remaining),
                "count {count}"
            );
        }
    }

    /// The reminder starts at T_warn, whatever the tier.
    #[test]
    fn reminder() {
        let l = limits(333, 30, 200);
        assert!(!decide(199, &l).reminder);
        assert!(decide(200, &l).reminder);
        assert_eq!(decide(200, &l).tier, Tier::Within);
        assert!(decide(400, &l).reminder);
    }

    /// A zero soft window goes straight from within to hard.
    #[test]
    fn no_soft_window() {
        let l = limits(3, 0, 200);
        assert_eq!(decide(3, &l).tier, Tier::Within);
        assert_eq!(decide(4, &l).tier, Tier::Hard);
    }

    /// A grant raises the ceiling: at the limit, the next `grant` scans are
    /// within and the one after is soft; it saturates instead of wrapping.
    #[test]
    fn grant_raises_the_ceiling() {
        let l = limits(3, 2, 200).with_grant(5);
        assert_eq!(decide(8, &l).tier, Tier::Within);
        assert_eq!(decide(9, &l).tier, Tier::Soft);
        assert_eq!(decide(3, &l).remaining, 5);
        assert_eq!(limits(3, 2, 200).with_grant(0), limits(3, 2, 200));
        let max = limits(u32::MAX, 0, 200).with_grant(1_000_000);
        assert_eq!(max.limit.get(), u32::MAX);
    }

    proptest! {
        /// Tiers follow the count monotonically and match their definition.
        #[test]
        fn tiers_are_monotonic(limit in 1u32..10_000, window in 0u32..1_000, count in 1u64..100_000) {
            let l = limits(limit, window, 200);
            let d = decide(count, &l);
            let next = decide(count + 1, &l);
            prop_assert!(next.tier as u8 >= d.tier as u8);
            prop_assert!(next.delay >= d.delay);
            prop_assert!(next.remaining <= d.remaining);
            let expected = if count <= u64::from(limit) {
                Tier::Within
            } else if count <= u64::from(limit) + u64::from(window) {
                Tier::Soft
            } else {
                Tier::Hard
            };
            prop_assert_eq!(d.tier, expected);
            prop_assert_eq!(d.remaining, u64::from(limit).saturating_sub(count));
        }
    }
}
