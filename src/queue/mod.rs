//! Step 7: forwarding accepted scans, behind one narrow trait.
//!
//! Every 202 stands for exactly one queued [`ScanJob`]: the gate counts,
//! enqueues, and only then answers; a failed enqueue refunds the count and
//! answers 503. Backends: [`spool::Spool`] (one JSON line per job on stdout,
//! the local default), [`stream::StreamQueue`] (`XADD` on the quota
//! Valkey) and [`sqs::SqsQueue`] (one `SendMessage`, held back by
//! `DelaySeconds`).

pub mod spool;
pub mod sqs;
pub mod stream;

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};
use uuid::Uuid;

/// One accepted scan, as the scanner backend receives it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScanJob {
    /// UUID v7: time-ordered, so queues and logs sort by arrival.
    pub scan_id: Uuid,
    /// When the gate received the request (RFC 3339, UTC).
    pub received_at: String,
    /// `ip` or `tid`.
    pub scope: &'static str,
    /// The subject's keyed digest (never the IP or token itself).
    pub digest: String,
    /// The decision tier: `within`, `soft` or `hard`; `unmetered` when the
    /// store did not answer and the scan was accepted uncounted.
    pub tier: &'static str,
    /// The daily ceiling that applied.
    pub limit: u32,
    /// The subject's count including this scan (0 when `unmetered`).
    pub count: u64,
    /// The whole delay owed, in milliseconds.
    pub delay_ms: u64,
    /// The part of the delay not slept in the handler, held back on the job.
    pub deferred_ms: u64,
    /// The scan must not start before this instant (RFC 3339, UTC).
    pub not_before: String,
    /// `not_before` in unix milliseconds (not serialized).
    #[serde(skip)]
    pub not_before_ms: i64,
    /// The client's request body, untouched.
    pub request: Map<String, Value>,
}

impl ScanJob {
    /// The deferral as a `Duration`.
    pub fn deferred(&self) -> Duration {
        Duration::from_millis(self.deferred_ms)
    }
}

/// Why a job could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Sent, but no answer (in time, or at all: the connection dropped):
    /// the job may have landed, or still land.
    #[error("the scan queue did not answer in time")]
    Timeout,
    #[error("scan queue error: {0}")]
    Backend(String),
}

/// A scan queue.
pub trait ScanQueue: Send + Sync + 'static {
    /// Queues `job`, held back by `job.deferred_ms` where the backend can.
    fn enqueue(&self, job: &ScanJob) -> impl Future<Output = Result<(), QueueError>> + Send;

    /// Queues `job` unless a job with its `scanId` was queued before: what a
    /// keyed retry uses. Backends that cannot tell queue it again, and
    /// consumers deduplicate on `scanId`.
    fn enqueue_once(&self, job: &ScanJob) -> impl Future<Output = Result<(), QueueError>> + Send {
        self.enqueue(job)
    }
}

/// The queue chosen by `SCAN_QUEUE_URL`.
pub enum AnyQueue {
    Spool(spool::Spool),
    Stream(stream::StreamQueue),
    Sqs(sqs::SqsQueue),
}

impl ScanQueue for AnyQueue {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), QueueError> {
        match self {
            Self::Spool(q) => q.enqueue(job).await,
            Self::Stream(q) => q.enqueue(job).await,
            Self::Sqs(q) => q.enqueue(job).await,
        }
    }

    async fn enqueue_once(&self, job: &ScanJob) -> Result<(), QueueError> {
        match self {
            Self::Spool(q) => q.enqueue_once(job).await,
            Self::Stream(q) => q.enqueue_once(job).await,
            Self::Sqs(q) => q.enqueue_once(job).await,
        }
    }
}
