//! A circuit breaker in front of the quota store.
//!
//! When Valkey hangs, every call costs the whole `QUOTA_STORE_TIMEOUT_MS`
//! before the gate fails open or closed. After `threshold` consecutive
//! failures the breaker opens and the gate skips the store for `cool_down`,
//! so an outage costs microseconds per request instead of the timeout. Once
//! the cool-down is over, one request is let through as a probe (half-open):
//! its success closes the breaker, its failure opens it for another cool-down.
//! Requests arriving while the probe is in flight are still skipped, so a hung
//! store costs one timeout per cool-down, not one per concurrent request.
//!
//! Time is [`tokio::time::Instant`], so tests drive it with paused time. The
//! state sits behind a std `Mutex`: it is held for a few instructions and
//! never across an `.await`.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Calls go through; `failures` in a row so far.
    Closed { failures: u32 },
    /// Calls are skipped until `until`.
    Open { until: Instant },
    /// One probe is in flight. Should it never report (its request was
    /// dropped), another probe is allowed after `probe_deadline`.
    HalfOpen { probe_deadline: Instant },
}

/// A consecutive-failure circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    state: Mutex<State>,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `cool_down`.
    /// A `threshold` of 0 gives a breaker that never opens.
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

    /// Whether the next store call should be made. Must be followed by
    /// [`record`](Self::record) when it returns `true`.
    pub fn admit(&self) -> bool {
        if self.threshold == 0 {
            return true;
        }
        let now = Instant::now();
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

    /// Records the outcome of an admitted call.
    pub fn record(&self, ok: bool) {
        if self.threshold == 0 {
            return;
        }
        let now = Instant::now();
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
                    cool_down_ms = self.cool_down.as_millis() as u64,
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

    /// Whether calls are being skipped right now.
    pub fn is_open(&self) -> bool {
        let now = Instant::now();
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

    fn fail(b: &Breaker, n: u32) {
        for _ in 0..n {
            assert!(b.admit());
            b.record(false);
        }
    }

    /// A breaker opened by `threshold` failures, its cool-down just over.
    async fn cooled(threshold: u32) -> Breaker {
        let b = Breaker::new(threshold, COOL);
        fail(&b, threshold);
        tokio::time::advance(COOL).await;
        b
    }

    /// It opens after exactly `threshold` consecutive failures, not before.
    #[tokio::test(start_paused = true)]
    async fn opens_after_threshold() {
        let b = Breaker::new(5, COOL);
        fail(&b, 4);
        assert!(!b.is_open());
        fail(&b, 1);
        assert!(b.is_open());
        assert!(!b.admit());
    }

    /// A success resets the count: failures must be consecutive.
    #[tokio::test(start_paused = true)]
    async fn success_resets_the_count() {
        let b = Breaker::new(3, COOL);
        fail(&b, 2);
        assert!(b.admit());
        b.record(true);
        fail(&b, 2);
        assert!(!b.is_open());
    }

    /// After the cool-down one probe goes through; others wait for its answer.
    #[tokio::test(start_paused = true)]
    async fn half_open_lets_one_probe_through() {
        let b = Breaker::new(1, COOL);
        fail(&b, 1);
        tokio::time::advance(COOL - Duration::from_millis(1)).await;
        assert!(!b.admit());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(b.admit(), "the probe");
        assert!(!b.admit(), "a second caller during the probe");
        b.record(true);
        assert!(!b.is_open());
        assert!(b.admit() && b.admit());
    }

    /// A failed probe opens the breaker for another full cool-down.
    #[tokio::test(start_paused = true)]
    async fn failed_probe_reopens() {
        let b = cooled(2).await;
        assert!(b.admit());
        b.record(false);
        assert!(b.is_open());
        tokio::time::advance(COOL / 2).await;
        assert!(!b.admit());
        tokio::time::advance(COOL / 2).await;
        assert!(b.admit());
    }

    /// A probe that never reports (its request was dropped) does not wedge the breaker.
    #[tokio::test(start_paused = true)]
    async fn lost_probe_is_replaced() {
        let b = cooled(1).await;
        assert!(b.admit());
        tokio::time::advance(COOL).await;
        assert!(b.admit(), "a new probe once the first is overdue");
    }

    /// Late failures from calls admitted before it opened do not extend the cool-down.
    #[tokio::test(start_paused = true)]
    async fn stragglers_do_not_extend() {
        let b = Breaker::new(1, COOL);
        assert!(b.admit());
        assert!(b.admit());
        b.record(false);
        tokio::time::advance(COOL / 2).await;
        b.record(false);
        tokio::time::advance(COOL / 2).await;
        assert!(b.admit());
    }

    /// A threshold of 0 turns the breaker off.
    #[tokio::test(start_paused = true)]
    async fn zero_threshold_never_opens() {
        let b = Breaker::new(0, COOL);
        fail(&b, 100);
        assert!(!b.is_open());
    }
}
