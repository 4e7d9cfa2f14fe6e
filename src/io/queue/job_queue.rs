//! What every scan queue is: [`ScanQueue`] and the [`ENQUEUE_TIMEOUT`] bounding its sends.

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

pub use crate::io::connection::SendError;
use crate::rules::job::ScanJob;
use crate::rules::unix::UnixSecs;

/// The longest an enqueue may take before the scan is refunded and refused (less when the gateway
/// or Lambda deadline is nearer).
pub const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(5);

pub trait ScanQueue: Send + Sync + 'static {
    /// Queues `job`, held back by `job.deferred_ms` where the backend can.
    fn enqueue(&self, job: &ScanJob) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Queues a keyed scan's `job` unless its record's job was queued before, under any `scanId`
    /// (a failover may have lost the claim but not the job); returns the `scanId` it is queued
    /// under. Backends that cannot tell queue it again, and consumers deduplicate on `scanId`.
    fn enqueue_once(
        &self,
        job: &ScanJob,
        _: Once<'_>,
    ) -> impl Future<Output = Result<Uuid, SendError>> + Send {
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
