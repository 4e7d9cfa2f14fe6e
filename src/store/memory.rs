//! The embedded store: `count.lua`'s semantics in process.
//!
//! It is the default when no `VALKEY_URL` is set, so `quota-gate serve` runs
//! with nothing else installed. Counters expire exactly as in Valkey, and
//! expired entries are swept whenever the map doubles since the last sweep
//! (so sweeping costs O(1) amortised) and, at most once a minute, as soon as
//! the earliest counter has expired (so at 00:00 UTC yesterday's subjects go
//! at once instead of lingering until the map doubles again). Memory stays
//! proportional to the subjects seen in one period; after a mass expiry the
//! table's capacity is given back too.
//! A std `Mutex` fits: it is never held across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Count, QuotaKey, QuotaStore, Snapshot, StoreError};
use crate::config::ResetPolicy;

/// A source of unix seconds.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

const MIN_SWEEP_LEN: usize = 1024;

/// The least time between two sweeps triggered by expiry rather than size:
/// with `rolling` counters something expires every second, and an O(n) sweep
/// per second would be waste.
const SWEEP_INTERVAL_SECS: i64 = 60;

#[derive(Debug, Clone, Copy)]
struct Entry {
    used: u64,
    reset_at: i64,
    first_seen: i64,
}

struct Inner {
    entries: HashMap<String, Entry>,
    sweep_at_len: usize,
    /// No entry expires before this (exact after a sweep, lowered on insert).
    earliest_reset: i64,
    last_sweep: i64,
}

impl Inner {
    /// Drops expired entries and returns spare capacity after a mass expiry.
    fn sweep(&mut self, now: i64) {
        self.entries.retain(|_, e| e.reset_at > now);
        let len = self.entries.len();
        if self.entries.capacity() > 4 * len.max(MIN_SWEEP_LEN) {
            self.entries.shrink_to(2 * len);
        }
        self.sweep_at_len = (len * 2).max(MIN_SWEEP_LEN);
        self.earliest_reset = self
            .entries
            .values()
            .map(|e| e.reset_at)
            .min()
            .unwrap_or(i64::MAX);
        self.last_sweep = now;
    }
}

/// An in-memory quota store.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    clock: Clock,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_clock(Arc::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        }))
    }
}

impl MemoryStore {
    /// A store reading time from `clock` (tests pass a settable one).
    pub fn with_clock(clock: Clock) -> Self {
        let inner = Inner {
            entries: HashMap::new(),
            sweep_at_len: MIN_SWEEP_LEN,
            earliest_reset: i64::MAX,
            last_sweep: i64::MIN,
        };
        Self {
            inner: Arc::new(Mutex::new(inner)),
            clock,
        }
    }

    /// Live and not yet swept entries.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave an entry half-written.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn live(inner: &Inner, key: &str, now: i64) -> Option<Entry> {
        inner.entries.get(key).copied().filter(|e| e.reset_at > now)
    }

    fn count_now(&self, key: &QuotaKey, reset: ResetPolicy) -> Count {
        let now = (self.clock)();
        let mut inner = self.lock();
        let entry = match inner.entries.get_mut(&key.counter) {
            // The common case: no key copy, no second lookup.
            Some(e) if e.reset_at > now => {
                e.used += 1;
                *e
            }
            _ => {
                let reset_at = match reset {
                    ResetPolicy::Rolling => now + 86_400,
                    ResetPolicy::UtcDay => now - now.rem_euclid(86_400) + 86_400,
                };
                let e = Entry {
                    used: 1,
                    reset_at,
                    first_seen: now,
                };
                inner.entries.insert(key.counter.clone(), e);
                inner.earliest_reset = inner.earliest_reset.min(reset_at);
                e
            }
        };
        let expired = now >= inner.earliest_reset
            && now >= inner.last_sweep.saturating_add(SWEEP_INTERVAL_SECS);
        if inner.entries.len() >= inner.sweep_at_len || expired {
            inner.sweep(now);
        }
        Count {
            used: entry.used,
            reset_at: entry.reset_at,
            now,
        }
    }
}

fn iso8601(secs: i64) -> Option<String> {
    OffsetDateTime::from_unix_timestamp(secs)
        .ok()?
        .format(&Rfc3339)
        .ok()
}

impl QuotaStore for MemoryStore {
    async fn count(&self, key: &QuotaKey, reset: ResetPolicy) -> Result<Count, StoreError> {
        Ok(self.count_now(key, reset))
    }

    async fn refund(&self, key: &QuotaKey) -> Result<(), StoreError> {
        let now = (self.clock)();
        let mut inner = self.lock();
        if Self::live(&inner, &key.counter, now).is_some() {
            if let Some(e) = inner.entries.get_mut(&key.counter) {
                e.used = e.used.saturating_sub(1);
            }
        }
        Ok(())
    }

    async fn inspect(&self, key: &QuotaKey) -> Result<Option<Snapshot>, StoreError> {
        let now = (self.clock)();
        let inner = self.lock();
        Ok(Self::live(&inner, &key.counter, now).map(|e| Snapshot {
            used: e.used,
            ttl: u64::try_from(e.reset_at - now).ok(),
            first_seen: iso8601(e.first_seen),
        }))
    }

    async fn reset(&self, key: &QuotaKey) -> Result<u64, StoreError> {
        let now = (self.clock)();
        let mut inner = self.lock();
        let existed = Self::live(&inner, &key.counter, now).is_some();
        inner.entries.remove(&key.counter);
        // The counter and its first-seen key live and die together here.
        Ok(if existed { 2 } else { 0 })
    }

    async fn purge(&self, dry_run: bool) -> Result<u64, StoreError> {
        let now = (self.clock)();
        let mut inner = self.lock();
        let live = inner.entries.values().filter(|e| e.reset_at > now).count() as u64;
        if !dry_run {
            inner.entries.clear();
        }
        Ok(live * 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::{Hasher, Scope};
    use std::sync::atomic::{AtomicI64, Ordering};

    fn clocked(start: i64) -> (MemoryStore, Arc<AtomicI64>) {
        let t = Arc::new(AtomicI64::new(start));
        let c = t.clone();
        (
            MemoryStore::with_clock(Arc::new(move || c.load(Ordering::SeqCst))),
            t,
        )
    }

    fn key(n: u32) -> QuotaKey {
        QuotaKey::new(
            Scope::Ip,
            &Hasher::new(b"0123456789abcdef").digest(Scope::Ip, &n.to_string()),
        )
    }

    // 2026-11-30T10:00:00Z
    const T0: i64 = 1_796_032_800;
    const MIDNIGHT: i64 = 1_796_083_200;

    /// utc-day counters expire at the next 00:00 UTC and then start again at 1.
    #[tokio::test]
    async fn utc_day_expiry() {
        let (s, t) = clocked(T0);
        let k = key(1);
        let c = s.count(&k, ResetPolicy::UtcDay).await.unwrap();
        assert_eq!((c.used, c.reset_at), (1, MIDNIGHT));
        assert_eq!(s.count(&k, ResetPolicy::UtcDay).await.unwrap().used, 2);
        t.store(MIDNIGHT, Ordering::SeqCst);
        let c = s.count(&k, ResetPolicy::UtcDay).await.unwrap();
        assert_eq!((c.used, c.reset_at), (1, MIDNIGHT + 86_400));
    }

    /// rolling counters expire 24 h after the first scan, not after the last.
    #[tokio::test]
    async fn rolling_expiry() {
        let (s, t) = clocked(T0);
        let k = key(1);
        s.count(&k, ResetPolicy::Rolling).await.unwrap();
        t.store(T0 + 86_399, Ordering::SeqCst);
        let c = s.count(&k, ResetPolicy::Rolling).await.unwrap();
        assert_eq!((c.used, c.reset_at), (2, T0 + 86_400));
        t.store(T0 + 86_400, Ordering::SeqCst);
        assert_eq!(s.count(&k, ResetPolicy::Rolling).await.unwrap().used, 1);
    }

    /// Refund, inspect and reset behave like their Valkey twins.
    #[tokio::test]
    async fn refund_inspect_reset() {
        let (s, _) = clocked(T0);
        let k = key(1);
        for _ in 0..3 {
            s.count(&k, ResetPolicy::UtcDay).await.unwrap();
        }
        s.refund(&k).await.unwrap();
        let snap = s.inspect(&k).await.unwrap().unwrap();
        assert_eq!(snap.used, 2);
        assert_eq!(snap.ttl, Some((MIDNIGHT - T0) as u64));
        assert_eq!(snap.first_seen.as_deref(), Some("2026-11-30T10:00:00Z"));
        assert_eq!(s.reset(&k).await.unwrap(), 2);
        assert_eq!(s.inspect(&k).await.unwrap(), None);
        // Refunding a counter that is gone must not create one.
        s.refund(&k).await.unwrap();
        assert_eq!(s.inspect(&k).await.unwrap(), None);
    }

    /// Memory stays bounded: expired subjects are swept as new ones arrive.
    #[tokio::test]
    async fn sweeps_expired() {
        let (s, t) = clocked(T0);
        for n in 0..10_000 {
            s.count(&key(n), ResetPolicy::UtcDay).await.unwrap();
        }
        t.store(MIDNIGHT + 1, Ordering::SeqCst);
        for n in 10_000..30_000 {
            s.count(&key(n), ResetPolicy::UtcDay).await.unwrap();
        }
        assert!(s.len() <= 20_000 + MIN_SWEEP_LEN, "len {}", s.len());
    }

    /// At 00:00 UTC yesterday's subjects go with the first count, not when the map next doubles.
    #[tokio::test]
    async fn sweeps_at_expiry() {
        let (s, t) = clocked(T0);
        for n in 0..5_000 {
            s.count(&key(n), ResetPolicy::UtcDay).await.unwrap();
        }
        assert_eq!(s.len(), 5_000);
        t.store(MIDNIGHT, Ordering::SeqCst);
        assert_eq!(s.count(&key(9), ResetPolicy::UtcDay).await.unwrap().used, 1);
        assert_eq!(s.len(), 1);
    }
}
