//! Refusals metered in aggregate: a `backlog_full` 503 is the client's doing, and a refused flood
//! must not cost a log line per request. In EMF they are held and written as one line per scope
//! and [`INTERVAL_MS`] (the first after a quiet interval at once), by the next request of any
//! outcome or when `serve` stops ([`super::Meter::flush`]); a Lambda environment that ends first
//! loses at most one interval's. No clock is read: each request's own instant is compared.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::rules::scope::Scope;
use crate::rules::unix::UnixMillis;

/// The shortest time between two refusal lines of one scope: CloudWatch's standard resolution.
pub const INTERVAL_MS: i64 = 60_000;

/// Refusals not yet written, per scope, and when the last line was.
#[derive(Default)]
pub(super) struct Refusals {
    pending: [AtomicU64; 2],
    last_line_ms: [AtomicI64; 2],
}

impl Refusals {
    pub(super) fn add(&self, scope: Scope) {
        self.pending[scope.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `scope`'s held refusals are to be written now, at `at`; whoever is told yes writes
    /// them, and a second caller in the same instant is told no.
    pub(super) fn due(&self, scope: Scope, at: UnixMillis) -> bool {
        let i = scope.index();
        if self.pending[i].load(Ordering::Relaxed) == 0 {
            return false;
        }
        let last = self.last_line_ms[i].load(Ordering::Relaxed);
        if at.get().saturating_sub(last) < INTERVAL_MS {
            return false;
        }
        let won = self.last_line_ms[i]
            .compare_exchange(last, at.get(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        won && self.pending[i].swap(0, Ordering::Relaxed) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first refusal goes out at once; the next ones wait for the
    /// interval to pass and go out together; each scope on its own.
    #[test]
    fn one_line_per_interval() {
        let r = Refusals::default();
        let at = |ms: i64| UnixMillis(1_796_032_800_000 + ms);
        assert!(!r.due(Scope::Ip, at(0)));
        r.add(Scope::Ip);
        assert!(r.due(Scope::Ip, at(0)));
        for _ in 0..500 {
            r.add(Scope::Ip);
        }
        r.add(Scope::Tid);
        assert!(!r.due(Scope::Ip, at(59_999)));
        assert!(r.due(Scope::Tid, at(59_999)));
        assert!(r.due(Scope::Ip, at(60_000)));
        assert!(!r.due(Scope::Ip, at(60_001)));
    }
}
