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

/// The longest an enqueue may take before the scan is refunded and refused
/// (less when the gateway or Lambda deadline is nearer). It lives with the
/// queues, which bound their own sends by it; the gate imports it.
pub const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// The job type lives in [`crate::job`], shared with the consumer.
pub use crate::job::ScanJob;

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
