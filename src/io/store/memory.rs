//! The embedded store: the Valkey store's semantics in process, the default without `VALKEY_URL`.
//! Entries expire exactly as in Valkey, by the `now` each call brings. Expired entries are swept
//! when the map doubles since the last sweep (O(1) amortised) and, at most once a minute, once the
//! earliest entry has expired (so a period's subjects go when it ends); capacity is given back
//! after a mass expiry. A std `Mutex` fits: it is never held across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use uuid::Uuid;

use crate::config::ResetPolicy;
use crate::rules::unix::{UnixMillis, UnixSecs};

use super::quota_store::{
    CountArgs, CountFailed, PaceArgs, QuotaStore, RecordUpdate, Refund, SendError, TakeOver,
};
use crate::rules::count::{Count, Peek, Tally};
use crate::rules::delay::{LoneSleepAsk, SleepLease, take_sleep_lease};
use crate::rules::key::{IDEMPOTENCY_TTL_SECS, QuotaKey};
use crate::rules::pace::{Paced, line_excess, next_start};
use crate::rules::record::{Claim, Claimed, Record, RecordState};

const MIN_SWEEP_LEN: usize = 1024;

/// Whether an entry expiring at `expires` (`None`: not yet set) lives at `now`.
fn live_until(expires: Option<UnixSecs>, now: UnixSecs) -> bool {
    expires.is_none_or(|at| at > now)
}

/// The least time between expiry-triggered sweeps: under `rolling` something expires each second.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// How long a record lives ([`IDEMPOTENCY_TTL_SECS`]).
const RECORD_TTL: Duration = Duration::from_secs(IDEMPOTENCY_TTL_SECS.unsigned_abs());

#[derive(Debug, Clone, Copy)]
struct Entry {
    used: u64,
    reset_at: UnixSecs,
    /// The pacing slot; 0 until a scan is paced.
    slot_ms: UnixMillis,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Idempotency records and when they expire.
    records: HashMap<String, (Record, UnixSecs)>,
    /// Grants by grant key and their expiry (`None` until the period's first scan gives one).
    grants: HashMap<String, (u64, Option<UnixSecs>)>,
    /// The sleep leases ([`take_sleep_lease`]): when each ends.
    sleep_leases: Vec<UnixMillis>,
    /// The map's length that triggers a sweep (0 at first: the first count sweeps and sets it).
    sweep_at_len: usize,
    /// No entry expires before this (exact after a sweep, lowered on insert).
    earliest_reset: UnixSecs,
    last_sweep: UnixSecs,
}

impl Inner {
    /// Drops expired entries and returns spare capacity after a mass expiry.
    fn sweep(&mut self, now: UnixSecs) {
        self.entries.retain(|_, e| e.reset_at > now);
        self.records.retain(|_, (_, expires)| *expires > now);
        self.grants
            .retain(|_, (_, expires)| live_until(*expires, now));
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
            .unwrap_or(UnixSecs(i64::MAX));
        self.last_sweep = now;
    }

    fn live(&mut self, key: &str, now: UnixSecs) -> Option<&mut Entry> {
        self.entries.get_mut(key).filter(|e| e.reset_at > now)
    }

    fn record(&mut self, key: &str, now: UnixSecs) -> Option<&mut Record> {
        let (record, expires) = self.records.get_mut(key)?;
        (*expires > now).then_some(record)
    }

    fn tally(&mut self, args: CountArgs<'_>) -> Tally {
        let levels = args.levels.iter();
        Tally {
            subject: self.count(args.key, args.period_end, args.now),
            levels: levels
                .map(|level| Ok(self.count(&level.key, args.period_end, args.now)))
                .collect(),
        }
    }

    fn count(&mut self, key: &QuotaKey, period_end: UnixSecs, now: UnixSecs) -> Count {
        let entry = match self.entries.get_mut(&key.counter) {
            // The common case: no key copy, no second lookup.
            Some(e) if e.reset_at > now => {
                e.used += 1;
                *e
            }
            _ => {
                let e = Entry {
                    used: 1,
                    reset_at: period_end,
                    slot_ms: UnixMillis(0),
                };
                self.entries.insert(key.counter.clone(), e);
                self.earliest_reset = self.earliest_reset.min(e.reset_at);
                e
            }
        };
        let expired =
            now >= self.earliest_reset && now >= self.last_sweep.saturating_add(SWEEP_INTERVAL);
        if self.entries.len() >= self.sweep_at_len || expired {
            self.sweep(now);
        }
        // As the Valkey pipeline's `EXPIREAT …:grant … NX`.
        if let Some((_, expires @ None)) = self.grants.get_mut(&key.grant) {
            *expires = Some(entry.reset_at);
        }
        Count {
            used: entry.used,
            reset_at: entry.reset_at,
            now,
            grant: self.grant(key, now),
        }
    }

    /// The live grant of a subject (0: none).
    fn grant(&self, key: &QuotaKey, now: UnixSecs) -> u64 {
        match self.grants.get(&key.grant) {
            Some((n, expires)) if live_until(*expires, now) => *n,
            _ => 0,
        }
    }

    /// As `refund.lua`: DECR of one period only; a counter back at 0 goes (grants live apart here).
    fn refund(&mut self, counter: &str, reset_at: UnixSecs, now: UnixSecs) {
        if let Some(e) = self.live(counter, now).filter(|e| e.reset_at <= reset_at) {
            e.used = e.used.saturating_sub(1);
            if e.used == 0 {
                self.entries.remove(counter);
            }
        }
    }
}

#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

impl MemoryStore {
    /// Live and not yet swept counters.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A subject's count at `now`, for the tests.
    #[cfg(any(test, feature = "testing"))]
    pub fn used(&self, key: &QuotaKey, now: UnixSecs) -> Option<u64> {
        self.lock().live(&key.counter, now).map(|e| e.used)
    }

    /// Grants `scans` extra scans for the period, as `quota-gate grant` does on Valkey (for tests).
    /// Returns the expiry: the counter's, or before the first scan the period's end if `reset`
    /// knows it ([`grant_period_end`](crate::rules::key::grant_period_end)), else `None`.
    pub fn grant(
        &self,
        key: &QuotaKey,
        scans: u64,
        now: UnixSecs,
        reset: ResetPolicy,
    ) -> Option<UnixSecs> {
        let mut inner = self.lock();
        let expires = inner
            .live(&key.counter, now)
            .map(|e| e.reset_at)
            .or_else(|| crate::rules::key::grant_period_end(reset, now));
        inner.grants.insert(key.grant.clone(), (scans, expires));
        expires
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave an entry half-written.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl QuotaStore for MemoryStore {
    async fn count(&self, args: CountArgs<'_>) -> Result<Tally, CountFailed> {
        Ok(self.lock().tally(args))
    }

    async fn peek(&self, key: &QuotaKey, now: UnixSecs) -> Result<Peek, SendError> {
        let mut inner = self.lock();
        let e = inner.live(&key.counter, now).copied();
        Ok(Peek {
            used: e.map_or(0, |e| e.used),
            reset_at: e.map(|e| e.reset_at),
            slot_ms: e.map(|e| e.slot_ms).filter(|s| s.get() > 0),
            grant: inner.grant(key, now),
        })
    }

    async fn count_keyed(
        &self,
        args: CountArgs<'_>,
        claim: &Claim,
    ) -> Result<Claimed, CountFailed> {
        let mut inner = self.lock();
        if let Some(record) = inner.record(&claim.record, args.now) {
            return Ok(Claimed::Existing(record.clone()));
        }
        let tally = inner.tally(args);
        let record = Record::claimed(claim, tally.subject.used, tally.subject.reset_at);
        inner.records.insert(
            claim.record.clone(),
            (record, args.now.saturating_add(RECORD_TTL)),
        );
        Ok(Claimed::New(tally))
    }

    async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, SendError> {
        let now = args.arrival_ms.secs();
        let mut inner = self.lock();
        let lines: Vec<(&str, u64)> = std::iter::once(args.subject())
            .chain(args.levels.iter().copied())
            .map(|l| (l.key.counter.as_str(), l.delay_ms))
            .collect();
        let previous = |e: Option<&mut Entry>| e.map_or(UnixMillis(0), |e| e.slot_ms);
        let slots: Vec<(UnixMillis, u64)> = (lines.iter())
            .map(|&(counter, delay)| (previous(inner.live(counter, now)), delay))
            .collect();
        match next_start(slots.iter().copied(), args.arrival_ms, args.max_backlog_ms) {
            Ok(slot) => {
                for (counter, _) in lines.iter().filter(|(_, delay)| *delay > 0) {
                    if let Some(e) = inner.live(counter, now) {
                        e.slot_ms = slot;
                    }
                }
                let delay_ms = u64::try_from(slot.get() - args.arrival_ms.get()).unwrap_or(0);
                if let Some(record) = args.record.and_then(|r| inner.record(r, now)) {
                    record.delay_ms = Some(delay_ms);
                }
                let sleep_leases = &mut inner.sleep_leases;
                let sleep_lease = (args.sleep_ask)
                    .map(|ask| take_sleep_lease(sleep_leases, &ask, args.arrival_ms, delay_ms));
                Ok(Paced::Slot {
                    delay_ms,
                    sleep_lease,
                })
            }
            Err(retry_after_ms) => Ok(Paced::Full {
                retry_after_ms,
                levels_ms: (slots[1..].iter())
                    .map(|&(previous, delay)| {
                        line_excess(previous, args.arrival_ms, delay, args.max_backlog_ms)
                    })
                    .collect(),
            }),
        }
    }

    async fn take_sleep_lease(&self, lone: LoneSleepAsk) -> Result<SleepLease, SendError> {
        Ok(take_sleep_lease(
            &mut self.lock().sleep_leases,
            &lone.ask,
            lone.arrival,
            lone.wait_ms,
        ))
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), SendError> {
        let now = refund.now;
        let mut inner = self.lock();
        // As refund.lua: a keyed refund is the claim's own, or nothing.
        if let Some((record, scan_id)) = refund.record {
            let counted = match inner.record(record, now) {
                Some(r) if r.scan_id == scan_id => r.count > 0,
                _ => return Ok(()),
            };
            inner.records.remove(record);
            if !counted {
                return Ok(());
            }
        }
        inner.refund(&refund.key.counter, refund.period_end, now);
        for (key, period_end) in refund.levels {
            inner.refund(&key.counter, *period_end, now);
        }
        Ok(())
    }

    async fn has_record(&self, record: &str, now: UnixSecs) -> Result<bool, SendError> {
        Ok(self.lock().record(record, now).is_some())
    }

    async fn release(&self, record: &str, scan_id: Uuid, now: UnixSecs) -> Result<(), SendError> {
        if let Some(r) = self.lock().record(record, now)
            && r.state == RecordState::Pending
            && r.scan_id == scan_id
        {
            r.lease_until_ms = UnixMillis(0);
        }
        Ok(())
    }

    async fn update_record(&self, update: RecordUpdate<'_>) -> Result<(), SendError> {
        let mut inner = self.lock();
        if let Some(r) = inner.record(update.record, update.now) {
            r.apply(update.fields);
        } else {
            // As Valkey's HSET: a record whose claim never landed is these fields alone.
            let mut r = Record::claimed(&Claim::default(), 0, UnixSecs(0));
            r.apply(update.fields);
            let expires = update.now.saturating_add(RECORD_TTL);
            inner.records.insert(update.record.to_owned(), (r, expires));
        }
        Ok(())
    }

    async fn take_over(&self, args: TakeOver<'_>) -> Result<bool, SendError> {
        if let Some(r) = self.lock().record(args.record, args.now)
            && r.state == RecordState::Pending
            && r.lease_until_ms == args.expected_until_ms
        {
            r.lease_until_ms = args.lease_until_ms;
            return Ok(true);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rules::digest::Hasher;
    use crate::rules::key::period_end;
    use crate::rules::scope::Scope;

    fn key(n: u32) -> QuotaKey {
        QuotaKey::new(
            Scope::Ip,
            &Hasher::new(b"0123456789abcdef").digest(Scope::Ip, &n.to_string()),
        )
    }

    // 2026-11-30T10:00:00Z
    const T0: i64 = 1_796_032_800;
    const MIDNIGHT: i64 = 1_796_083_200;

    async fn count(s: &MemoryStore, k: &QuotaKey, reset: ResetPolicy, now: i64) -> Count {
        let now = UnixSecs(now);
        s.count(CountArgs {
            key: k,
            levels: &[],
            period_end: period_end(reset, now),
            now,
            reset,
        })
        .await
        .unwrap()
        .subject
    }

    /// utc-day counters expire at the next 00:00 UTC and then start again at 1.
    #[tokio::test]
    async fn utc_day_expiry() {
        let s = MemoryStore::default();
        let k = key(1);
        let c = count(&s, &k, ResetPolicy::UtcDay, T0).await;
        assert_eq!((c.used, c.reset_at), (1, UnixSecs(MIDNIGHT)));
        assert_eq!(count(&s, &k, ResetPolicy::UtcDay, T0).await.used, 2);
        let c = count(&s, &k, ResetPolicy::UtcDay, MIDNIGHT).await;
        assert_eq!((c.used, c.reset_at), (1, UnixSecs(MIDNIGHT + 86_400)));
    }

    /// rolling counters expire 24 h after the first scan, not after the last.
    #[tokio::test]
    async fn rolling_expiry() {
        let s = MemoryStore::default();
        let k = key(1);
        count(&s, &k, ResetPolicy::Rolling, T0).await;
        let c = count(&s, &k, ResetPolicy::Rolling, T0 + 86_399).await;
        assert_eq!((c.used, c.reset_at), (2, UnixSecs(T0 + 86_400)));
        assert_eq!(
            count(&s, &k, ResetPolicy::Rolling, T0 + 86_400).await.used,
            1
        );
    }

    /// A refund takes back a count of its own period only.
    #[tokio::test]
    async fn refund_is_tied_to_its_period() {
        let s = MemoryStore::default();
        let k = key(1);
        let now = UnixSecs(T0);
        let first = count(&s, &k, ResetPolicy::UtcDay, T0).await;
        count(&s, &k, ResetPolicy::UtcDay, T0).await;
        let refund = |period_end| Refund {
            key: &k,
            levels: &[],
            period_end,
            record: None,
            now,
        };
        s.refund(refund(first.reset_at)).await.unwrap();
        assert_eq!(s.used(&k, now), Some(1));
        // A refund of yesterday's scan leaves today's counter alone.
        s.refund(refund(UnixSecs(first.reset_at.get() - 86_400)))
            .await
            .unwrap();
        assert_eq!(s.used(&k, now), Some(1));
    }

    /// Under `rolling`, a grant made before the first scan lives as long as
    /// the counter that scan opens, not 24 h from the grant: 24.5 h after
    /// the grant (the first scan 12 h in), it still counts; it goes with
    /// the counter. A grant made while the counter lives gets its expiry.
    #[tokio::test]
    async fn grant_follows_the_period_its_first_scan_opens() {
        let s = MemoryStore::default();
        let k = key(1);
        assert_eq!(s.grant(&k, 50, UnixSecs(T0), ResetPolicy::Rolling), None);
        let first = T0 + 12 * 3600;
        let c = count(&s, &k, ResetPolicy::Rolling, first).await;
        assert_eq!(
            (c.used, c.grant, c.reset_at),
            (1, 50, UnixSecs(first + 86_400))
        );
        let later = T0 + 24 * 3600 + 1800;
        let c = count(&s, &k, ResetPolicy::Rolling, later).await;
        assert_eq!(
            (c.used, c.grant),
            (2, 50),
            "the grant outlives 24 h from its issue"
        );
        let peek = s.peek(&k, UnixSecs(first + 86_399)).await.unwrap();
        assert_eq!(peek.grant, 50);
        // The period's end takes counter and grant together.
        let c = count(&s, &k, ResetPolicy::Rolling, first + 86_400).await;
        assert_eq!((c.used, c.grant), (1, 0));
        // Granted mid-period: the counter's expiry.
        let end = UnixSecs(first + 2 * 86_400);
        assert_eq!(
            s.grant(&k, 5, UnixSecs(first + 86_400), ResetPolicy::Rolling),
            Some(end)
        );
        assert_eq!(s.peek(&k, UnixSecs(end.get() - 1)).await.unwrap().grant, 5);
        assert_eq!(s.peek(&k, end).await.unwrap().grant, 0);
    }

    /// Memory stays bounded: expired subjects are swept as new ones arrive.
    #[tokio::test]
    async fn sweeps_expired() {
        let s = MemoryStore::default();
        for n in 0..10_000 {
            count(&s, &key(n), ResetPolicy::UtcDay, T0).await;
        }
        for n in 10_000..30_000 {
            count(&s, &key(n), ResetPolicy::UtcDay, MIDNIGHT + 1).await;
        }
        assert!(s.len() <= 20_000 + MIN_SWEEP_LEN, "len {}", s.len());
    }

    /// At 00:00 UTC yesterday's subjects go with the first count, not when the map next doubles.
    #[tokio::test]
    async fn sweeps_at_expiry() {
        let s = MemoryStore::default();
        for n in 0..5_000 {
            count(&s, &key(n), ResetPolicy::UtcDay, T0).await;
        }
        assert_eq!(s.len(), 5_000);
        assert_eq!(
            count(&s, &key(9), ResetPolicy::UtcDay, MIDNIGHT).await.used,
            1
        );
        assert_eq!(s.len(), 1);
    }
}
