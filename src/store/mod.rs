//! Step 4: counting, behind one narrow trait.
//!
//! A [`QuotaStore`] serves the request path: it counts a scan (plain
//! commands, one round trip), paces an over-quota scan, keeps the
//! idempotency record of a keyed scan, and takes a count back.
//! [`valkey::ValkeyStore`] does it on Valkey (standalone or cluster);
//! [`memory::MemoryStore`] has the same semantics in process, for the local
//! default and unit tests.
//!
//! Key layout (the braces are hash tags: every key of a subject lives in one
//! cluster slot, which ElastiCache Serverless requires of a multi-key call):
//!
//! | key | value | expiry |
//! |---|---|---|
//! | `quota:<scope>:{<digest>}` | scans counted this period | next 00:00 UTC, or 24 h after the first scan |
//! | `quota:<scope>:{<digest>}:ts` | first scan, ISO 8601 | the counter's |
//! | `quota:<scope>:{<digest>}:slot` | when the last paced scan may start (unix ms) | the counter's |
//! | `quota:<scope>:{<digest>}:grant` | extra scans support granted this period (`quota-gate grant`) | the counter's |
//! | `quota:<scope>:{<digest>}:idem:<sha-256 of the key>` | one `Idempotency-Key`'s record (a hash) | 24 h after the first request |

pub mod memory;
pub mod valkey;

use std::future::Future;

use sha2::{Digest as _, Sha256};
use uuid::Uuid;

use crate::digest::{Digest, Scope};

/// The pattern matching every key the gate writes.
pub const KEY_PATTERN: &str = "quota:*";

/// How long an idempotency record answers repeats of its key.
pub const IDEMPOTENCY_TTL_SECS: i64 = 86_400;

/// The keys of one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKey {
    pub counter: String,
    pub first_seen: String,
    pub slot: String,
    /// Extra scans granted for the period: read with every count, in the
    /// same round trip, and added to the limit the scan is decided against.
    pub grant: String,
}

impl QuotaKey {
    pub fn new(scope: Scope, digest: &Digest) -> Self {
        let counter = format!("quota:{scope}:{{{digest}}}");
        Self {
            first_seen: format!("{counter}:ts"),
            slot: format!("{counter}:slot"),
            grant: format!("{counter}:grant"),
            counter,
        }
    }

    /// The record key of one `Idempotency-Key`: a digest of the client's
    /// key (which may be anything visible), beside the subject's counter.
    pub fn idempotency(&self, client_key: &str) -> String {
        let hash = Sha256::digest(client_key.as_bytes());
        format!("{}:idem:{}", self.counter, hex::encode(&hash[..16]))
    }

    /// A `SCAN MATCH` pattern for every key of the subject.
    pub fn pattern(&self) -> String {
        format!("{}*", self.counter)
    }
}

/// The result of one increment. Instants in unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// The count after this increment (1 for the first scan of the period).
    pub used: u64,
    /// When the counter expires, as the store holds it.
    pub reset_at: i64,
    /// The gate's clock when it counted.
    pub now: i64,
    /// Extra scans granted for this period (0: none), read in the same round trip.
    pub grant: u64,
}

impl Count {
    pub fn seconds_to_reset(&self) -> u64 {
        u64::try_from(self.reset_at - self.now).unwrap_or(0)
    }
}

/// What `GET /quota` reads of a subject, in one round trip, changing nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peek {
    /// Scans counted this period (0: no counter yet).
    pub used: u64,
    /// When the counter expires (unix s); `None` without a counter (or one
    /// that never expires).
    pub reset_at: Option<i64>,
    /// The subject's pacing slot (unix ms), if one was taken.
    pub slot_ms: Option<i64>,
    /// Extra scans granted for this period.
    pub grant: u64,
}

/// When a new counter expires: the next 00:00 UTC after `now`, or 24 h on.
pub fn period_end(reset: crate::config::ResetPolicy, now: i64) -> i64 {
    match reset {
        crate::config::ResetPolicy::Rolling => now + 86_400,
        crate::config::ResetPolicy::UtcDay => now - now.rem_euclid(86_400) + 86_400,
    }
}

/// One count request: which subject, and the expiry a new counter gets.
#[derive(Debug, Clone, Copy)]
pub struct CountArgs<'a> {
    pub key: &'a QuotaKey,
    /// The expiry a counter without one gets (`EXPIREAT … NX`).
    pub period_end: i64,
    /// Unix seconds.
    pub now: i64,
}

/// What a keyed request leaves in its record before it is counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    /// The record's key ([`QuotaKey::idempotency`]).
    pub record: String,
    pub scan_id: Uuid,
    /// SHA-256 of the request body, hex: the same key with another body is refused.
    pub fingerprint: String,
    /// Unix ms when the gate received the request.
    pub received_ms: i64,
    /// Unix ms until which the first request may still be in flight.
    pub lease_until_ms: i64,
}

impl Claim {
    /// The fields that make a record of this claim on their own (state
    /// `pending`, not counted, lease free): written when the claim itself
    /// never reached the store, so a retry finds the scan's identity.
    pub fn uncounted(&self) -> Vec<Field> {
        vec![
            (RecordField::State, RecordState::Pending.name().to_owned()),
            (RecordField::ScanId, self.scan_id.to_string()),
            (RecordField::Fingerprint, self.fingerprint.clone()),
            (RecordField::Received, self.received_ms.to_string()),
            (RecordField::Until, "0".to_owned()),
            (RecordField::Count, "0".to_owned()),
        ]
    }
}

/// Declares the fields of an idempotency record once: the enum, its names as
/// stored, and the list of all of them. The Lua scripts spell the same names
/// (a test reads them and checks).
macro_rules! record_fields {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)+) => {
        /// One field of an idempotency record (a Valkey hash).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum RecordField {
            $($(#[$doc])* $variant,)+
        }

        impl RecordField {
            pub const ALL: &[Self] = &[$(Self::$variant),+];

            /// The hash field's name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)+
                }
            }

            pub fn parse(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(Self::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

record_fields! {
    /// [`RecordState`].
    State = "state",
    /// The scan's UUID: every job of the key carries it.
    ScanId = "scanId",
    /// SHA-256 of the body, hex.
    Fingerprint = "fp",
    /// Unix ms when the first request arrived.
    Received = "received",
    /// Unix ms until which an attempt holds the key (0: free to take over).
    Until = "until",
    /// The count the claim got (0: not counted).
    Count = "count",
    /// The counter's expiry (unix s) the claim saw.
    ResetAt = "resetAt",
    /// The paced delay (ms), once pacing decided it.
    DelayMs = "delayMs",
    /// The saved answer (JSON), once done.
    Response = "response",
}

/// Where a keyed scan stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecordState {
    /// An attempt holds it (or gave up on it without knowing its outcome).
    #[default]
    Pending,
    /// The job is queued and the answer saved.
    Done,
}

impl RecordState {
    pub const ALL: &[Self] = &[Self::Pending, Self::Done];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Done => "done",
        }
    }
}

/// An idempotency record as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub state: RecordState,
    pub scan_id: Uuid,
    pub fingerprint: String,
    pub received_ms: i64,
    pub lease_until_ms: i64,
    /// The count the first request got (0 when it was not counted).
    pub count: u64,
    /// The counter's expiry the first request saw.
    pub reset_at: i64,
    /// The paced delay, once pacing decided it.
    pub delay_ms: Option<u64>,
    /// The saved answer (JSON), once `done`.
    pub response: Option<String>,
}

impl Record {
    /// The record a claim writes, counted `count` with the counter expiring
    /// at `reset_at`.
    pub fn claimed(claim: &Claim, count: u64, reset_at: i64) -> Self {
        Self {
            state: RecordState::Pending,
            scan_id: claim.scan_id,
            fingerprint: claim.fingerprint.clone(),
            received_ms: claim.received_ms,
            lease_until_ms: claim.lease_until_ms,
            count,
            reset_at,
            delay_ms: None,
            response: None,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == RecordState::Done
    }

    /// Builds a record from a hash's field/value pairs. A record without a
    /// valid `scanId` or state is an error, never a fresh identity: every
    /// job of a key must carry the one it was given.
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, StoreError> {
        let mut text: [Option<&str>; RecordField::ALL.len()] = Default::default();
        for (name, value) in pairs {
            if let Some(field) = RecordField::parse(name) {
                text[field as usize] = Some(value);
            }
        }
        let get = |f: RecordField| text[f as usize];
        let int = |f: RecordField| get(f).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        let bad = |what: &str| StoreError::Backend(format!("idempotency record: {what}"));
        let state = match get(RecordField::State) {
            Some(s) if s == RecordState::Done.name() => RecordState::Done,
            Some(s) if s == RecordState::Pending.name() => RecordState::Pending,
            _ => return Err(bad("no valid state")),
        };
        let scan_id = get(RecordField::ScanId)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad("no valid scanId"))?;
        Ok(Self {
            state,
            scan_id,
            fingerprint: get(RecordField::Fingerprint).unwrap_or_default().to_owned(),
            received_ms: int(RecordField::Received),
            lease_until_ms: int(RecordField::Until),
            count: u64::try_from(int(RecordField::Count)).unwrap_or(0),
            reset_at: int(RecordField::ResetAt),
            delay_ms: get(RecordField::DelayMs).and_then(|v| v.parse().ok()),
            response: get(RecordField::Response).map(str::to_owned),
        })
    }

    /// Sets fields as [`QuotaStore::update_record`] writes them.
    pub fn apply(&mut self, fields: &[Field]) {
        for (field, value) in fields {
            let int = || value.parse::<i64>().unwrap_or(0);
            match field {
                RecordField::State => {
                    self.state = if value == RecordState::Done.name() {
                        RecordState::Done
                    } else {
                        RecordState::Pending
                    }
                }
                RecordField::ScanId => {
                    if let Ok(id) = value.parse() {
                        self.scan_id = id;
                    }
                }
                RecordField::Fingerprint => self.fingerprint.clone_from(value),
                RecordField::Received => self.received_ms = int(),
                RecordField::Until => self.lease_until_ms = int(),
                RecordField::Count => self.count = u64::try_from(int()).unwrap_or(0),
                RecordField::ResetAt => self.reset_at = int(),
                RecordField::DelayMs => self.delay_ms = value.parse().ok(),
                RecordField::Response => self.response = Some(value.clone()),
            }
        }
    }
}

/// One field of a record and its value, as [`QuotaStore::update_record`] sets it.
pub type Field = (RecordField, String);

/// The answer to a keyed count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// The key is new: the record is written and the scan counted.
    New(Count),
    /// The key was seen before: nothing counted; here is its record.
    Existing(Record),
}

/// One pacing step: `slot = max(arrival, previous slot) + delay`.
#[derive(Debug, Clone, Copy)]
pub struct PaceArgs<'a> {
    pub key: &'a QuotaKey,
    /// The record of a keyed scan, to note its delay in.
    pub record: Option<&'a str>,
    /// Unix ms when the scan arrived.
    pub arrival_ms: i64,
    /// The tier's delay.
    pub delay_ms: u64,
    /// The longest delay that may be given (`QUOTA_MAX_BACKLOG_MS`).
    pub max_backlog_ms: u64,
    /// The counter's expiry (unix s): the slot key expires with it.
    pub reset_at: i64,
}

/// One refund: a count of the period that ends at `period_end` (unix s),
/// and a keyed scan's record if it still names `scan_id`.
#[derive(Debug, Clone, Copy)]
pub struct Refund<'a> {
    pub key: &'a QuotaKey,
    pub period_end: i64,
    /// The record's key and the scanId it must still name.
    pub record: Option<(&'a str, Uuid)>,
    /// Unix s (the in-memory store's clock; Valkey uses its own).
    pub now: i64,
}

/// The answer to one pacing step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paced {
    /// The scan may start `delay_ms` after its arrival; the slot moved on.
    Slot { delay_ms: u64 },
    /// The delay would exceed the cap: nothing changed (the caller takes the
    /// count back, see [`QuotaStore::pace`]); a slot within the cap frees up
    /// in `retry_after_ms`.
    Full { retry_after_ms: u64 },
}

/// The pacing rule, as a pure function: the start of a scan arriving at
/// `arrival_ms` whose tier delays it `delay_ms`, after the subject's
/// previous slot. Returns the new slot, or `Err(retry_after_ms)` when the
/// delay would exceed `max_backlog_ms` (or the tier's own delay, if that is
/// longer: a scan with nothing ahead of it always gets its slot).
pub fn next_slot(
    previous: i64,
    arrival_ms: i64,
    delay_ms: u64,
    max_backlog_ms: u64,
) -> Result<i64, u64> {
    let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
    let start = previous.max(arrival_ms).saturating_add(delay);
    let wait = u64::try_from(start - arrival_ms).unwrap_or(0);
    // A scan with nothing queued ahead of it is never refused: the cap bounds
    // the pile-up, not a tier delay configured longer than the cap.
    let cap = max_backlog_ms.max(delay_ms);
    if wait > cap {
        // The first arrival at which this delay fits the cap.
        Err(wait - cap)
    } else {
        Ok(start)
    }
}

/// Why the store could not answer. The first two did not happen; only
/// [`Unanswered`](Self::Unanswered) may still run.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Never sent (no live connection within the timeout, a failed connect).
    #[error("the quota store is unreachable: {0}")]
    NotSent(String),
    /// Skipped by the open breaker: never sent.
    #[error("the quota store is being skipped after repeated failures")]
    CircuitOpen,
    /// Sent, but no answer in time: the command may still run.
    #[error("the quota store did not answer in time")]
    Unanswered,
    /// The store answered with an error: final.
    #[error("quota store error: {0}")]
    Backend(String),
}

impl StoreError {
    /// Whether the command may still run later.
    pub fn may_land(&self) -> bool {
        matches!(self, Self::Unanswered)
    }
}

/// For the operator tools' direct commands (off the request path, where
/// nothing is settled after a failure).
impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            Self::Unanswered
        } else {
            Self::Backend(e.to_string())
        }
    }
}

impl From<crate::connection::SendError> for StoreError {
    fn from(e: crate::connection::SendError) -> Self {
        use crate::connection::SendError;
        match e {
            SendError::NotSent(why) => Self::NotSent(why),
            SendError::Unanswered => Self::Unanswered,
            SendError::Refused(why) => Self::Backend(why),
        }
    }
}

/// The request path's store.
pub trait QuotaStore: Send + Sync + 'static {
    /// Starts connecting in the background, on the current runtime, so the
    /// first request finds a connection. A no-op for stores without one.
    fn warm_up(&self) {}

    /// INCR the counter, give it `period_end` if it has no expiry, write the
    /// first-seen key if missing, and read the counter's expiry back.
    fn count(&self, args: CountArgs<'_>) -> impl Future<Output = Result<Count, StoreError>> + Send;

    /// Reads the counter, its expiry, the pacing slot and the grant in one
    /// round trip, writing nothing (`GET /quota`). `now` is unix s. The
    /// default (for test wrappers that never serve `GET /quota`) answers
    /// that it cannot read, which the gate turns into a 503, never a guess.
    fn peek(
        &self,
        key: &QuotaKey,
        now: i64,
    ) -> impl Future<Output = Result<Peek, StoreError>> + Send {
        let _ = (key, now);
        async { Err(StoreError::Backend("this store cannot be read".into())) }
    }

    /// For a keyed scan: if `claim.record` exists, return it and count
    /// nothing; else write it (`pending`) and count, atomically.
    fn count_keyed(
        &self,
        args: CountArgs<'_>,
        claim: &Claim,
    ) -> impl Future<Output = Result<Claimed, StoreError>> + Send;

    /// One pacing step ([`next_slot`]). `Full` changes nothing: the caller
    /// refunds the count with its next call. A refund inside the step would
    /// be wrong when the caller timed out waiting for it and accepted the
    /// scan anyway (a late step would then uncount a queued scan).
    fn pace(&self, args: PaceArgs<'_>) -> impl Future<Output = Result<Paced, StoreError>> + Send;

    /// Takes back one count of its period (a no-op if the counter is gone or
    /// belongs to a later period), and removes the record if it still names
    /// the scan.
    fn refund(&self, refund: Refund<'_>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Frees a pending record's lease (if a pending record still names
    /// `scan_id`), so a retry need not wait for it: its attempt gave up
    /// without knowing the outcome. A claim that found another attempt's
    /// record frees nothing: that attempt may still be running (the
    /// simulator found a retry taking over a live attempt's scan).
    /// `now` is unix s, as in every call: the in-memory store's clock.
    fn release(
        &self,
        record: &str,
        scan_id: Uuid,
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Updates a record: `fields` are set, and the record gets its 24 h
    /// expiry if it has none (a record written here first, because the
    /// claim has not landed yet, still expires).
    fn update_record(
        &self,
        record: &str,
        fields: &[Field],
        now: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes over a `pending` record whose lease ran out: sets the lease to
    /// `until` (unix ms) if the record still holds the `seen` one. `false`
    /// when another request took it first.
    fn take_over(
        &self,
        record: &str,
        seen: i64,
        until: i64,
        now: i64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// The store chosen by `VALKEY_URL`.
#[derive(Clone)]
pub enum AnyStore {
    Memory(memory::MemoryStore),
    Valkey(valkey::ValkeyStore),
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            Self::Memory($s) => $call.await,
            Self::Valkey($s) => $call.await,
        }
    };
}

impl QuotaStore for AnyStore {
    fn warm_up(&self) {
        match self {
            Self::Memory(s) => s.warm_up(),
            Self::Valkey(s) => s.warm_up(),
        }
    }

    async fn count(&self, args: CountArgs<'_>) -> Result<Count, StoreError> {
        dispatch!(self, s => s.count(args))
    }

    async fn count_keyed(&self, args: CountArgs<'_>, claim: &Claim) -> Result<Claimed, StoreError> {
        dispatch!(self, s => s.count_keyed(args, claim))
    }

    async fn peek(&self, key: &QuotaKey, now: i64) -> Result<Peek, StoreError> {
        dispatch!(self, s => s.peek(key, now))
    }

    async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, StoreError> {
        dispatch!(self, s => s.pace(args))
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        dispatch!(self, s => s.refund(refund))
    }

    async fn release(&self, record: &str, scan_id: Uuid, now: i64) -> Result<(), StoreError> {
        dispatch!(self, s => s.release(record, scan_id, now))
    }

    async fn update_record(
        &self,
        record: &str,
        fields: &[Field],
        now: i64,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.update_record(record, fields, now))
    }

    async fn take_over(
        &self,
        record: &str,
        seen: i64,
        until: i64,
        now: i64,
    ) -> Result<bool, StoreError> {
        dispatch!(self, s => s.take_over(record, seen, until, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Hasher;
    use proptest::prelude::*;

    /// Keys follow the spec's layout, with the digest as the hash tag.
    #[test]
    fn key_layout() {
        let d = Hasher::new(b"0123456789abcdef").digest(Scope::Ip, "203.0.113.7");
        let k = QuotaKey::new(Scope::Ip, &d);
        assert_eq!(k.counter, format!("quota:ip:{{{d}}}"));
        assert_eq!(k.first_seen, format!("quota:ip:{{{d}}}:ts"));
        assert_eq!(k.slot, format!("quota:ip:{{{d}}}:slot"));
        assert_eq!(k.grant, format!("quota:ip:{{{d}}}:grant"));
        assert!(
            k.grant
                .starts_with(&k.pattern().trim_end_matches('*').to_owned())
        );
        let idem = k.idempotency("retry-1");
        assert!(idem.starts_with(&format!("quota:ip:{{{d}}}:idem:")));
        assert_eq!(idem.len(), k.counter.len() + 6 + 32);
        assert_ne!(idem, k.idempotency("retry-2"));
        let k = QuotaKey::new(Scope::Tid, &d);
        assert!(k.counter.starts_with("quota:tid:{"));
    }

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
