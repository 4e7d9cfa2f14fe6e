//! Step 7: forwarding accepted scans, behind one narrow trait. Every 202 stands for exactly one
//! queued [`ScanJob`]: the gate counts, enqueues, and only then answers; a failed enqueue refunds
//! the count and answers 503. Backends: [`spool::Spool`], [`stream::StreamQueue`] and
//! [`sqs::SqsQueue`].

pub mod job_queue;
pub mod spool;
pub mod sqs;
pub mod stream;

pub use job_queue::{ENQUEUE_TIMEOUT, Once, ScanQueue, SendError};

/// The job type lives in [`crate::rules::job`], shared with the consumer.
pub use crate::rules::job::ScanJob;

/// The queue chosen by `SCAN_QUEUE_URL`.
pub enum AnyQueue {
    Spool(spool::Spool),
    Stream(stream::StreamQueue),
    Sqs(sqs::SqsQueue),
}

impl ScanQueue for AnyQueue {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), SendError> {
        match self {
            Self::Spool(q) => q.enqueue(job).await,
            Self::Stream(q) => q.enqueue(job).await,
            Self::Sqs(q) => Box::pin(q.enqueue(job)).await,
        }
    }

    async fn enqueue_once(&self, job: &ScanJob, record: Once<'_>) -> Result<uuid::Uuid, SendError> {
        match self {
            Self::Spool(q) => q.enqueue_once(job, record).await,
            Self::Stream(q) => q.enqueue_once(job, record).await,
            Self::Sqs(q) => Box::pin(q.enqueue_once(job, record)).await,
        }
    }
}
