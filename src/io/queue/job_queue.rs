//! What every scan queue is: the [`ScanQueue`] trait, its [`QueueError`],
//! and the [`ENQUEUE_TIMEOUT`] the queues bound their sends by. A leaf:
//! the queues and the gate import it, it imports only the job.

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use crate::rules::job::ScanJob;
use crate::rules::unix::UnixSecs;

/// The longest an enqueue may take before the scan is refunded and refused
/// (less when the gateway or Lambda deadline is nearer). It lives with the
/// queues, which bound their own sends by it; the gate imports it.
pub const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(5);

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

    /// Queues a keyed scan's `job` unless its record's job was queued
    /// before, under this `scanId` or another (an attempt whose claim a
    /// failover lost may have landed its job on the new primary); the
    /// `scanId` the record's job is queued under. Backends that cannot tell
    /// queue it again, and consumers deduplicate on `scanId`.
    fn enqueue_once(
        &self,
        job: &ScanJob,
        record: Once<'_>,
    ) -> impl Future<Output = Result<Uuid, QueueError>> + Send {
        let _ = record;
        async move { self.enqueue(job).await.map(|()| job.scan_id) }
    }
}

/// The idempotency record a keyed scan's job belongs to.
#[derive(Debug, Clone, Copy)]
pub struct Once<'a> {
    /// The record's key.
    pub record: &'a str,
    /// When the record expires: what lands once is remembered as long.
    pub expires_at: UnixSecs,
}
