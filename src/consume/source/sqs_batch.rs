//! One Lambda SQS event's messages as a [`JobSource`], for the consumer function
//! ([`crate::front::lambda_consumer`]). Lambda deletes every message not named as a batch item
//! failure, so an ack here only marks a message done, and every message not acked is reported and
//! stays on its queue: a message not yet due is made invisible until just before its `notBefore`
//! ([`schedule::sqs_visibility`]) and then reported, and so is a failed or busy one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::sqs::{SqsSource, queue_name, read};
use super::{Delivery, GivenUp, JobSource};
use crate::consume::error::ConsumeError;
use crate::consume::schedule;
use crate::consume::sync::lock;

/// The consumer function's `Source` dimension, in its metrics and logs.
pub const SOURCE: &str = "lambda";

/// An SQS event as Lambda delivers it (the members the consumer reads).
#[derive(Debug, Clone, Deserialize)]
pub struct SqsEvent {
    #[serde(rename = "Records", default)]
    pub records: Vec<SqsRecord>,
}

/// One message of an [`SqsEvent`].
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SqsRecord {
    pub message_id: String,
    pub receipt_handle: String,
    pub body: String,
    #[serde(rename = "eventSourceARN")]
    pub event_source_arn: String,
}

/// The function's answer: the messages Lambda must leave on their queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchResponse {
    pub batch_item_failures: Vec<ItemFailure>,
}

/// One message left on its queue, by its id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemFailure {
    pub item_identifier: String,
}

/// One message of the batch: its id (the batch item), its receipt and its lane's index.
#[derive(Debug, Clone)]
pub struct Message {
    pub id: String,
    pub receipt: String,
    lane: usize,
}

/// One invocation's batch, from the queues the function reads (the scan queue and the over
/// lane's, built once per cold start).
pub struct SqsBatch {
    lanes: Arc<[SqsSource]>,
    acked: Mutex<HashSet<String>>,
}

impl SqsBatch {
    pub fn new(lanes: Arc<[SqsSource]>) -> Self {
        Self {
            lanes,
            acked: Mutex::default(),
        }
    }

    /// The batch's readable jobs from the lanes' queues; others are logged and never acked.
    pub fn deliveries(&self, records: Vec<SqsRecord>) -> Vec<Delivery<Message>> {
        let mut out = Vec::with_capacity(records.len());
        for record in records {
            let queue = queue_name(&record.event_source_arn);
            let Some(lane) = self.lanes.iter().position(|q| q.queue_name() == queue) else {
                tracing::error!(
                    message = record.message_id,
                    queue = record.event_source_arn,
                    "a message from a queue the function was not given (SCAN_QUEUE_URL, \
                     SCAN_QUEUE_OVER_URL): left on it"
                );
                continue;
            };
            let handle = Message {
                id: record.message_id.clone(),
                receipt: record.receipt_handle,
                lane,
            };
            out.extend(read(record.body, &record.message_id, handle));
        }
        out
    }

    /// The answer for the messages `ids`: each one not acked is a failure.
    pub fn response<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> BatchResponse {
        let acked = lock(&self.acked);
        let batch_item_failures = ids
            .into_iter()
            .filter(|id| !acked.contains(*id))
            .map(|id| ItemFailure {
                item_identifier: id.to_owned(),
            })
            .collect();
        BatchResponse {
            batch_item_failures,
        }
    }

    fn queue(&self, d: &Delivery<Message>) -> &SqsSource {
        // `deliveries` only hands out messages of a known lane.
        &self.lanes[d.handle.lane]
    }

    /// Invisible for `secs`; if that fails, it returns after the queue's visibility timeout.
    async fn hold(&self, d: &Delivery<Message>, secs: i32) {
        if let Err(e) = self.queue(d).visibility(&d.handle.receipt, secs).await {
            tracing::warn!(scan_id = %d.job.scan_id, error = %e, "cannot change a message's visibility; it comes back after the queue's visibility timeout");
        }
    }
}

impl JobSource for SqsBatch {
    type Handle = Message;

    fn name(&self) -> &'static str {
        SOURCE
    }

    /// Lambda hands the batch over in one event: there is nothing to read.
    async fn next(&self, _max: usize) -> Result<Option<Vec<Delivery<Message>>>, ConsumeError> {
        Ok(None)
    }

    /// Done: Lambda deletes it, once the invocation answers without naming it.
    async fn ack(&self, d: &Delivery<Message>) -> Result<(), ConsumeError> {
        lock(&self.acked).insert(d.handle.id.clone());
        Ok(())
    }

    async fn extend(&self, d: &Delivery<Message>) -> Result<(), ConsumeError> {
        self.queue(d).renew(&d.handle.receipt).await
    }

    /// Invisible until just before `wait` has passed, never acked; `false` under a second.
    async fn deliver_later(
        &self,
        d: &Delivery<Message>,
        wait: Duration,
    ) -> Result<bool, ConsumeError> {
        let Some(secs) = schedule::sqs_visibility(wait) else {
            return Ok(false);
        };
        self.hold(d, secs).await;
        Ok(true)
    }

    /// The queue's redrive policy moves it after `maxReceiveCount` receives.
    async fn dead_letter(&self, _: &Delivery<Message>, _: GivenUp<'_>) -> Result<(), ConsumeError> {
        Ok(())
    }

    /// Visible again now, or when its `notBefore` comes.
    async fn give_back(&self, d: &Delivery<Message>, wait: Duration) {
        self.hold(d, schedule::sqs_visibility(wait).unwrap_or(0))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record's members as Lambda names them; the answer as Lambda reads it.
    #[test]
    fn event_and_answer_shapes() {
        let event: SqsEvent = serde_json::from_str(
            r#"{"Records":[{"messageId":"m-1","receiptHandle":"r","body":"{}",
                "attributes":{"ApproximateReceiveCount":"1"},"messageAttributes":{},
                "md5OfBody":"x","eventSource":"aws:sqs",
                "eventSourceARN":"arn:aws:sqs:us-east-1:123456789012:scans","awsRegion":"us-east-1"}]}"#,
        )
        .unwrap();
        assert_eq!(event.records[0].message_id, "m-1");
        assert_eq!(queue_name(&event.records[0].event_source_arn), "scans");
        let answer = BatchResponse {
            batch_item_failures: vec![ItemFailure {
                item_identifier: "m-1".into(),
            }],
        };
        assert_eq!(
            serde_json::to_string(&answer).unwrap(),
            r#"{"batchItemFailures":[{"itemIdentifier":"m-1"}]}"#
        );
    }
}
