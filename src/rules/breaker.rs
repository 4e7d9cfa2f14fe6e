//! A circuit breaker in front of the quota store. After `threshold` consecutive failures it opens
//! and the gate skips the store for `cool_down`, so a hung store costs microseconds per request
//! instead of the timeout. Then one request goes through as a probe (half-open): its success closes
//! the breaker, its failure reopens it; requests meanwhile are still skipped, so a hung store costs
//! one timeout per cool-down. The `Mutex` is never held across an `.await`.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::rules::unix::duration_ms;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go through; `failures` in a row so far.
    Closed { failures: u32 },
    /// Calls are skipped until `until`.
    Open { until: Instant },
    /// A probe is in flight; should it never report, another may go after `probe_deadline`.
    HalfOpen { probe_deadline: Instant },
}

#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    state: Mutex<State>,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures (0: never), for `cool_down`.
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Self {
            threshold,
            cool_down,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is one Copy value, always whole: a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether to make the store call at `now`; if so, [`record`](Self::record) must follow.
    pub fn admit(&self, now: Instant) -> bool {
        if self.threshold == 0 {
            return true;
        }
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => true,
            State::Open { until }
            | State::HalfOpen {
                probe_deadline: until,
            } if now < until => false,
            State::Open { .. } | State::HalfOpen { .. } => {
                *state = State::HalfOpen {
                    probe_deadline: now + self.cool_down,
                };
                true
            }
        }
    }

    /// Records the outcome of an admitted call, which ended at `now`.
    pub fn record(&self, ok: bool, now: Instant) {
        if self.threshold == 0 {
            return;
        }
        let mut state = self.lock();
        *state = match (*state, ok) {
            (State::Closed { .. }, true) => State::Closed { failures: 0 },
            (previous, true) => {
                tracing::info!(?previous, "quota store answered; circuit breaker closed");
                State::Closed { failures: 0 }
            }
            (State::Closed { failures }, false) if failures + 1 < self.threshold => State::Closed {
                failures: failures + 1,
            },
            (State::Closed { .. } | State::HalfOpen { .. }, false) => {
                tracing::warn!(
                    cool_down_ms = duration_ms(self.cool_down),
                    "quota store failing; circuit breaker open"
                );
                State::Open {
                    until: now + self.cool_down,
                }
            }
            // A straggler admitted before the breaker opened: the cool-down stands.
            (open @ State::Open { .. }, false) => open,
        };
    }

    /// Whether calls are being skipped at `now`.
    #[cfg(any(test, feature = "testing"))]
    pub fn is_open(&self, now: Instant) -> bool {
        match *self.lock() {
            State::Closed { .. } => false,
            State::Open { until }
            | State::HalfOpen {
                probe_deadline: until,
            } => now < until,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL: Duration = Duration::from_secs(1);

    /// A clock of the test's own: the breaker is only ever told the time.
    struct At(Instant);

    impl At {
        fn now(&self) -> Instant {
            self.0
        }

        fn advance(&mut self, d: Duration) {
            self.0 += d;
        }
    }

    fn fail(b: &Breaker, n: u32, at: &At) {
        for _ in 0..n {
            assert!(b.admit(at.now()));
            b.record(false, at.now());
        }
    }

    /// A new breaker of `threshold` after `n` failures, and its clock.
    fn failed(threshold: u32, n: u32) -> (Breaker, At) {
        let at = At(Instant::now());
        let b = Breaker::new(threshold, COOL);
        fail(&b, n, &at);
        (b, at)
    }

    /// A breaker opened by `threshold` failures, its cool-down just over.
    fn cooled(threshold: u32, at: &mut At) -> Breaker {
        let b = Breaker::new(threshold, COOL);
        fail(&b, threshold, at);
        at.advance(COOL);
        b
    }

    /// It opens after exactly `threshold` consecutive failures, not before.
    #[test]
    fn opens_after_threshold() {
        let (b, at) = failed(5, 4);
        assert!(!b.is_open(at.now()));
        fail(&b, 1, &at);
        assert!(b.is_open(at.now()));
        assert!(!b.admit(at.now()));
    }

    /// A success resets the count: failures must be consecutive.
    #[test]
    fn success_resets_the_count() {
        let (b, at) = failed(3, 2);
        assert!(b.admit(at.now()));
        b.record(true, at.now());
        fail(&b, 2, &at);
        assert!(!b.is_open(at.now()));
    }

    /// After the cool-down one probe goes through; others wait for its answer.
    #[test]
    fn half_open_lets_one_probe_through() {
        let (b, mut at) = failed(1, 1);
        at.advance(COOL - Duration::from_millis(1));
        assert!(!b.admit(at.now()));
        at.advance(Duration::from_millis(1));
        assert!(b.admit(at.now()), "the probe");
        assert!(!b.admit(at.now()), "a second caller during the probe");
        b.record(true, at.now());
        assert!(!b.is_open(at.now()));
        assert!(b.admit(at.now()) && b.admit(at.now()));
    }

    /// A failed probe opens the breaker for another full cool-down.
    #[test]
    fn failed_probe_reopens() {
        let mut at = At(Instant::now());
        let b = cooled(2, &mut at);
        assert!(b.admit(at.now()));
        b.record(false, at.now());
        assert!(b.is_open(at.now()));
        at.advance(COOL / 2);
        assert!(!b.admit(at.now()));
        at.advance(COOL / 2);
        assert!(b.admit(at.now()));
    }

    /// A probe that never reports (its request was dropped) does not wedge the breaker.
    #[test]
    fn lost_probe_is_replaced() {
        let mut at = At(Instant::now());
        let b = cooled(1, &mut at);
        assert!(b.admit(at.now()));
        at.advance(COOL);
        assert!(b.admit(at.now()), "a new probe once the first is overdue");
    }

    /// Late failures from calls admitted before it opened do not extend the cool-down.
    #[test]
    fn stragglers_do_not_extend() {
        let mut at = At(Instant::now());
        let b = Breaker::new(1, COOL);
        assert!(b.admit(at.now()));
        assert!(b.admit(at.now()));
        b.record(false, at.now());
        at.advance(COOL / 2);
        b.record(false, at.now());
        at.advance(COOL / 2);
        assert!(b.admit(at.now()));
    }

    /// A threshold of 0 turns the breaker off.
    #[test]
    fn zero_threshold_never_opens() {
        let (b, at) = failed(0, 100);
        assert!(!b.is_open(at.now()));
    }
}
