//! An SQS queue, long-polled. A received message stays invisible for one lease, renewed every
//! quarter lease while held, and is deleted after its scan succeeded. A job not yet due (a deferral
//! longer than `DelaySeconds`' 900 s, or clocks disagreeing) or waiting out a backoff is held by
//! its visibility (`schedule::sqs_visibility`); after `maxReceiveCount` receives, holds included,
//! the redrive policy moves it to the dead-letter queue.

use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::error::DisplayErrorContext;

use super::{Delivery, GivenUp, JobSource};
use crate::consume::error::ConsumeError;
use crate::consume::schedule;

/// The long poll: `ReceiveMessage` waits this long for a first message.
const WAIT_SECS: i32 = 5;

/// One consumer of one queue.
pub struct SqsSource {
    client: Client,
    url: String,
    lease_secs: i32,
}

fn sdk_err<E: std::error::Error + 'static>(e: E) -> ConsumeError {
    ConsumeError::Sqs(DisplayErrorContext(&e).to_string())
}

impl SqsSource {
    pub fn new(sdk: &aws_config::SdkConfig, url: &str, lease: Duration) -> Self {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(2))
            .operation_attempt_timeout(Duration::from_secs(WAIT_SECS as u64 + 5))
            .build();
        let config = aws_sdk_sqs::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .build();
        let lease_secs =
            i32::try_from(lease.as_secs().clamp(1, schedule::MAX_VISIBILITY_SECS)).unwrap_or(30);
        Self {
            client: Client::from_conf(config),
            url: url.to_owned(),
            lease_secs,
        }
    }

    /// Up to `max` (at most 10) messages; unreadable bodies are left to the redrive policy.
    async fn receive(&self, max: usize) -> Result<Vec<Delivery<String>>, ConsumeError> {
        let max = i32::try_from(max.clamp(1, 10)).unwrap_or(10);
        let received = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(max)
            .wait_time_seconds(WAIT_SECS)
            .visibility_timeout(self.lease_secs)
            .send()
            .await
            .map_err(sdk_err)?;
        let mut out = Vec::new();
        for m in received.messages.unwrap_or_default() {
            if let (Some(body), Some(receipt)) = (m.body, m.receipt_handle) {
                out.extend(read(body, &m.message_id.unwrap_or_default(), receipt));
            }
        }
        Ok(out)
    }

    /// Makes the message of `receipt` invisible for `secs` from now (0: visible again at once).
    pub async fn visibility(&self, receipt: &str, secs: i32) -> Result<(), ConsumeError> {
        self.client
            .change_message_visibility()
            .queue_url(&self.url)
            .receipt_handle(receipt)
            .visibility_timeout(secs)
            .send()
            .await
            .map(drop)
            .map_err(sdk_err)
    }

    /// The message of `receipt` invisible for another lease from now.
    pub async fn renew(&self, receipt: &str) -> Result<(), ConsumeError> {
        self.visibility(receipt, self.lease_secs).await
    }

    pub fn queue_name(&self) -> &str {
        queue_name(&self.url)
    }
}

/// The job in the `body` of the SQS message `id`, received as `handle`; an unreadable one is
/// logged, left to the redrive policy.
pub fn read<H>(body: String, id: &str, handle: H) -> Option<Delivery<H>> {
    Delivery::read(body, handle).inspect_err(|e| {
        tracing::error!(message = id, error = %e, "unreadable SQS message: left to the redrive policy");
    })
    .ok()
}

/// The queue's name: the last segment of its URL (`…/<account>/<name>`) or ARN (`…:<name>`).
pub fn queue_name(url_or_arn: &str) -> &str {
    url_or_arn.rsplit(['/', ':']).next().unwrap_or(url_or_arn)
}

impl JobSource for SqsSource {
    type Handle = String;

    fn name(&self) -> &'static str {
        "sqs"
    }

    async fn next(&self, max: usize) -> Result<Option<Vec<Delivery<String>>>, ConsumeError> {
        self.receive(max).await.map(Some)
    }

    async fn ack(&self, d: &Delivery<String>) -> Result<(), ConsumeError> {
        self.client
            .delete_message()
            .queue_url(&self.url)
            .receipt_handle(&d.handle)
            .send()
            .await
            .map(drop)
            .map_err(sdk_err)
    }

    async fn extend(&self, d: &Delivery<String>) -> Result<(), ConsumeError> {
        self.renew(&d.handle).await
    }

    /// Invisible until just before `wait` has passed; `false` under a second (waited in memory).
    async fn deliver_later(
        &self,
        d: &Delivery<String>,
        wait: Duration,
    ) -> Result<bool, ConsumeError> {
        match schedule::sqs_visibility(wait) {
            None => Ok(false),
            Some(secs) => self.visibility(&d.handle, secs).await.map(|()| true),
        }
    }

    /// The redrive policy moves it once its receive count is reached; until then it comes back.
    async fn dead_letter(&self, _: &Delivery<String>, _: GivenUp<'_>) -> Result<(), ConsumeError> {
        Ok(())
    }

    /// Visible again now, or when its `notBefore` comes, for any consumer.
    async fn give_back(&self, d: &Delivery<String>, wait: Duration) {
        let secs = schedule::sqs_visibility(wait).unwrap_or(0);
        if let Err(e) = self.visibility(&d.handle, secs).await {
            tracing::warn!(scan_id = %d.job.scan_id, error = %e, "cannot give a message back; it returns after its lease");
        }
    }
}
