//! Where jobs come from: a Valkey stream, an SQS queue or standard input,
//! behind one set of operations the worker needs (ack, extend the lease,
//! hold, retry later, dead-letter, give back).

pub mod sqs;
pub mod stdin;
pub mod stream;

use std::time::Duration;

use crate::job::ScanJob;

/// How to acknowledge one delivery.
#[derive(Debug, Clone)]
pub enum Handle {
    /// A stream entry id, pending in this consumer's list until acked.
    Stream(String),
    /// An SQS receipt handle.
    Sqs(String),
    /// A spooled line: nothing to acknowledge.
    Stdin,
}

/// One job as received.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub job: ScanJob,
    /// The job as it arrived, handed to the scanner untouched.
    pub json: String,
    pub handle: Handle,
}

/// The source chosen by `--from` (or the gate's `SCAN_QUEUE_URL`).
pub enum AnySource {
    Stream(stream::StreamSource),
    Sqs(sqs::SqsSource),
    Stdin(stdin::StdinSource),
}

impl AnySource {
    /// `stream`, `sqs` or `stdin`, for logs and the metrics' `Source` dimension.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Stream(_) => "stream",
            Self::Sqs(_) => "sqs",
            Self::Stdin(_) => "stdin",
        }
    }

    /// Up to `max` deliveries, waiting a little while for the first; `None`
    /// once the source has ended (standard input closed).
    pub async fn next(&self, max: usize) -> Result<Option<Vec<Delivery>>, String> {
        match self {
            Self::Stream(s) => s.next(max).await.map(Some),
            Self::Sqs(s) => s.next(max).await.map(Some),
            Self::Stdin(s) => s.next().await,
        }
    }

    /// The job ran (or had run): remove it from the queue.
    pub async fn ack(&self, d: &Delivery) -> Result<(), String> {
        match (self, &d.handle) {
            (Self::Stream(s), Handle::Stream(id)) => s.ack(id).await,
            (Self::Sqs(s), Handle::Sqs(receipt)) => s.delete(receipt).await,
            _ => Ok(()),
        }
    }

    /// Renews this consumer's hold on a delivery it keeps (held or running).
    pub async fn extend(&self, d: &Delivery) -> Result<(), String> {
        match (self, &d.handle) {
            (Self::Stream(s), Handle::Stream(id)) => s.extend(id).await,
            (Self::Sqs(s), Handle::Sqs(receipt)) => s.extend(receipt).await,
            _ => Ok(()),
        }
    }

    /// Asks the queue to deliver `d` again after `wait`. `true`: it will
    /// (SQS visibility), forget it; `false`: hold it in the process.
    pub async fn deliver_later(&self, d: &Delivery, wait: Duration) -> Result<bool, String> {
        match (self, &d.handle) {
            (Self::Sqs(s), Handle::Sqs(receipt)) => s.deliver_later(receipt, wait).await,
            _ => Ok(false),
        }
    }

    /// Gives up on `d` after `failures` failed hand-offs.
    pub async fn dead_letter(
        &self,
        d: &Delivery,
        failures: u32,
        error: &str,
    ) -> Result<(), String> {
        match (self, &d.handle) {
            (Self::Stream(s), Handle::Stream(id)) => s.dead_letter(id, d, failures, error).await,
            // The queue's redrive policy moves it once its receive count is
            // reached; until then it comes back after the last backoff.
            (Self::Sqs(_), Handle::Sqs(_)) => Ok(()),
            _ => {
                tracing::error!(scan_id = %d.job.scan_id, failures, error, "spooled job given up");
                Ok(())
            }
        }
    }

    /// Stopping before `d` started: leave it for another consumer.
    pub async fn give_back(&self, d: &Delivery) {
        match (self, &d.handle) {
            // Still pending under this consumer: reclaimed once its lease ends.
            (Self::Stream(_), _) => {}
            (Self::Sqs(s), Handle::Sqs(receipt)) => s.give_back(receipt, &d.job).await,
            _ => stdin::give_back(d),
        }
    }
}
