//! What every scan queue is: the [`ScanQueue`] trait, and the
//! [`ENQUEUE_TIMEOUT`] the queues bound their sends by. A failed enqueue
//! is a [`SendError`], as a failed store call is: never sent (not queued),
//! sent and unanswered (the job may still land), or refused.

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

pub use crate::io::connection::SendError;
use crate::rules::job::ScanJob;
use crate::rules::unix::UnixSecs;

/// The longest an enqueue may take before the scan is refunded and refused
/// (less when the gateway or Lambda deadline is nearer). It lives with the
/// queues, which bound their own sends by it; the gate imports it.
pub const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// A scan queue.
pub trait ScanQueue: Send + Sync + 'static {
    /// Queues `job`, held back by `job.deferred_ms` where the backend can.
    fn enqueue(&self, job: &ScanJob) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Queues a keyed scan's `job` unless its record's job was queued
    /// before, under this `scanId` or another (an attempt whose claim a
    /// failover lost may have landed its job on the new primary); the
    /// `scanId` the record's job is queued under. Backends that cannot tell
    /// queue it again, and consumers deduplicate on `scanId`.
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
