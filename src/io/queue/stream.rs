//! A Valkey stream as the scan queue (`SCAN_QUEUE_URL=valkey-stream:<key>`). A stream cannot hold
//! an entry back, so consumers honour the job's `notBefore`; the lanes keep apart ([`lane_key`]),
//! so over-quota jobs held for it never leave a within-quota job unread. A keyed scan's job is
//! added at most once per idempotency record: `land.lua` sets a marker key (named by the record,
//! holding the `scanId`, in the stream's slot) and adds the entry only if the marker was new,
//! atomically; a retry after a timeout, or after a failover lost the claim but not the job, adds
//! nothing and answers the first `scanId`. With `VALKEY_WAIT_REPLICAS=N` each add is followed by
//! `WAIT N` in the same round trip; an add not on N replicas in time may be lost in a failover, so
//! it is [`SendError::Unanswered`], never a 202.

use super::job_queue::{Once, ScanQueue};
use crate::io::connection::{NodeInfo, SendError, Valkey, eval, sized_cmd};
use crate::rules::hash_tag::tagged;
use crate::rules::job::{Lane, ScanJob};
use sha2::{Digest, Sha256};
use uuid::Uuid;

#[derive(Clone)]
pub struct StreamQueue {
    valkey: Valkey,
    key: String,
    /// The over lane's stream ([`lane_key`]).
    over_key: String,
    /// The marker keys' prefix, in the stream's slot.
    marker_prefix: String,
    /// `VALKEY_WAIT_REPLICAS`: the replicas an entry must reach (0: none).
    wait_replicas: u32,
}

const LAND: &str = include_str!("land.lua");

/// Room for a job's JSON with a typical request body.
const JOB_JSON_CAPACITY: usize = 1024;

impl StreamQueue {
    pub fn new(valkey: Valkey, key: impl Into<String>) -> Self {
        let key = key.into();
        Self {
            valkey,
            over_key: lane_key(&key, Lane::Over),
            marker_prefix: format!("{}:", tagged(&key)),
            key,
            wait_replicas: 0,
        }
    }

    /// Every add waits (`WAIT`) for `replicas` replicas; one that falls short has an unknown fate.
    pub fn with_wait(mut self, replicas: u32) -> Self {
        self.wait_replicas = replicas;
        self
    }

    /// Sends one add, with [`Self::with_wait`] its `WAIT` behind it in the same round trip.
    async fn add<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Result<T, SendError> {
        let (added, replicated) = self
            .valkey
            .send_replicated(cmd, self.wait_replicas, SEND_WITHIN)
            .await?;
        replicated.then_some(added).ok_or(SendError::Unanswered)
    }

    fn key_of(&self, job: &ScanJob) -> &str {
        match job.lane() {
            Lane::Within => &self.key,
            Lane::Over => &self.over_key,
        }
    }

    /// The job's JSON, in a buffer sized for it at once so it is not grown on the way.
    fn json(job: &ScanJob) -> Result<Vec<u8>, SendError> {
        let mut json = Vec::with_capacity(JOB_JSON_CAPACITY);
        serde_json::to_writer(&mut json, job).map_err(|e| SendError::NotSent(e.to_string()))?;
        Ok(json)
    }
}

/// The stream of `lane` for the queue `key`: the key itself, or `{<key>}:over` (`<key>:over` when
/// it has a hash tag), in the same cluster slot.
pub fn lane_key(key: &str, lane: Lane) -> String {
    match lane {
        Lane::Within => key.to_owned(),
        Lane::Over => format!("{}:over", tagged(key)),
    }
}

/// The entry's field holding the job's JSON; `land.lua` writes it too, and the consumer reads it.
pub const JOB_FIELD: &str = "job";

/// The entry's field that holds the job's `scanId`, for operators' eyes.
pub const SCAN_ID_FIELD: &str = "scanId";

/// How long the stream waits for its own answer; the gate's bound is usually shorter.
const SEND_WITHIN: std::time::Duration = super::job_queue::ENQUEUE_TIMEOUT;

/// Warns when some node has no AOF: a restart there loses every queued job, the consumer group and
/// the `scanId` markers. It reads only `INFO persistence`, which ElastiCache allows.
pub async fn warn_without_persistence(valkey: &Valkey, key: &str) {
    match valkey.read_info("persistence", SEND_WITHIN).await {
        Ok(nodes) if !aof_everywhere(&nodes) => tracing::warn!(
            stream = key,
            "Valkey has no persistence (appendonly no): a restart loses the queued jobs, \
             the consumer group and the scanId markers; set appendonly yes"
        ),
        Ok(_) => {}
        Err(e) => tracing::debug!(error = %e, "cannot read Valkey's persistence settings"),
    }
}

fn aof_everywhere(nodes: &[NodeInfo]) -> bool {
    !nodes.is_empty() && nodes.iter().all(|n| n.field("aof_enabled") == Some("1"))
}

impl ScanQueue for StreamQueue {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), SendError> {
        let json = Self::json(job)?;
        let mut scan_id = uuid::Uuid::encode_buffer();
        let key = self.key_of(job);
        let bytes = key.len() + json.len() + 64;
        let mut cmd = sized_cmd("XADD", 6, bytes);
        cmd.arg(key)
            .arg("*")
            .arg(JOB_FIELD)
            .arg(json)
            .arg(SCAN_ID_FIELD)
            .arg(&*job.scan_id.hyphenated().encode_lower(&mut scan_id));
        let _: String = self.add(cmd).await?;
        Ok(())
    }

    async fn enqueue_once(&self, job: &ScanJob, once: Once<'_>) -> Result<Uuid, SendError> {
        let json = Self::json(job)?;
        // Hashed again: the marker's name stays short and says nothing of the subject.
        let record = hex::encode(&Sha256::digest(once.record.as_bytes())[..16]);
        let marker = format!("{}landed:{record}", self.marker_prefix);
        // The older marker form, by scanId, checked until such markers expire.
        let by_scan_id = format!("{}scan:{}", self.marker_prefix, job.scan_id);
        let mut cmd = eval(LAND, &[self.key_of(job), &marker, &by_scan_id]);
        cmd.arg(json)
            .arg(job.scan_id.to_string())
            .arg(once.expires_at.get());
        let landed: String = self.add(cmd).await?;
        Uuid::parse_str(&landed).map_err(|e| SendError::Refused(format!("a marker: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The over lane's stream shares the queue key's hash tag: one slot.
    #[test]
    fn lane_keys() {
        assert_eq!(lane_key("jobs", Lane::Within), "jobs");
        assert_eq!(lane_key("jobs", Lane::Over), "{jobs}:over");
        assert_eq!(lane_key("{q}jobs", Lane::Over), "{q}jobs:over");
    }

    /// AOF on every node is persistence; any node without it, or no node, is not.
    #[test]
    fn persistence() {
        let node = |t: &str| NodeInfo {
            node: "a:6379".into(),
            text: t.into(),
        };
        assert!(aof_everywhere(&[node(
            "# Persistence\r\naof_enabled:1\r\n"
        )]));
        assert!(!aof_everywhere(&[node("aof_enabled:0\r\n")]));
        assert!(!aof_everywhere(&[
            node("aof_enabled:1"),
            node("aof_enabled:0")
        ]));
        assert!(!aof_everywhere(&[]));
    }

    /// `land.lua` writes the entry's fields under the names the consumer
    /// reads: every quoted word that is not a command, an option or a
    /// number is [`JOB_FIELD`] or [`SCAN_ID_FIELD`].
    #[test]
    fn land_fields() {
        let fields = format!("'{JOB_FIELD}', ARGV[1], '{SCAN_ID_FIELD}', ARGV[2]");
        assert!(LAND.contains(&fields), "{LAND}");
        for word in crate::io::connection::quoted_words(LAND) {
            let command = word.chars().all(|c| c.is_ascii_uppercase());
            let argument = word == "*" || word.parse::<u64>().is_ok();
            assert!(
                command || argument || [JOB_FIELD, SCAN_ID_FIELD].contains(&word),
                "land.lua: '{word}' is not a stream field"
            );
        }
    }
}
