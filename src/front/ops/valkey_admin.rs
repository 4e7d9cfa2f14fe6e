//! What operators read and change in the store, off the request path: one subject's keys and every
//! quota key. Plain [`ValkeyStore`] methods, kept out of [`crate::io::store::QuotaStore`].

use redis::AsyncCommands;

use super::nodes;
use super::progress::Progress;
use super::rfc3339;
use crate::config::Config;
use crate::io::connection::Connection;
use crate::io::store::valkey::{ValkeyStore, eval};
use crate::io::store::{
    GrantHeld, KEY_PATTERN, Peek, QuotaKey, SendError, peek_commands, peek_of, resets_at,
};
use crate::rules::unix::UnixSecs;

/// Keys removed per UNLINK in a purge.
const PURGE_BATCH: usize = 500;

/// One subject as an operator sees it: what `GET /quota` reads, first-seen, the grant's expiry.
/// The default: no key at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// With no counter (a grant before the period's first scan): `used` 0 and no `reset_at`.
    pub peek: Peek,
    /// Whether the counter exists.
    pub counter: bool,
    /// The first scan of the period, ISO 8601.
    pub first_seen: Option<String>,
    /// `None` with no grant, or one waiting for the period's first scan to get the counter's.
    pub grant_expires_at: Option<UnixSecs>,
}

impl Snapshot {
    /// When the period ends, as answers report `resetAt`: with no counter, when one opened `now`
    /// would expire; `None` for a counter that (wrongly) never expires.
    pub(super) fn reset_at(&self, config: &Config, now: UnixSecs) -> Option<String> {
        let expires_at = self.peek.reset_at;
        if self.counter && expires_at.is_none() {
            return None;
        }
        Some(rfc3339(resets_at(config.policy.reset, expires_at, now)))
    }

    /// How far ahead of `now` the pacing slot is, in ms: the wait a scan arriving now would add.
    pub(super) fn backlog_ms(&self, now: UnixSecs) -> u64 {
        self.peek.slot_ms.map_or(0, |slot| {
            u64::try_from(slot.get() - now.millis().get()).unwrap_or(0)
        })
    }
}

/// Sets a subject's grant atomically, expiring with its counter.
const GRANT: &str = include_str!("grant.lua");
/// Sets a level's grant atomically, held in its counter.
const GRANT_LEVEL: &str = include_str!("grant_level.lua");

impl ValkeyStore {
    /// Reads a subject's counter; `None` when it has neither a counter nor a grant.
    pub async fn inspect(&self, key: &QuotaKey) -> Result<Option<Snapshot>, SendError> {
        self.snapshot(key, GrantHeld::Beside).await
    }

    /// Reads a level's counter; its used scans are the counter plus the grant taken off it.
    pub async fn inspect_level(&self, key: &QuotaKey) -> Result<Option<Snapshot>, SendError> {
        self.snapshot(key, GrantHeld::InCounter).await
    }

    async fn snapshot(
        &self,
        key: &QuotaKey,
        held: GrantHeld,
    ) -> Result<Option<Snapshot>, SendError> {
        let mut conn = self.valkey().connection().await?;
        // The request path's read of `[used, expiry, slot, grant]`, and the grant's expiry.
        let mut pipe = redis::pipe();
        peek_commands(&mut pipe, key);
        pipe.cmd("EXPIRETIME").arg(&key.grant);
        let reply: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        let (grant_expiry, read) = reply.split_last().unwrap_or((&redis::Value::Nil, &[]));
        let peek = peek_of(read, held)?; // four replies, or an error
        let present = |v: &redis::Value| !matches!(v, redis::Value::Nil);
        let (counter, grant) = (present(&read[0]), present(&read[3]));
        if !counter && !grant {
            return Ok(None);
        }
        let grant_expires_at = match grant_expiry {
            redis::Value::Int(at) => instant(*at), // -2 with no grant
            _ => None,
        };
        // A level has no first-seen key (and an empty name is another slot).
        let first_seen: Option<String> = match key.first_seen.is_empty() {
            true => None,
            false => conn.get(&key.first_seen).await?,
        };
        Ok(Some(Snapshot {
            peek,
            counter,
            first_seen,
            grant_expires_at,
        }))
    }

    /// Gives a subject `scans` extra scans for the current period, replacing any earlier grant. It
    /// expires with the counter or, before the period's first scan, at `period_end` if known, else
    /// (`None`) with the counter that scan opens.
    pub async fn grant(
        &self,
        key: &QuotaKey,
        scans: u64,
        period_end: Option<UnixSecs>,
    ) -> Result<Option<UnixSecs>, SendError> {
        let mut conn = self.valkey().connection().await?;
        let at: i64 = eval(GRANT, &[&key.counter, &key.grant])
            .arg(scans)
            .arg(period_end.map_or(0, UnixSecs::get))
            .query_async(&mut conn)
            .await?;
        Ok(instant(at))
    }

    /// Gives a level `scans` extra scans (0 takes them back), held in its counter, replacing any
    /// earlier grant. Returns the expiry (none if a revoke found no counter) and the old grant.
    pub async fn grant_level(
        &self,
        key: &QuotaKey,
        scans: u64,
        period_end: UnixSecs,
    ) -> Result<(Option<UnixSecs>, u64), SendError> {
        let mut conn = self.valkey().connection().await?;
        let (at, earlier): (i64, u64) = eval(GRANT_LEVEL, &[&key.counter, &key.grant])
            .arg(scans)
            .arg(period_end.get())
            .query_async(&mut conn)
            .await?;
        Ok((instant(at), earlier))
    }

    /// Takes a subject's grant back; whether there was one.
    pub async fn revoke(&self, key: &QuotaKey) -> Result<bool, SendError> {
        let mut conn = self.valkey().connection().await?;
        let removed: u64 = conn.del(&key.grant).await?;
        Ok(removed > 0)
    }

    /// Removes every key of a subject; returns how many existed.
    pub async fn reset(&self, key: &QuotaKey) -> Result<u64, SendError> {
        self.remove_matching(&key.pattern(), false, None).await
    }

    /// Removes (or, when `dry_run`, counts) every `quota:*` key; returns how many.
    pub async fn purge(
        &self,
        dry_run: bool,
        progress: Option<&Progress>,
    ) -> Result<u64, SendError> {
        self.remove_matching(KEY_PATTERN, dry_run, progress).await
    }

    async fn remove_matching(
        &self,
        pattern: &str,
        dry_run: bool,
        progress: Option<&Progress>,
    ) -> Result<u64, SendError> {
        if !self.valkey().is_cluster() {
            let mut conn = self.valkey().connection().await?;
            return purge_node(&mut conn, pattern, dry_run, progress).await;
        }
        // A cluster connection would send each SCAN to a random node: scan every primary directly.
        let mut removed = 0;
        for (host, port) in nodes::primaries(self.valkey()).await? {
            let mut conn = nodes::node_connection(self.valkey(), &host, port).await?;
            removed += purge_node(&mut conn, pattern, dry_run, progress).await?;
        }
        Ok(removed)
    }
}

/// An instant the store or a script gave in unix seconds; a negative one is none (EXPIRETIME: -1 no
/// expiry, -2 no key).
fn instant(secs: i64) -> Option<UnixSecs> {
    Some(secs).filter(|t| *t >= 0).map(UnixSecs)
}

/// `SCAN MATCH <pattern>` over one node, unlinking (or counting) in batches reported to `progress`.
async fn purge_node(
    conn: &mut Connection,
    pattern: &str,
    dry_run: bool,
    progress: Option<&Progress>,
) -> Result<u64, SendError> {
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
                // One UNLINK per key: a multi-key one would get CROSSSLOT from a cluster node.
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.unlink(key);
                }
                pipe.query_async::<Vec<u64>>(conn).await?.iter().sum()
            };
            removed += batch;
            if let Some(progress) = progress {
                progress.add(batch);
            }
        }
        if next == 0 {
            return Ok(removed);
        }
        cursor = next;
    }
}
