//! Pacing by the generic cell rate algorithm (GCRA) with a burst of one: over-quota scans of one
//! subject start one tier delay apart. Each line's slot is its theoretical arrival time (TAT), the
//! emission interval the tier's delay, and a scan before its TAT is delayed to it. Several lines
//! are paced at once by the latest TAT; beyond the cap (GCRA's delay-variation tolerance) a scan is
//! refused. `pace.lua` applies [`next_start`] in Valkey.

use crate::rules::delay::SleepLease;
use crate::rules::unix::UnixMillis;

/// The answer to one pacing step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paced {
    /// The scan may start `delay_ms` after its arrival; `sleep_lease`: the sleep lease asked for
    /// (`None`: none).
    Slot {
        delay_ms: u64,
        sleep_lease: Option<SleepLease>,
    },
    /// Over the cap; nothing changed. A slot frees up in `retry_after_ms`; `levels_ms`: how long
    /// each level's own line stays past the cap (0: room), to refuse a full one without the store.
    Full {
        retry_after_ms: u64,
        levels_ms: Vec<u64>,
    },
}

/// The pacing rule over lines of `(previous slot, tier delay)`: the scan starts at the latest
/// `max(arrival, previous) + delay`, and every delayed line's slot moves there. Refused whole, no
/// slot moved, when the wait exceeds the cap or the longest tier delay.
pub fn next_start(
    lines: impl IntoIterator<Item = (UnixMillis, u64)>,
    arrival_ms: UnixMillis,
    max_backlog_ms: u64,
) -> Result<UnixMillis, u64> {
    let (mut start, mut longest) = (arrival_ms, 0);
    for (previous, delay_ms) in lines.into_iter().filter(|(_, d)| *d > 0) {
        let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
        start = start.max(UnixMillis(
            previous.max(arrival_ms).get().saturating_add(delay),
        ));
        longest = longest.max(delay_ms);
    }
    let wait = u64::try_from(start.get() - arrival_ms.get()).unwrap_or(0);
    // The cap bounds the pile-up, not a tier delay longer than itself.
    let cap = max_backlog_ms.max(longest);
    if wait > cap {
        // The first arrival at which this delay fits the cap.
        Err(wait - cap)
    } else {
        Ok(start)
    }
}

/// A full line's `Retry-After` in whole seconds (at least 1): when a slot within the cap frees up,
/// but never past the counter's reset, which clears the slot.
pub fn retry_after_secs(retry_after_ms: u64, seconds_to_reset: Option<u64>) -> u64 {
    let secs = retry_after_ms.div_ceil(1000).max(1);
    seconds_to_reset.map_or(secs, |reset| secs.min(reset.max(1)))
}

/// How long one line alone stays past the cap (0: it has room). A slot never moves back, so every
/// later scan in the line is refused until then: a refusal may be remembered that long.
pub fn line_excess(
    previous: UnixMillis,
    arrival_ms: UnixMillis,
    delay_ms: u64,
    max_backlog_ms: u64,
) -> u64 {
    // A line without a delay starts at the arrival: always room.
    next_start([(previous, delay_ms)], arrival_ms, max_backlog_ms)
        .err()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule on bare milliseconds, as the tables write them.
    fn next_slot(previous: i64, arrival: i64, delay: u64, cap: u64) -> Result<i64, u64> {
        super::next_start([(UnixMillis(previous), delay)], UnixMillis(arrival), cap)
            .map(UnixMillis::get)
    }
    use proptest::prelude::*;

    /// A burst of five hard-tier scans is spread out one delay apart; a
    /// scan past the cap is refused with the wait until it would fit.
    #[test]
    fn pacing_example() {
        let mut slot = 0;
        let mut delays = Vec::new();
        for _ in 0..3 {
            slot = next_slot(slot, 1_000, 3_000, 10_000).unwrap();
            delays.push(slot - 1_000);
        }
        assert_eq!(delays, [3_000, 6_000, 9_000]);
        // The fourth would wait 12 s: 2 s past the cap.
        assert_eq!(next_slot(slot, 1_000, 3_000, 10_000), Err(2_000));
        // Two seconds later it fits.
        assert_eq!(next_slot(slot, 3_000, 3_000, 10_000), Ok(13_000));
        // A wait of exactly the cap fits (found by `scripts/mutants`).
        assert_eq!(next_slot(0, 1_000, 10_000, 10_000), Ok(11_000));
        assert_eq!(next_slot(4_000, 1_000, 7_000, 10_000), Ok(11_000));
        // A tier delay longer than the cap is served, one at a time.
        assert_eq!(next_slot(0, 1_000, 20_000, 10_000), Ok(21_000));
        assert_eq!(next_slot(21_000, 1_000, 20_000, 10_000), Err(20_000));
    }

    /// Several lines: the latest start wins, and a line's own delay is
    /// kept from its previous slot; the cap is on the whole wait.
    #[test]
    fn lines_start_together() {
        let start = |lines: &[(i64, u64)], arrival, cap| {
            next_start(
                lines.iter().map(|&(p, d)| (UnixMillis(p), d)),
                UnixMillis(arrival),
                cap,
            )
            .map(UnixMillis::get)
        };
        // The subject's line is free, the network's slot is 8 s ahead.
        assert_eq!(
            start(&[(0, 5_000), (9_000, 5_000)], 1_000, 60_000),
            Ok(14_000)
        );
        assert_eq!(
            start(&[(20_000, 60_000), (9_000, 5_000)], 1_000, 60_000),
            Err(19_000)
        );
        assert_eq!(start(&[], 1_000, 0), Ok(1_000));
        // A line within its limit waits for nothing, whatever its slot.
        assert_eq!(start(&[(90_000, 0), (0, 5_000)], 1_000, 60_000), Ok(6_000));
        // One line is `next_slot`.
        assert_eq!(
            start(&[(4_000, 7_000)], 1_000, 10_000),
            next_slot(4_000, 1_000, 7_000, 10_000)
        );
    }

    /// A line's own excess: what `next_slot` refuses it by, 0 with room or
    /// no delay; where no delay exceeds the cap, the step's refusal is the
    /// longest of its lines'.
    #[test]
    fn line_excess_is_each_lines_refusal() {
        let excess = |p, a, d, cap| line_excess(UnixMillis(p), UnixMillis(a), d, cap);
        assert_eq!(excess(20_000, 1_000, 5_000, 10_000), 14_000);
        assert_eq!(excess(0, 1_000, 5_000, 10_000), 0);
        assert_eq!(excess(90_000, 1_000, 0, 10_000), 0);
        let lines = [(20_000, 60_000), (9_000, 5_000)];
        let step = next_start(
            lines.map(|(p, d)| (UnixMillis(p), d)),
            UnixMillis(1_000),
            60_000,
        );
        let worst = lines
            .iter()
            .map(|&(p, d)| excess(p, 1_000, d, 60_000))
            .max();
        assert_eq!(step, Err(worst.unwrap()));
    }

    proptest! {
        /// Delays are never negative, and never above the cap.
        #[test]
        fn never_negative(prev in 0i64..1_000_000, arrival in 0i64..1_000_000, d in 0u64..100_000, cap in 0u64..1_000_000) {
            match next_slot(prev, arrival, d, cap) {
                Ok(slot) => {
                    prop_assert!(slot >= arrival);
                    prop_assert!((slot - arrival) as u64 <= cap.max(d));
                    prop_assert!(slot >= prev);
                }
                Err(retry) => prop_assert!(retry > 0),
            }
        }

        /// A client that waits for each answer sees exactly the tier's delay.
        #[test]
        fn sequential_reproduces_the_seed(delays in proptest::collection::vec(0u64..100_000, 1..50), gap in 0i64..1_000) {
            let (mut slot, mut arrival) = (0i64, 1_000_000i64);
            for d in delays {
                let next = next_slot(slot, arrival, d, u64::MAX).unwrap();
                prop_assert_eq!((next - arrival) as u64, d);
                slot = next;
                // The answer comes once the delay has passed; the next scan after it.
                arrival = slot + gap;
            }
        }

        /// A burst's slots increase strictly by each scan's delay.
        #[test]
        fn burst_is_spread(delays in proptest::collection::vec(1u64..100_000, 1..50), arrival in 0i64..1_000_000) {
            let mut slot = 0i64;
            for d in delays {
                let next = next_slot(slot, arrival, d, u64::MAX).unwrap();
                prop_assert_eq!(next, slot.max(arrival) + d as i64);
                prop_assert!(next > slot);
                slot = next;
            }
        }
    }
}
