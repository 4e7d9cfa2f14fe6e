//! A Valkey stream as the scan queue (`SCAN_QUEUE_URL=valkey-stream:<key>`).
//!
//! `XADD <key> * job <json> scanId <uuid>` on the quota Valkey. A stream
//! cannot hold an entry back, so consumers honour the job's `notBefore`.

use redis::AsyncCommands;

use super::{QueueError, ScanJob, ScanQueue};
use crate::valkey::Valkey;

/// Appends jobs to a stream.
#[derive(Clone)]
pub struct StreamQueue {
    valkey: Valkey,
    key: String,
}

impl StreamQueue {
    pub fn new(valkey: Valkey, key: impl Into<String>) -> Self {
        Self {
            valkey,
            key: key.into(),
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

impl ScanQueue for StreamQueue {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), QueueError> {
        let backend = |e: redis::RedisError| {
            if e.is_timeout() {
                QueueError::Timeout
            } else {
                QueueError::Backend(e.to_string())
            }
        };
        let json = serde_json::to_string(job).map_err(|e| QueueError::Backend(e.to_string()))?;
        let mut conn = self.valkey.connection().await.map_err(backend)?;
        let _: String = conn
            .xadd(
                &self.key,
                "*",
                &[("job", json.as_str()), ("scanId", &job.scan_id.to_string())],
            )
            .await
            .map_err(backend)?;
        Ok(())
    }
}
