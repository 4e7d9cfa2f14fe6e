//! What operators read and change in the store, off the request path:
//! one subject's keys (`inspect`, `reset`) and every quota key (`purge`, the
//! seed's mass expiry: `SCAN MATCH quota:*` + `UNLINK` in batches, on every
//! primary of a cluster). Plain [`ValkeyStore`] methods: the request path's
//! [`crate::store::QuotaStore`] has no operator method, and the in-memory
//! store, which lives only inside one `serve` process, has none at all.

use super::nodes;
use crate::connection::Connection;
use crate::store::valkey::ValkeyStore;
use crate::store::{KEY_PATTERN, Peek, QuotaKey, StoreError};
use crate::unix::{UnixMillis, UnixSecs};

/// Keys removed per UNLINK in a purge.
const PURGE_BATCH: usize = 500;

/// What an operator sees of one subject: what `GET /quota` reads (the
/// counter, its expiry as Valkey's own `EXPIRETIME`, the instant every 202
/// reports, the pacing slot and the grant), and the period's first scan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub peek: Peek,
    /// The first scan of the period, ISO 8601.
    pub first_seen: Option<String>,
}

/// Sets (or, with 0 scans, removes) a subject's grant atomically.
const GRANT: &str = include_str!("grant.lua");

impl ValkeyStore {
    /// Reads a subject's counter without changing it.
    pub async fn inspect(&self, key: &QuotaKey) -> Result<Option<Snapshot>, StoreError> {
        let mut conn = self.valkey().connection().await?;
        type Reply = (Option<u64>, i64, Option<String>, Option<i64>, Option<u64>);
        let (used, expires_at, first_seen, slot, grant): Reply = redis::pipe()
            .get(&key.counter)
            .cmd("EXPIRETIME")
            .arg(&key.counter)
            .get(&key.first_seen)
            .get(&key.slot)
            .get(&key.grant)
            .query_async(&mut conn)
            .await?;
        // A grant made before the period's first scan shows without a counter.
        let used = used.or(grant.map(|_| 0));
        Ok(used.map(|used| Snapshot {
            peek: Peek {
                used,
                // -1: no expiry; -2: gone since the GET.
                reset_at: Some(expires_at).filter(|at| *at >= 0).map(UnixSecs),
                slot_ms: slot.map(UnixMillis),
                grant: grant.unwrap_or(0),
            },
            first_seen,
        }))
    }

    /// Gives a subject `scans` extra scans for the current period (0 takes
    /// the grant back); the grant expires with the counter, or at
    /// `period_end` when the period has not started. Returns its expiry
    /// (0 when revoked).
    pub async fn grant(
        &self,
        key: &QuotaKey,
        scans: u64,
        period_end: UnixSecs,
    ) -> Result<UnixSecs, StoreError> {
        let mut conn = self.valkey().connection().await?;
        let at: i64 = crate::store::valkey::eval(GRANT, &[&key.counter, &key.grant])
            .arg(scans)
            .arg(period_end.get())
            .query_async(&mut conn)
            .await?;
        Ok(UnixSecs(at))
    }

    /// Removes every key of a subject (counter, first-seen, pacing slot and
    /// idempotency records); returns how many existed.
    pub async fn reset(&self, key: &QuotaKey) -> Result<u64, StoreError> {
        self.remove_matching(&key.pattern(), false, None).await
    }

    /// Removes every `quota:*` key (or only counts them when `dry_run`),
    /// reporting each batch to `progress`; returns how many.
    pub async fn purge(
        &self,
        dry_run: bool,
        progress: Option<&(dyn Fn(u64) + Send + Sync)>,
    ) -> Result<u64, StoreError> {
        self.remove_matching(KEY_PATTERN, dry_run, progress).await
    }

    async fn remove_matching(
        &self,
        pattern: &str,
        dry_run: bool,
        progress: Option<&(dyn Fn(u64) + Send + Sync)>,
    ) -> Result<u64, StoreError> {
        if !self.valkey().is_cluster() {
            let mut conn = self.valkey().connection().await?;
            return purge_node(&mut conn, pattern, dry_run, progress).await;
        }
        // SCAN walks one node's keyspace, and a cluster connection would send
        // each SCAN to a random node: so every primary is scanned through a
        // connection of its own. Replicas hold copies and need nothing.
        let mut removed = 0;
        for (host, port) in nodes::primaries(self.valkey()).await? {
            let mut conn = nodes::node_connection(self.valkey(), &host, port).await?;
            removed += purge_node(&mut conn, pattern, dry_run, progress).await?;
        }
        Ok(removed)
    }
}

/// `SCAN MATCH <pattern>` over one node, unlinking in batches (or only
/// counting, in a dry run); `progress` hears each batch's count.
pub async fn purge_node(
    conn: &mut Connection,
    pattern: &str,
    dry_run: bool,
    progress: Option<&(dyn Fn(u64) + Send + Sync)>,
) -> Result<u64, StoreError> {
    let mut cursor: u64 = 0;
    let mut removed = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
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
