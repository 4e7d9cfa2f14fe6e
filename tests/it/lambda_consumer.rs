//! The consumer function (`QUOTA_ROLE=consume`) against a real moto and a
//! real Valkey: messages received from moto's queues are made into the SQS
//! events Lambda delivers, handed to the function's handler in-process, and
//! what Lambda would do with the answer (delete every message it does not
//! name) is done here. A scanner stub on a local port answers the POSTs.

use quota_gate_testkit as common;

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::{Message, QueueAttributeName};
use common::consumer::{job_for, now_ms};
use common::moto::MotoServer;
use common::{Capture, ValkeyServer, config};
use quota_gate::consume::meter::ConsumeMeter;
use quota_gate::consume::source::sqs_batch::{BatchResponse, SOURCE, SqsEvent};
use quota_gate::front::lambda_consumer::Consumer;
use quota_gate::io::meter::emf::Sink;
use serde_json::{Value, json};

/// One POST the scanner stub took: when (unix ms), and the request.
#[derive(Debug, Clone)]
struct Posted {
    at_ms: i64,
    request: String,
}

/// A scanner on a local port: 500 for an image named `…scanner-refuses…`,
/// an answer 10 s late for `…scanner-hangs…`, else 204.
fn scanner() -> (String, Arc<Mutex<Vec<Posted>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/scan", listener.local_addr().unwrap());
    let posted = Arc::new(Mutex::new(Vec::new()));
    let seen = posted.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let mut conn = conn.unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !String::from_utf8_lossy(&buf).contains("\"request\"") {
                let n = conn.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            let request = String::from_utf8_lossy(&buf).into_owned();
            let status = if request.contains("scanner-refuses") {
                "500 Internal Server Error"
            } else {
                "204 No Content"
            };
            let at_ms = now_ms();
            let hangs = request.contains("scanner-hangs");
            seen.lock().unwrap().push(Posted { at_ms, request });
            std::thread::spawn(move || {
                if hangs {
                    std::thread::sleep(Duration::from_secs(10));
                }
                let _ = write!(conn, "HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
            });
        }
    });
    (url, posted)
}

/// moto, Valkey, the two lanes' queues, the scanner stub and the function.
struct Rig {
    _moto: MotoServer,
    _valkey: ValkeyServer,
    sqs: Client,
    within: String,
    over: String,
    posted: Arc<Mutex<Vec<Posted>>>,
    emf: Capture,
    consumer: Consumer,
}

impl Rig {
    async fn start() -> Self {
        let moto = MotoServer::start();
        let valkey = ValkeyServer::start();
        let within = moto.create_queue("scans").await;
        let over = moto.create_queue("scans-over").await;
        let sdk = moto.sdk_config().await;
        let (url, posted) = scanner();
        let config = config(&[
            ("SCAN_QUEUE_URL", within.as_str()),
            ("SCAN_QUEUE_OVER_URL", over.as_str()),
            ("VALKEY_URL", valkey.url().as_str()),
        ]);
        let emf = Capture::default();
        let sink = Sink::sync(Box::new(emf.clone()));
        let meter = ConsumeMeter::with_sink("StellaOps/Quota", SOURCE, Some(sink));
        let consumer = Consumer::new(&config, &url, &sdk, meter).unwrap();
        Self {
            sqs: Client::new(&sdk),
            _moto: moto,
            _valkey: valkey,
            within,
            over,
            posted,
            emf,
            consumer,
        }
    }

    async fn send(&self, queue: &str, job: &Value) {
        let body = job.to_string();
        let send = self.sqs.send_message().queue_url(queue).message_body(body);
        send.send().await.unwrap();
    }

    /// Up to 10 messages, each invisible for 2 s, as the event source receives them.
    async fn receive(&self, queue: &str) -> Vec<Message> {
        let received = self.sqs.receive_message().queue_url(queue);
        let received = received.max_number_of_messages(10).visibility_timeout(2);
        let received = received.wait_time_seconds(1).send().await.unwrap();
        received.messages.unwrap_or_default()
    }

    async fn arn(&self, queue: &str) -> String {
        let attrs = self.sqs.get_queue_attributes().queue_url(queue);
        let attrs = attrs.attribute_names(QueueAttributeName::QueueArn);
        let attrs = attrs.send().await.unwrap().attributes.unwrap();
        attrs[&QueueAttributeName::QueueArn].clone()
    }

    /// Lambda's part: the event of `messages`, the invocation, then every
    /// message the answer does not name deleted.
    async fn invoke(&self, queue: &str, messages: &[Message]) -> BatchResponse {
        let arn = self.arn(queue).await;
        let records: Vec<Value> = messages
            .iter()
            .map(|m| {
                json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(),
                    "body": m.body(), "attributes": {"ApproximateReceiveCount": "1"},
                    "messageAttributes": {}, "md5OfBody": m.md5_of_body(),
                    "eventSource": "aws:sqs", "eventSourceARN": arn, "awsRegion": "us-east-1"})
            })
            .collect();
        let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
        let answer = self
            .consumer
            .handle(event, Some(Duration::from_secs(60)))
            .await;
        for m in messages {
            if !failed(&answer).contains(&m.message_id().unwrap().to_owned()) {
                let delete = self.sqs.delete_message().queue_url(queue);
                let delete = delete.receipt_handle(m.receipt_handle().unwrap());
                delete.send().await.unwrap();
            }
        }
        answer
    }

    /// The POSTs the scanner took for `job`.
    fn posts_of(&self, job: &Value) -> Vec<Posted> {
        let id = job["scanId"].as_str().unwrap();
        let posted = self.posted.lock().unwrap();
        posted
            .iter()
            .filter(|p| p.request.contains(id))
            .cloned()
            .collect()
    }
}

fn failed(answer: &BatchResponse) -> Vec<String> {
    let failures = answer.batch_item_failures.iter();
    failures.map(|f| f.item_identifier.clone()).collect()
}

fn id_of<'a>(messages: &'a [Message], job: &Value) -> &'a str {
    let id = job["scanId"].as_str().unwrap();
    let m = messages.iter().find(|m| m.body().unwrap().contains(id));
    m.unwrap().message_id().unwrap()
}

fn job_in(lane: &str, image: &str, not_before_ms: i64) -> Value {
    let mut job = job_for(image, not_before_ms);
    job["lane"] = json!(lane);
    job
}

/// A due within-quota job is POSTed to the scanner and deleted; a failing
/// one (scanner 500) and a not-yet-due one are batch item failures, the
/// not-due one held invisible by visibility; a second delivery of the done
/// job is acked without running it; a job due in 2.5 s starts no sooner.
#[tokio::test(flavor = "multi_thread")]
async fn the_function_runs_each_job_once_and_never_early() {
    let rig = Rig::start().await;
    let due = job_in("within", "alpine:3.20", now_ms());
    let failing = job_in("within", "scanner-refuses:1", now_ms());
    let later = job_in("over", "alpine:3.20", now_ms() + 3_600_000);
    for (queue, job) in [
        (&rig.within, &due),
        (&rig.within, &failing),
        (&rig.over, &later),
    ] {
        rig.send(queue, job).await;
    }
    let batch = rig.receive(&rig.within).await;
    assert_eq!(batch.len(), 2, "{batch:?}");
    let answer = rig.invoke(&rig.within, &batch).await;
    assert_eq!(failed(&answer), [id_of(&batch, &failing)], "{answer:?}");
    let posts = rig.posts_of(&due);
    assert_eq!(posts.len(), 1, "the within-quota job is posted once");
    assert!(
        posts[0].request.starts_with("POST /scan HTTP/1.1"),
        "{posts:?}"
    );
    let header = format!("x-scan-id: {}", due["scanId"].as_str().unwrap());
    assert!(
        posts[0].request.to_lowercase().contains(&header),
        "{posts:?}"
    );
    assert_eq!(rig.posts_of(&failing).len(), 1, "the 500 was one attempt");

    // Not due: a failure, and invisible well past the 2 s the receive gave it.
    let batch = rig.receive(&rig.over).await;
    let answer = rig.invoke(&rig.over, &batch).await;
    assert_eq!(failed(&answer), [id_of(&batch, &later)], "{answer:?}");
    assert!(
        rig.posts_of(&later).is_empty(),
        "started before its notBefore"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        rig.receive(&rig.over).await.is_empty(),
        "the hold did not hold"
    );

    // The done job delivered again: acked (not named), not run.
    rig.send(&rig.within, &due).await;
    let again = rig.receive(&rig.within).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(failed(&rig.invoke(&rig.within, &again).await).is_empty());
    assert_eq!(rig.posts_of(&due).len(), 1, "a duplicate ran");

    let emf = rig.emf.text();
    for metric in [
        "stella_consumer_jobs_started_total",
        "stella_consumer_jobs_failed_total",
        "stella_consumer_duplicates_total",
    ] {
        assert!(emf.contains(metric), "no {metric} line: {emf}");
    }
    assert!(emf.contains(r#""Lane":"within""#), "{emf}");
    assert!(emf.contains(r#""Source":"lambda""#), "{emf}");
}

/// A job due in 2.5 s: the first invocation holds it (a failure, invisible
/// for the 2 whole seconds), the next one runs it, not before its notBefore.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_held_by_visibility_starts_on_time() {
    let rig = Rig::start().await;
    let not_before = now_ms() + 2_500;
    let soon = job_in("over", "alpine:3.20", not_before);
    rig.send(&rig.over, &soon).await;
    let batch = rig.receive(&rig.over).await;
    assert_eq!(failed(&rig.invoke(&rig.over, &batch).await).len(), 1);
    let mut runs = 0;
    while rig.posts_of(&soon).is_empty() {
        runs += 1;
        assert!(runs < 20, "never ran");
        let batch = rig.receive(&rig.over).await;
        if !batch.is_empty() {
            assert!(failed(&rig.invoke(&rig.over, &batch).await).is_empty());
        }
    }
    let posts = rig.posts_of(&soon);
    assert_eq!(posts.len(), 1);
    let late_ms = posts[0].at_ms - not_before;
    assert!(late_ms >= 0, "started {} ms early", -late_ms);
    assert!(late_ms < 2_000, "started {late_ms} ms late");
}

/// The sample SQS events (`events/sqs-*.json`, the bytes `scripts/invoke-events`
/// replays) answer as `events/README.md` says, against moto queues of the
/// names their ARNs give: the due job runs, its second delivery is acked
/// without running, the rest are batch item failures.
#[tokio::test(flavor = "multi_thread")]
async fn sample_events() {
    let rig = Rig::start().await;
    for (name, fails) in [
        ("sqs-due.json", false),
        ("sqs-duplicate.json", false),
        ("sqs-not-due.json", true),
        ("sqs-scanner-5xx.json", true),
        ("sqs-not-a-job.json", true),
    ] {
        let text = std::fs::read_to_string(common::root().join("events").join(name)).unwrap();
        let event: SqsEvent = serde_json::from_str(&text).unwrap();
        let ids: Vec<String> = event.records.iter().map(|r| r.message_id.clone()).collect();
        let answer = rig.consumer.handle(event, None).await;
        let expected = if fails { ids } else { Vec::new() };
        assert_eq!(failed(&answer), expected, "{name}");
    }
    let due = json!({"scanId": "0193a1b2-7c3d-7e4f-8a5b-6c7d8e9f0a01"});
    assert_eq!(rig.posts_of(&due).len(), 1, "the due job ran once");
    let posted = rig.posted.lock().unwrap().len();
    assert_eq!(posted, 2, "the due job and the refused one, nothing else");
}

/// Near the invocation's deadline a running hand-off is stopped: the
/// invocation answers in time, naming the message (given back, its marker
/// released), instead of Lambda timing out the whole batch.
#[tokio::test(flavor = "multi_thread")]
async fn a_scan_past_the_deadline_is_given_back_in_time() {
    let rig = Rig::start().await;
    let hangs = job_in("within", "scanner-hangs:1", now_ms());
    rig.send(&rig.within, &hangs).await;
    let batch = rig.receive(&rig.within).await;
    let records: Vec<Value> = batch
        .iter()
        .map(|m| {
            json!({"messageId": m.message_id(), "receiptHandle": m.receipt_handle(),
            "body": m.body(), "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:scans"})
        })
        .collect();
    let event: SqsEvent = serde_json::from_value(json!({ "Records": records })).unwrap();
    let started = std::time::Instant::now();
    // 6 s left: the scan is stopped 5 s before the deadline, after 1 s.
    let answer = rig
        .consumer
        .handle(event, Some(Duration::from_secs(6)))
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(failed(&answer), [id_of(&batch, &hangs)]);
    assert_eq!(rig.posts_of(&hangs).len(), 1);
    // Given back at once and its marker released: the next invocation runs it again.
    let again = rig.receive(&rig.within).await;
    assert_eq!(again.len(), 1, "not given back");
}
