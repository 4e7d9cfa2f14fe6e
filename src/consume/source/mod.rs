//! Where jobs come from, behind the one [`JobSource`] trait the worker is generic over. Each source
//! has its own handle type, so a delivery can only be acknowledged by the source it came from.

pub mod input;
pub mod journal;
pub mod sqs;
pub mod sqs_batch;
pub mod stdin;
pub mod stream;

use std::future::Future;
use std::time::Duration;

use super::error::ConsumeError;
use crate::rules::job::{JobError, ScanJob};

/// One job as received.
#[derive(Debug, Clone)]
pub struct Delivery<H = ()> {
    pub job: ScanJob,
    /// The job as it arrived, handed to the scanner untouched.
    pub json: String,
    /// How the source acknowledges it.
    pub handle: H,
}

impl<H> Delivery<H> {
    /// The job `json` holds, received as `handle`.
    pub fn read(json: String, handle: H) -> Result<Self, JobError> {
        let job = ScanJob::from_json(&json)?;
        Ok(Self { job, json, handle })
    }
}

impl Delivery {
    /// The job on a spool line (standard input, its journal): a line without a `scanId` (an EMF
    /// line) is none, and an unreadable job is logged and skipped.
    pub fn of_spool_line(line: String) -> Option<Self> {
        if !line.contains("\"scanId\"") {
            return None;
        }
        let skipped = |e: &_| tracing::error!(error = %e, "unreadable job line skipped");
        Self::read(line, ()).inspect_err(skipped).ok()
    }
}

/// Why a delivery is given up: how many hand-offs failed, and the last error.
#[derive(Debug, Clone, Copy)]
pub struct GivenUp<'a> {
    pub failures: u32,
    pub error: &'a str,
}

/// A queue the consumer reads: the operations the worker needs.
pub trait JobSource: Send + Sync + 'static {
    /// How one delivery is acknowledged (a stream entry id, an SQS receipt).
    type Handle: Clone + Send + Sync + 'static;

    /// `stream`, `sqs` or `stdin`, for logs and the metrics' `Source` dimension.
    fn name(&self) -> &'static str;

    /// Up to `max` deliveries, waiting a little for the first; `None` once the source has ended.
    fn next(
        &self,
        max: usize,
    ) -> impl Future<Output = Result<Option<Vec<Delivery<Self::Handle>>>, ConsumeError>> + Send;

    /// The job ran (or had run): remove it from the queue.
    fn ack(
        &self,
        d: &Delivery<Self::Handle>,
    ) -> impl Future<Output = Result<(), ConsumeError>> + Send;

    /// `d`'s stream and entry id, which a new attempt checks is still there
    /// ([`super::marker::MarkerStore::claim`]); none for other queues.
    fn entry<'d>(&'d self, _d: &'d Delivery<Self::Handle>) -> Option<(&'d str, &'d str)> {
        None
    }

    /// Renews this consumer's hold on a delivery it keeps (held or running).
    fn extend(
        &self,
        d: &Delivery<Self::Handle>,
    ) -> impl Future<Output = Result<(), ConsumeError>> + Send;

    /// Asks the queue to deliver `d` again after `wait`: `true` if it will (SQS), else hold it.
    fn deliver_later(
        &self,
        _d: &Delivery<Self::Handle>,
        _wait: Duration,
    ) -> impl Future<Output = Result<bool, ConsumeError>> + Send {
        async { Ok(false) }
    }

    /// Attempt `attempt` at `d` is about to start (the journal records it for a replay).
    fn started(
        &self,
        _d: &Delivery<Self::Handle>,
        _attempt: u64,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Gives up on `d`, for the reason `why`.
    fn dead_letter(
        &self,
        d: &Delivery<Self::Handle>,
        why: GivenUp<'_>,
    ) -> impl Future<Output = Result<(), ConsumeError>> + Send;

    /// Stopping before `d` started: leave it to another consumer; `wait` is left until `notBefore`.
    fn give_back(
        &self,
        d: &Delivery<Self::Handle>,
        wait: Duration,
    ) -> impl Future<Output = ()> + Send;

    /// Stopping: the deliveries the source read ahead but did not hand out, to be given back too.
    fn drain(&self) -> impl Future<Output = Vec<Delivery<Self::Handle>>> + Send {
        async { Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub const JOB: &str = r#"{"version":1,"scanId":"01a22ae3-0721-75a3-a454-7957ef912430","receivedAt":"2026-11-30T12:00:00.000Z","scope":"ip","digest":"d","tier":"soft","limit":1,"count":2,"delayMs":300,"deferredMs":300,"notBefore":"2026-11-30T12:00:00.300Z","request":{"image":"a"}}"#;

    /// EMF lines pass by; job lines become deliveries; broken job lines are skipped.
    #[test]
    fn lines() {
        assert!(Delivery::of_spool_line(r#"{"_aws":{"Timestamp":1}}"#.into()).is_none());
        assert!(Delivery::of_spool_line(r#"{"scanId":"nope"}"#.into()).is_none());
        let d = Delivery::of_spool_line(JOB.into()).unwrap();
        assert_eq!(d.job.not_before_ms % 1000, 300);
        assert_eq!(d.json, JOB);
    }
}
