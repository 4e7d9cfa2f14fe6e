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

/// Told how many keys each purge batch removed (or matched, in a dry run),
/// so `quota-gate purge` can show progress on a long run.
pub type PurgeProgress = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// A quota store on Valkey.
#[derive(Clone)]
pub struct ValkeyStore {
    valkey: Valkey,
    count: Script,
    refund: Script,
    progress: Option<PurgeProgress>,
}

impl ValkeyStore {
    pub fn new(valkey: Valkey) -> Self {
        Self {
            valkey,
            count: Script::new(include_str!("count.lua")),
            refund: Script::new(include_str!("refund.lua")),
            progress: None,
        }
    }

    /// Reports purge batches to `progress` (the request path never purges).
    pub fn with_purge_progress(mut self, progress: PurgeProgress) -> Self {
        self.progress = Some(progress);
        self
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
        if !self.valkey.is_cluster() {
            let mut conn = self.connection().await?;
            return purge_node(&mut conn, dry_run, self.progress.as_deref()).await;
        }
        // SCAN walks one node's keyspace, and a cluster connection would send
        // each SCAN to a random node: so every primary is scanned through a
        // connection of its own. Replicas hold copies and need nothing.
        let mut removed = 0;
        for (host, port) in self.valkey.primaries().await? {
            let mut conn = self.valkey.node_connection(&host, port).await?;
            removed += purge_node(&mut conn, dry_run, self.progress.as_deref()).await?;
        }
        Ok(removed)
    }
}

/// `SCAN MATCH quota:*` over one node, unlinking in batches; `progress`
/// hears each batch's count.
pub async fn purge_node(
    conn: &mut Connection,
    dry_run: bool,
    progress: Option<&(dyn Fn(u64) + Send + Sync)>,
) -> Result<u64, StoreError> {
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
            let batch = if dry_run {
                keys.len() as u64
            } else {
                // One UNLINK per key, pipelined: a multi-key UNLINK would be
                // refused with CROSSSLOT by a cluster node, whose keys span
                // many slots.
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.unlink(key);
                }
                pipe.query_async::<Vec<u64>>(conn).await?.iter().sum()
            };
            removed += batch;
            if let Some(report) = progress {
                report(batch);
            }
        }
        if next == 0 {
            return Ok(removed);
        }
        cursor = next;
    }
}
