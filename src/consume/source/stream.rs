//! A Valkey stream read through a consumer group. While this consumer holds an entry, it resets
//! the entry's idle time with `XCLAIM … JUSTID` every quarter lease; one idle a whole lease (its
//! consumer dead, or its job waiting for a run slot) is taken over by any consumer's `XAUTOCLAIM`,
//! run every half lease. Every command names one key, so a cluster routes it by the stream's slot.
//! A missing group is created at `0`, also when it disappears. Reads use a connection of their
//! own: a blocking `XREADGROUP` would hold up every other command on a shared one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::Cmd;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamClaimOptions, StreamId, StreamReadOptions,
    StreamReadReply,
};

use super::{Delivery, GivenUp, JobSource};
use crate::consume::error::{BUSYGROUP, ConsumeError};
use crate::consume::sync::lock;
use crate::io::connection::Valkey;
use crate::io::queue::stream::JOB_FIELD;

/// How long one `XREADGROUP` blocks waiting for new entries.
pub const BLOCK: Duration = Duration::from_millis(500);

/// A consumer in a group on one stream.
pub struct StreamSource {
    /// For the blocking reads (its response timeout covers [`BLOCK`]).
    reads: Valkey,
    /// For everything else.
    ops: Valkey,
    key: String,
    group: String,
    consumer: String,
    lease: Duration,
    reclaim: Mutex<Reclaim>,
}

/// Where `XAUTOCLAIM` is in the pending list, and when it last ran.
struct Reclaim {
    last: Option<Instant>,
    cursor: String,
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
    ) -> Result<Self, ConsumeError> {
        let source = Self {
            reads,
            ops,
            key: key.to_owned(),
            group: group.to_owned(),
            consumer: consumer.to_owned(),
            lease,
            reclaim: Mutex::new(Reclaim {
                last: None,
                cursor: "0-0".into(),
            }),
        };
        source.create_group().await?;
        Ok(source)
    }

    /// `XGROUP CREATE … 0 MKSTREAM`; an existing group is fine.
    async fn create_group(&self) -> Result<(), ConsumeError> {
        let cmd = Cmd::xgroup_create_mkstream(&self.key, &self.group, "0");
        match self.ops.send_coded::<()>(cmd, self.ops.timeout()).await? {
            Err(refused) if !refused.is(BUSYGROUP) => Err(refused.into()),
            _ => Ok(()),
        }
    }

    async fn call<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, ConsumeError> {
        Ok(self.ops.send_coded(cmd, self.ops.timeout()).await??)
    }

    /// Entries a dead consumer left (every half lease), else new ones.
    async fn read(&self, max: usize) -> Result<Vec<Delivery<String>>, ConsumeError> {
        let reclaimed = self.reclaim(max).await?;
        if !reclaimed.is_empty() {
            return Ok(reclaimed);
        }
        let options = StreamReadOptions::default()
            .group(&self.group, &self.consumer)
            .count(max)
            .block(ms(BLOCK));
        let cmd = Cmd::xread_options(&[&self.key], &[">"], &options);
        // A connection first, then the read with its whole time: a read given up on after the
        // server took it would hand this consumer entries it never sees until a lease later.
        let within = BLOCK + self.reads.timeout();
        self.reads.connected(within).await?;
        let reply: Option<StreamReadReply> = self.reads.send_coded(cmd, within).await??;
        let entries = reply
            .into_iter()
            .flat_map(|r| r.keys)
            .flat_map(|k| k.ids)
            .collect::<Vec<_>>();
        tracing::debug!(entries = entries.len(), max, "read");
        Ok(self.deliveries(entries).await)
    }

    /// `XAUTOCLAIM` from where the last one ended, if half a lease has passed since it ran.
    async fn reclaim(&self, max: usize) -> Result<Vec<Delivery<String>>, ConsumeError> {
        let cursor = {
            let mut state = lock(&self.reclaim);
            if state.last.is_some_and(|at| at.elapsed() < self.lease / 2) {
                return Ok(Vec::new());
            }
            state.last = Some(Instant::now());
            state.cursor.clone()
        };
        let (key, group, consumer) = (&self.key, &self.group, &self.consumer);
        let options = StreamAutoClaimOptions::default().count(max);
        let cmd = Cmd::xautoclaim_options(key, group, consumer, ms(self.lease), &cursor, options);
        let reply: StreamAutoClaimReply = self.call(cmd).await?;
        lock(&self.reclaim).cursor = reply.next_stream_id.clone();
        if !reply.claimed.is_empty() {
            tracing::info!(
                entries = reply.claimed.len(),
                "reclaimed jobs a stopped or busy consumer left"
            );
        }
        Ok(self.deliveries(reply.claimed).await)
    }

    /// The entries as jobs; one without a readable job can never run: dead-lettered at once.
    async fn deliveries(&self, entries: Vec<StreamId>) -> Vec<Delivery<String>> {
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let json: Option<String> = entry.get(JOB_FIELD);
            let read = json
                .ok_or_else(|| "no job field".to_owned())
                .and_then(|json| Delivery::read(json, entry.id.clone()).map_err(|e| e.to_string()));
            match read {
                Ok(d) => out.push(d),
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

    /// `XCLAIM … IDLE <idle> JUSTID`: 0 renews the entry; a whole lease offers it to others.
    async fn xclaim(&self, id: &str, idle: Duration) -> Result<(), ConsumeError> {
        let options = StreamClaimOptions::default().idle(ms(idle)).with_justid();
        let cmd = Cmd::xclaim_options(&self.key, &self.group, &self.consumer, 0, &[id], options);
        self.call::<redis::Value>(cmd).await.map(drop)
    }

    async fn xack(&self, id: &str) -> Result<(), ConsumeError> {
        self.call::<i64>(Cmd::xack(&self.key, &self.group, &[id]))
            .await
            .map(drop)
    }

    async fn dead_letter_raw(
        &self,
        id: &str,
        json: &str,
        failures: u32,
        error: &str,
    ) -> Result<(), ConsumeError> {
        let failures = failures.to_string();
        let fields = [
            (JOB_FIELD, json),
            ("entry", id),
            ("failures", &failures),
            ("error", error),
        ];
        self.call::<String>(Cmd::xadd(format!("{}:dead", self.key), "*", &fields))
            .await?;
        self.xack(id).await
    }
}

impl JobSource for StreamSource {
    type Handle = String;

    fn name(&self) -> &'static str {
        "stream"
    }

    async fn next(&self, max: usize) -> Result<Option<Vec<Delivery<String>>>, ConsumeError> {
        match self.read(max).await {
            Err(ConsumeError::NoGroup) => {
                tracing::warn!(
                    stream = self.key,
                    group = self.group,
                    "the consumer group is gone (Valkey restarted without persistence?): \
                     creating it again; entries it held are lost"
                );
                self.create_group().await?;
                Ok(Some(Vec::new()))
            }
            read => read.map(Some),
        }
    }

    async fn ack(&self, d: &Delivery<String>) -> Result<(), ConsumeError> {
        self.xack(&d.handle).await
    }

    fn entry<'d>(&'d self, d: &'d Delivery<String>) -> Option<(&'d str, &'d str)> {
        Some((&self.key, &d.handle))
    }

    /// Resets the entry's idle time, so nobody reclaims it.
    async fn extend(&self, d: &Delivery<String>) -> Result<(), ConsumeError> {
        self.xclaim(&d.handle, Duration::ZERO).await
    }

    /// `XADD <stream>:dead` (the job, its entry id, failures, the last error), then `XACK`.
    async fn dead_letter(
        &self,
        d: &Delivery<String>,
        why: GivenUp<'_>,
    ) -> Result<(), ConsumeError> {
        self.dead_letter_raw(&d.handle, &d.json, why.failures, why.error)
            .await
    }

    /// Left pending but idle for a whole lease, so any consumer's next `XAUTOCLAIM` takes it over.
    async fn give_back(&self, d: &Delivery<String>, _wait: Duration) {
        if let Err(e) = self.xclaim(&d.handle, self.lease).await {
            tracing::warn!(scan_id = %d.job.scan_id, error = %e, "cannot give a job back; it is taken over after its lease");
        }
    }
}

/// `d` in whole milliseconds, as the stream commands' options take it.
fn ms(d: Duration) -> usize {
    usize::try_from(d.as_millis()).unwrap_or(usize::MAX)
}
