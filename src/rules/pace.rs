//! Pacing, as a pure rule: over-quota scans of one subject start one tier
//! delay apart, so a parallel burst waits in line instead of all at once.
//!
//! This is the generic cell rate algorithm (GCRA, ITU-T I.371; the rule
//! behind governor's `test_and_update` and redis-cell) with a burst of one:
//! each line's "slot" is its theoretical arrival time (TAT), the emission
//! interval is the tier's delay, and where a rate limiter refuses a cell
//! that arrives before its TAT, the gate delays the scan to it instead and
//! moves the TAT one interval on. Several lines (the subject's and the
//! levels above it) are paced at once by taking the latest of their TATs.
//! The cap (`QUOTA_MAX_BACKLOG_MS`) is GCRA's delay-variation tolerance
//! turned around: beyond it the scan is refused, not delayed.
//!
//! [`next_start`] is the rule; `pace.lua` (through
//! [`crate::io::store::QuotaStore::pace`]) applies it atomically in Valkey, the
//! in-memory store calls it directly, and [`crate::gate::quota_view`] uses it to
//! predict the next scan's delay. A test on a real Valkey
//! (`tests/it/pacing.rs`) checks the script and this function agree.

use crate::rules::delay::Bed;
use crate::rules::unix::UnixMillis;

/// The answer to one pacing step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paced {
    /// The scan may start `delay_ms` after its arrival; the slot moved on.
    /// `bed`: the bed the step was asked for (see [`crate::rules::delay::Bed`]),
    /// taken or not; `None` when none was asked.
    Slot { delay_ms: u64, bed: Option<Bed> },
    /// The delay would exceed the cap: nothing changed (the caller takes the
    /// count back, see [`QuotaStore::pace`](crate::io::store::QuotaStore::pace)); a slot within the cap frees up
    /// in `retry_after_ms`. `levels_ms`: for each level of the step, in the
    /// order asked, how long its own line stays past the cap ([`line_excess`];
    /// 0: that line alone had room), so a level full by itself can be
    /// refused without asking the store again, and a level with room is not.
    Full {
        retry_after_ms: u64,
        levels_ms: Vec<u64>,
    },
}

/// The pacing rule over several lines (the subject's, and each level's
/// above it that is over its limit), each `(previous slot, tier delay)`:
/// the scan starts at the latest of `max(arrival, previous) + delay`, and
/// every line's slot moves to that start, so each line's scans start at
/// least its delay apart, whichever line held them back. A line with no
/// delay (within its limit) holds nothing back, and its slot stays. Refused as a whole
/// (`Err(retry_after_ms)`) when the wait would exceed the cap (or the
/// longest tier delay, if that is longer); then no slot moves.
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
    // A scan with nothing queued ahead of it is never refused: the cap bounds
    // the pile-up, not a tier delay configured longer than the cap.
    let cap = max_backlog_ms.max(longest);
    if wait > cap {
        // The first arrival at which this delay fits the cap.
        Err(wait - cap)
    } else {
        Ok(start)
    }
}

/// The `Retry-After` of a scan refused because its line is full, in whole
/// seconds: when a slot within the cap frees up (`retry_after_ms`, rounded
/// up, at least 1 s), but never past its counter's reset
/// (`seconds_to_reset`, when it has one): the reset clears the slot with
/// the counter, so a retry then is not refused. The scan's 503 and
/// `GET /quota`'s `backlogFullRetryAfter` both say this.
pub fn retry_after_secs(retry_after_ms: u64, seconds_to_reset: Option<u64>) -> u64 {
    let secs = retry_after_ms.div_ceil(1000).max(1);
    seconds_to_reset.map_or(secs, |reset| secs.min(reset.max(1)))
}

/// How long one line, alone, stays past the cap: a scan arriving at
/// `arrival_ms` would wait `max(arrival, previous) + delay − arrival` in it,
/// and the cap is `max_backlog_ms` (or the line's own delay, if longer, as
/// in [`next_start`]); 0 when the line has room. Every later scan in this
/// line is refused until this has passed (a slot never moves back), so it
/// bounds how long a refusal may be remembered without asking the store.
pub fn line_excess(
    previous: UnixMillis,
    arrival_ms: UnixMillis,
    delay_ms: u64,
    max_backlog_ms: u64,
) -> u64 {
    if delay_ms == 0 {
        return 0;
    }
    match next_start([(previous, delay_ms)], arrival_ms, max_backlog_ms) {
        Ok(_) => 0,
        Err(excess) => excess,
    }
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
