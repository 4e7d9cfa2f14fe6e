//! Step 4: counting, behind one narrow trait.
//!
//! A [`QuotaStore`] serves the request path: it counts a scan (plain
//! commands, one round trip), paces an over-quota scan, keeps the
//! idempotency record of a keyed scan, and takes a count back.
//! [`valkey::ValkeyStore`] does it on Valkey (standalone or cluster);
//! [`memory::MemoryStore`] has the same semantics in process, for the local
//! default and unit tests.
//!
//! What the store keeps and answers is defined below it, with no I/O: the
//! idempotency record and the count in [`crate::record`], the pacing rule
//! in [`crate::pace`]; both are re-exported here.
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
pub use crate::pace::{Paced, next_slot};
pub use crate::record::{
    Claim, Claimed, Count, Field, Peek, Record, RecordError, RecordField, RecordState,
};

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

/// A hash that is not a valid record is the store's answer, and final.
impl From<RecordError> for StoreError {
    fn from(e: RecordError) -> Self {
        Self::Backend(e.to_string())
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
}
