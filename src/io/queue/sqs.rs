//! An Amazon SQS queue as the scan queue: one `SendMessage` per accepted scan, the [`ScanJob`] as
//! JSON body, with `scope` and `tier` message attributes to route by without parsing it.
//! `DelaySeconds` holds the message back by the deferred part of the delay (so standard queues
//! only: FIFO refuses it). An over-quota job goes to `SCAN_QUEUE_OVER_URL` when set, so a consumer
//! always reaches a due within-quota job, with its tenant as `MessageGroupId`, so SQS fair queues
//! keep one tenant's backlog from crowding out the others'.

use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_sqs::Client;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::error::{DisplayErrorContext, SdkError};
use aws_sdk_sqs::operation::send_message::builders::SendMessageFluentBuilder;
use aws_sdk_sqs::types::{
    MessageAttributeValue, MessageSystemAttributeNameForSends, MessageSystemAttributeValue,
};

use super::job_queue::{ENQUEUE_TIMEOUT, ScanQueue, SendError};
use crate::rules::delay::MAX_QUEUE_DEFERRAL;
use crate::rules::job::{Lane, ScanJob};
use crate::rules::trace::{TRACEPARENT, TRACESTATE};

/// A connect that takes a second means the network path is broken.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Attempts per `SendMessage`: an SDK re-send after a timeout or a broken connection could queue
/// the message twice. A keyed scan's retry is the only re-send; consumers deduplicate on `scanId`.
const MAX_ATTEMPTS: u32 = 1;

#[derive(Clone, Debug)]
pub struct SqsQueue {
    client: Client,
    url: String,
    /// The over lane's queue (`None`: the lanes share `url`).
    over_url: Option<String>,
}

impl SqsQueue {
    /// A queue at `url`, with a client built from `sdk` (region, credentials, `AWS_ENDPOINT_URL`).
    pub fn new(sdk: &SdkConfig, url: impl Into<String>) -> Self {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .operation_timeout(ENQUEUE_TIMEOUT)
            .build();
        let config = aws_sdk_sqs::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS))
            .build();
        Self {
            client: Client::from_conf(config),
            url: url.into(),
            over_url: None,
        }
    }

    /// Over-quota jobs go to `url` instead (`None`: the same queue).
    pub fn with_over_lane(mut self, url: Option<String>) -> Self {
        self.over_url = url;
        self
    }

    /// The queue URL (the tests check which queue the variables chose).
    #[cfg(feature = "testing")]
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// `DelaySeconds` for a deferral: rounded up, lest the scan start before its delay has passed;
/// capped at SQS's 900 s (the job's `notBefore` still carries a longer one whole).
pub fn delay_seconds(deferred: Duration) -> i32 {
    let secs = deferred.as_nanos().div_ceil(1_000_000_000);
    let capped = secs.min(u128::from(MAX_QUEUE_DEFERRAL.as_secs()));
    // At most 900, so the conversion cannot fail.
    i32::try_from(capped).unwrap_or(i32::MAX)
}

fn string_attribute(value: &str) -> Result<MessageAttributeValue, SendError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .map_err(|e| SendError::NotSent(e.to_string()))
}

/// The job's trace on the message: the `AWSTraceHeader` system attribute (what X-Ray and an
/// SQS-triggered Lambda continue from), and `traceparent`/`tracestate` for any other consumer.
fn traced(
    send: SendMessageFluentBuilder,
    job: &ScanJob,
) -> Result<SendMessageFluentBuilder, SendError> {
    let Some(trace) = &job.trace else {
        return Ok(send);
    };
    let header = MessageSystemAttributeValue::builder()
        .data_type("String")
        .string_value(trace.xray_header().as_str())
        .build()
        .map_err(|e| SendError::NotSent(e.to_string()))?;
    let send = send
        .message_system_attributes(MessageSystemAttributeNameForSends::AwsTraceHeader, header)
        .message_attributes(TRACEPARENT, string_attribute(trace.traceparent().as_str())?);
    Ok(match trace.tracestate() {
        Some(state) => send.message_attributes(TRACESTATE, string_attribute(state)?),
        None => send,
    })
}

impl ScanQueue for SqsQueue {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), SendError> {
        let body = serde_json::to_string(job).map_err(|e| SendError::NotSent(e.to_string()))?;
        let over = job.lane() == Lane::Over;
        let url = self.over_url.as_ref().filter(|_| over).unwrap_or(&self.url);
        let group = over.then(|| job.tenant().to_owned());
        let send = self
            .client
            .send_message()
            .queue_url(url)
            .set_message_group_id(group)
            .message_body(body)
            .delay_seconds(delay_seconds(job.deferred()))
            .message_attributes("scope", string_attribute(job.scope.as_str())?)
            .message_attributes("tier", string_attribute(job.tier.as_str())?);
        traced(send, job)?.send().await.map_err(queue_error)?;
        Ok(())
    }
}

/// Sorts a failed `SendMessage` by whether its message may be queued. Not queued: SQS answered an
/// error, the request could not be built, or no connection was made. May land: it timed out, its
/// answer was unreadable, or its connection broke after the request may have been written.
fn queue_error<E, R>(e: SdkError<E, R>) -> SendError
where
    E: std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let sent = match &e {
        SdkError::TimeoutError(_) | SdkError::ResponseError(_) => true,
        SdkError::DispatchFailure(d) => {
            !d.is_user() && !d.is_timeout() && !d.as_connector_error().is_some_and(|c| refused(c))
        }
        _ => false,
    };
    // The context chain names the cause; the URL is not secret.
    match e {
        _ if sent => SendError::Unanswered,
        SdkError::ServiceError(_) => SendError::Refused(DisplayErrorContext(&e).to_string()),
        _ => SendError::NotSent(DisplayErrorContext(&e).to_string()),
    }
}

/// Whether a connector error is a refused connect: nothing was written.
fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source()).any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DelaySeconds rounds every started second up and never exceeds 900.
    #[test]
    fn delay_seconds_rounds_up_and_caps() {
        let ms = Duration::from_millis;
        assert_eq!(delay_seconds(Duration::ZERO), 0);
        assert_eq!(delay_seconds(ms(1)), 1);
        assert_eq!(delay_seconds(ms(999)), 1);
        assert_eq!(delay_seconds(ms(1000)), 1);
        assert_eq!(delay_seconds(ms(1001)), 2);
        assert_eq!(delay_seconds(ms(32_000)), 32);
        assert_eq!(delay_seconds(ms(60_000)), 60);
        assert_eq!(delay_seconds(Duration::new(31, 1)), 32);
        assert_eq!(delay_seconds(ms(899_001)), 900);
        assert_eq!(delay_seconds(ms(900_000)), 900);
        assert_eq!(delay_seconds(ms(3_600_000)), 900);
        assert_eq!(delay_seconds(Duration::MAX), 900);
    }

    proptest::proptest! {
        /// The message is never released before the deferral, nor a second later than needed.
        #[test]
        fn never_early(ms in 0u64..=900_000) {
            let d = Duration::from_millis(ms);
            let s = u64::try_from(delay_seconds(d)).unwrap_or(0);
            proptest::prop_assert!(Duration::from_secs(s) >= d);
            proptest::prop_assert!(Duration::from_secs(s) < d + Duration::from_secs(1));
        }
    }
}
