//! Step 4: counting, behind one narrow trait.
//!
//! A [`QuotaStore`] increments a subject's counter and reports the count and
//! when it resets, in one atomic step. [`valkey::ValkeyStore`] runs the
//! `count.lua` script on Valkey (standalone or cluster); [`memory::MemoryStore`]
//! has the same semantics in process, for the local default and unit tests.
//!
//! Key layout (the braces are hash tags: both keys of a subject live in one
//! cluster slot, which a multi-key script on ElastiCache Serverless requires):
//!
//! | key | value | expiry |
//! |---|---|---|
//! | `quota:ip:{<digest>}` | scans counted today | next 00:00 UTC, or 24 h after the first scan |
//! | `quota:ip:{<digest>}:ts` | first scan, ISO 8601 | same |
//! | `quota:tid:{<digest>}` / `quota:tid:{<digest>}:ts` | the same for token holders | same |

pub mod memory;
pub mod valkey;

use std::future::Future;

use crate::config::ResetPolicy;
use crate::digest::{Digest, Scope};

/// The pattern matching every key the gate writes.
pub const KEY_PATTERN: &str = "quota:*";

/// The two keys of one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKey {
    pub counter: String,
    pub first_seen: String,
}

impl QuotaKey {
    pub fn new(scope: Scope, digest: &Digest) -> Self {
        let counter = format!("quota:{scope}:{{{digest}}}");
        let first_seen = format!("{counter}:ts");
        Self {
            counter,
            first_seen,
        }
    }
}

/// The result of one increment, instants in unix seconds by the store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// The count after this increment (1 for the first scan of the day).
    pub used: u64,
    /// When the counter expires.
    pub reset_at: i64,
    /// The store's clock when it counted.
    pub now: i64,
}

impl Count {
    pub fn seconds_to_reset(&self) -> u64 {
        u64::try_from(self.reset_at - self.now).unwrap_or(0)
    }
}

/// What an operator sees of one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub used: u64,
    /// Seconds until the counter expires; `None` if it has no expiry.
    pub ttl: Option<u64>,
    /// The first scan of the period, ISO 8601.
    pub first_seen: Option<String>,
}

/// Why the store could not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("the quota store did not answer in time")]
    Timeout,
    #[error("the quota store is being skipped after repeated failures")]
    CircuitOpen,
    #[error("quota store error: {0}")]
    Backend(String),
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            Self::Timeout
        } else {
            Self::Backend(e.to_string())
        }
    }
}

/// A counter store with the semantics of `count.lua`.
pub trait QuotaStore: Send + Sync + 'static {
    /// Increments the counter, setting the expiry and first-seen key if missing.
    fn count(
        &self,
        key: &QuotaKey,
        reset: ResetPolicy,
    ) -> impl Future<Output = Result<Count, StoreError>> + Send;

    /// Takes back one count (after a failed enqueue); a no-op if the counter is gone.
    fn refund(&self, key: &QuotaKey) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads a subject's counter without changing it.
    fn inspect(
        &self,
        key: &QuotaKey,
    ) -> impl Future<Output = Result<Option<Snapshot>, StoreError>> + Send;

    /// Removes a subject's keys; returns how many existed.
    fn reset(&self, key: &QuotaKey) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Removes every `quota:*` key (or only counts them when `dry_run`); returns how many.
    fn purge(&self, dry_run: bool) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// The store chosen by `VALKEY_URL`.
#[derive(Clone)]
pub enum AnyStore {
    Memory(memory::MemoryStore),
    Valkey(valkey::ValkeyStore),
}

impl QuotaStore for AnyStore {
    async fn count(&self, key: &QuotaKey, reset: ResetPolicy) -> Result<Count, StoreError> {
        match self {
            Self::Memory(s) => s.count(key, reset).await,
            Self::Valkey(s) => s.count(key, reset).await,
        }
    }

    async fn refund(&self, key: &QuotaKey) -> Result<(), StoreError> {
        match self {
            Self::Memory(s) => s.refund(key).await,
            Self::Valkey(s) => s.refund(key).await,
        }
    }

    async fn inspect(&self, key: &QuotaKey) -> Result<Option<Snapshot>, StoreError> {
        match self {
            Self::Memory(s) => s.inspect(key).await,
            Self::Valkey(s) => s.inspect(key).await,
        }
    }

    async fn reset(&self, key: &QuotaKey) -> Result<u64, StoreError> {
        match self {
            Self::Memory(s) => s.reset(key).await,
            Self::Valkey(s) => s.reset(key).await,
        }
    }

    async fn purge(&self, dry_run: bool) -> Result<u64, StoreError> {
        match self {
            Self::Memory(s) => s.purge(dry_run).await,
            Self::Valkey(s) => s.purge(dry_run).await,
        }
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
        let k = QuotaKey::new(Scope::Tid, &d);
        assert!(k.counter.starts_with("quota:tid:{"));
    }
}
