//! A Valkey stream read through a consumer group.
//!
//! `XREADGROUP … >` hands each entry to one consumer, where it stays
//! pending until `XACK`. While this consumer holds an entry (waiting for its
//! `notBefore`, or running) it renews it with `XCLAIM … JUSTID` every
//! quarter lease, which resets the entry's idle time; a consumer that dies
//! stops renewing, and once an entry has been idle a whole lease any other
//! consumer takes it over with `XAUTOCLAIM` (checked every half lease).
//! Every command names one key, so a cluster routes each by the stream's
//! slot. The group is created at the stream's start (`0`) if missing, so
//! jobs queued before the first consumer started are read too.
//!
//! Reads use a connection of their own: a blocking `XREADGROUP` would hold
//! up every other command on a shared, multiplexed connection.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};

use super::{Delivery, Handle};
use crate::connection::Valkey;
use crate::job::ScanJob;

/// How long one `XREADGROUP` blocks waiting for new entries.
pub const BLOCK: Duration = Duration::from_millis(500);

/// A consumer in a group on one stream.
pub struct StreamSource {
    /// For the blocking reads (its response timeout covers [`BLOCK`]).
    reads: Valkey,
    /// For everything else.
    ops: Valkey,
    key: String,
    dead_key: String,
    group: String,
    consumer: String,
    lease: Duration,
    last_reclaim: Mutex<Option<Instant>>,
}

fn err(e: redis::RedisError) -> String {
    e.to_string()
}

impl StreamSource {
    /// Joins `group` on `key` as `consumer`, creating the group if needed.
    pub async fn open(
        reads: Valkey,
        ops: Valkey,
        key: &str,
        group: &str,
        consumer: &str,
        lease: Duration,
    ) -> Result<Self, String> {
        let mut conn = ops.connection().await.map_err(err)?;
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(key)
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        match created {
            Err(e) if e.code() != Some("BUSYGROUP") => {
                return Err(format!(
                    "cannot create consumer group {group} on {key}: {e}"
                ));
            }
            _ => {}
        }
        Ok(Self {
            reads,
            ops,
            key: key.to_owned(),
            dead_key: format!("{key}:dead"),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
            lease,
            last_reclaim: Mutex::new(None),
        })
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// Entries a dead consumer left (every half lease), else new ones.
    pub async fn next(&self, max: usize) -> Result<Vec<Delivery>, String> {
        if self.reclaim_due() {
            let reclaimed = self.reclaim(max).await?;
            if !reclaimed.is_empty() {
                return Ok(reclaimed);
            }
        }
        let mut conn = self.reads.connection().await.map_err(err)?;
        let reply: Option<StreamReadReply> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(u64::try_from(BLOCK.as_millis()).unwrap_or(500))
            .arg("STREAMS")
            .arg(&self.key)
            .arg(">")
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        let entries = reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .collect::<Vec<_>>();
        tracing::debug!(entries = entries.len(), max, "read");
        Ok(self.deliveries(entries).await)
    }

    fn reclaim_due(&self) -> bool {
        let Ok(mut last) = self.last_reclaim.lock() else {
            return true;
        };
        let due = last.is_none_or(|at| at.elapsed() >= self.lease / 2);
        if due {
            *last = Some(Instant::now());
        }
        due
    }

    async fn reclaim(&self, max: usize) -> Result<Vec<Delivery>, String> {
        let mut conn = self.ops.connection().await.map_err(err)?;
        let reply: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
            .arg(&self.key)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(self.lease_ms())
            .arg("0-0")
            .arg("COUNT")
            .arg(max)
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        if !reply.claimed.is_empty() {
            tracing::info!(
                entries = reply.claimed.len(),
                "reclaimed jobs a stopped consumer left"
            );
        }
        Ok(self.deliveries(reply.claimed).await)
    }

    /// The entries as jobs; one that holds no readable job cannot ever run,
    /// so it goes to the dead-letter stream at once.
    async fn deliveries(&self, entries: Vec<StreamId>) -> Vec<Delivery> {
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let json: Option<String> = entry.get("job");
            let parsed = json
                .ok_or_else(|| "no job field".to_owned())
                .and_then(|json| match ScanJob::from_json(&json) {
                    Ok(job) => Ok((job, json)),
                    Err(e) => Err(e.to_string()),
                });
            match parsed {
                Ok((job, json)) => out.push(Delivery {
                    job,
                    json,
                    handle: Handle::Stream(entry.id),
                }),
                Err(e) => {
                    tracing::error!(entry = %entry.id, error = %e, "unreadable stream entry");
                    if let Err(e) = self.dead_letter_raw(&entry.id, "", 0, &e).await {
                        tracing::warn!(error = %e, "cannot dead-letter an unreadable entry");
                    }
                }
            }
        }
        out
    }

    pub async fn ack(&self, id: &str) -> Result<(), String> {
        let mut conn = self.ops.connection().await.map_err(err)?;
        redis::cmd("XACK")
            .arg(&self.key)
            .arg(&self.group)
            .arg(id)
            .query_async::<i64>(&mut conn)
            .await
            .map(drop)
            .map_err(err)
    }

    /// Resets the entry's idle time, so nobody reclaims it.
    pub async fn extend(&self, id: &str) -> Result<(), String> {
        let mut conn = self.ops.connection().await.map_err(err)?;
        redis::cmd("XCLAIM")
            .arg(&self.key)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(0)
            .arg(id)
            .arg("JUSTID")
            .query_async::<redis::Value>(&mut conn)
            .await
            .map(drop)
            .map_err(err)
    }

    /// `XADD <stream>:dead` (the job, its scanId, failures, the last error), then `XACK`.
    pub async fn dead_letter(
        &self,
        id: &str,
        d: &Delivery,
        failures: u32,
        error: &str,
    ) -> Result<(), String> {
        self.dead_letter_raw(id, &d.json, failures, error).await
    }

    async fn dead_letter_raw(
        &self,
        id: &str,
        json: &str,
        failures: u32,
        error: &str,
    ) -> Result<(), String> {
        let mut conn = self.ops.connection().await.map_err(err)?;
        redis::cmd("XADD")
            .arg(&self.dead_key)
            .arg("*")
            .arg("job")
            .arg(json)
            .arg("entry")
            .arg(id)
            .arg("failures")
            .arg(failures)
            .arg("error")
            .arg(error)
            .query_async::<String>(&mut conn)
            .await
            .map_err(err)?;
        self.ack(id).await
    }
}
