//! The Valkey quota store: `count.lua` through EVALSHA (falling back to EVAL
//! once after a server restart flushed the script cache).
//!
//! Both keys of a subject share a hash tag, so the script is routed to one
//! slot in cluster mode and a CROSSSLOT error cannot happen.

use redis::{AsyncCommands, Script};

use super::{Count, KEY_PATTERN, QuotaKey, QuotaStore, Snapshot, StoreError};
use crate::config::ResetPolicy;
use crate::valkey::{Connection, Valkey};

/// Keys removed per UNLINK in a purge.
const PURGE_BATCH: usize = 500;

/// A quota store on Valkey.
#[derive(Clone)]
pub struct ValkeyStore {
    valkey: Valkey,
    count: Script,
    refund: Script,
}

impl ValkeyStore {
    pub fn new(valkey: Valkey) -> Self {
        Self {
            valkey,
            count: Script::new(include_str!("count.lua")),
            refund: Script::new(include_str!("refund.lua")),
        }
    }

    pub fn valkey(&self) -> &Valkey {
        &self.valkey
    }

    async fn connection(&self) -> Result<Connection, StoreError> {
        Ok(self.valkey.connection().await?)
    }
}

impl QuotaStore for ValkeyStore {
    async fn count(&self, key: &QuotaKey, reset: ResetPolicy) -> Result<Count, StoreError> {
        let mut conn = self.connection().await?;
        let (used, reset_at, now): (u64, i64, i64) = self
            .count
            .key(&key.counter)
            .key(&key.first_seen)
            .arg(reset.as_str())
            .invoke_async(&mut conn)
            .await?;
        Ok(Count {
            used,
            reset_at,
            now,
        })
    }

    async fn refund(&self, key: &QuotaKey) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        let _: i64 = self
            .refund
            .key(&key.counter)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn inspect(&self, key: &QuotaKey) -> Result<Option<Snapshot>, StoreError> {
        let mut conn = self.connection().await?;
        let (used, ttl, first_seen): (Option<u64>, i64, Option<String>) = redis::pipe()
            .get(&key.counter)
            .ttl(&key.counter)
            .get(&key.first_seen)
            .query_async(&mut conn)
            .await?;
        Ok(used.map(|used| Snapshot {
            used,
            ttl: u64::try_from(ttl).ok(),
            first_seen,
        }))
    }

    async fn reset(&self, key: &QuotaKey) -> Result<u64, StoreError> {
        let mut conn = self.connection().await?;
        Ok(conn.del(&[&key.counter, &key.first_seen]).await?)
    }

    async fn purge(&self, dry_run: bool) -> Result<u64, StoreError> {
        if self.valkey.is_cluster() {
            return Err(StoreError::Backend(
                "purge: cluster mode needs per-primary scans".into(),
            ));
        }
        let mut conn = self.connection().await?;
        purge_node(&mut conn, dry_run).await
    }
}

/// `SCAN MATCH quota:*` over one node, unlinking in batches.
pub async fn purge_node(conn: &mut Connection, dry_run: bool) -> Result<u64, StoreError> {
    let mut cursor: u64 = 0;
    let mut removed = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(KEY_PATTERN)
            .arg("COUNT")
            .arg(PURGE_BATCH)
            .query_async(conn)
            .await?;
        if !keys.is_empty() {
            removed += if dry_run {
                keys.len() as u64
            } else {
                redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async::<u64>(conn)
                    .await?
            };
        }
        if next == 0 {
            return Ok(removed);
        }
        cursor = next;
    }
}
