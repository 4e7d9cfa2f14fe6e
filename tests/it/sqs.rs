//! The SQS scan queue against a real moto server, with a real Valkey as the
//! quota store: one message per 202, the job as its body, `DelaySeconds` as
//! the deferred part of the delay, and refunds when the queue fails.
//!
//! The SQS API never returns a message's `DelaySeconds`, so the tests read
//! it from moto's own state (`/moto-api/data.json`: `delayed_until −
//! sent_timestamp`), and one test also shows a delayed message really stays
//! invisible until its delay has passed.

use quota_gate_testkit as common;

use std::time::{Duration, Instant};

use aws_config::SdkConfig;
use aws_sdk_sqs::types::{Message, QueueAttributeName};
use common::moto::MotoServer;
use common::*;
use quota_gate::gate::{ENQUEUE_TIMEOUT, Gate};
use quota_gate::io::connection::Valkey;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::sqs::SqsQueue;
use quota_gate::io::store::valkey::ValkeyStore;
use redis::AsyncCommands;
use serde_json::{Value, json};

const IMAGE: &str = "registry.example.com/team/app:1.4.2";

/// A Valkey server, a moto server and a standard queue on it.
struct Rig {
    valkey: ValkeyServer,
    moto: MotoServer,
    sdk: SdkConfig,
    sqs: aws_sdk_sqs::Client,
    queue_url: String,
}

impl Rig {
    async fn start() -> Self {
        let valkey = ValkeyServer::start();
        let moto = MotoServer::start();
        let sdk = moto.sdk_config().await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let queue_url = moto.create_queue("scans").await;
        Self {
            valkey,
            moto,
            sdk,
            sqs,
            queue_url,
        }
    }

    /// A gate counting on the rig's Valkey and sending to `queue_url`.
    fn gate(&self, queue_url: &str, vars: &[(&str, &str)]) -> Gate<ValkeyStore, SqsQueue> {
        let url = self.valkey.url();
        // A debug build on a busy CI machine: leave the store some slack.
        let mut all = vec![
            ("VALKEY_URL", url.as_str()),
            ("SCAN_QUEUE_URL", queue_url),
            ("QUOTA_STORE_TIMEOUT_MS", "1000"),
        ];
        all.extend_from_slice(vars);
        let config = config(&all);
        let valkey = Valkey::new(&url, false, config.store.timeout).unwrap();
        Gate::new(
            config,
            ValkeyStore::new(valkey),
            SqsQueue::new(&self.sdk, queue_url),
            Meter::new("test", None),
        )
        .unwrap()
    }

    /// The counter of the one anonymous subject there is, if any.
    async fn counter(&self) -> Option<u64> {
        let mut c = self.valkey.client().await;
        let keys: Vec<String> = c.keys("quota:ip:{*}").await.unwrap();
        let counters: Vec<&String> = keys.iter().filter(|k| !k.ends_with(":ts")).collect();
        assert!(counters.len() <= 1, "{counters:?}");
        match counters.first() {
            Some(k) => c.get(*k).await.unwrap(),
            None => None,
        }
    }

    /// A queue URL on the rig's moto that names no queue.
    fn missing_queue_url(&self) -> String {
        format!("{}/123456789012/no-such-queue", self.moto.endpoint())
    }

    /// What a consumer receives now, attributes included (long polling for
    /// up to `wait` seconds while nothing is visible).
    async fn receive(&self, wait: i32) -> Vec<Message> {
        self.sqs
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(10)
            .message_attribute_names("All")
            .wait_time_seconds(wait)
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default()
    }

    async fn queue_attribute(&self, name: QueueAttributeName) -> u64 {
        let out = self
            .sqs
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(name.clone())
            .send()
            .await
            .unwrap();
        out.attributes.unwrap()[&name].parse().unwrap()
    }
}

/// The `DelaySeconds` moto applied to a message (0 when none).
fn applied_delay_seconds(message: &Value) -> u64 {
    let until = message["delayed_until"].as_f64().unwrap();
    if until == 0.0 {
        return 0;
    }
    let sent = message["sent_timestamp"].as_f64().unwrap();
    // moto stamps `sent` and then computes `until = now + 1000·DelaySeconds`:
    // the difference is the delay plus well under a second of bookkeeping.
    ((until - sent) / 1000.0).floor() as u64
}

/// The job a message carries.
fn job_of(message: &Message) -> Value {
    serde_json::from_str(message.body().unwrap()).unwrap()
}

/// A scan refused because the queue is out of reach: 503, `Retry-After`, `queue_unavailable`.
fn assert_queue_unavailable(r: &http::Response<bytes::Bytes>) {
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(json(r)["error"], "queue_unavailable");
}

fn ceil_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Each 202 sends exactly one message: the job as body, scope and tier as attributes, DelaySeconds = ceil(deferredMs / 1000).
#[tokio::test]
async fn one_message_per_202_with_the_job() {
    let rig = Rig::start().await;
    let gate = rig.gate(
        &rig.queue_url,
        &[
            ("QUOTA_ANON", "2"),
            ("QUOTA_SOFT_WINDOW", "1"),
            ("QUOTA_SOFT_DELAY_MS", "1500"),
            ("QUOTA_DELAY_MODE", "defer"),
            ("QUOTA_PACING", "off"),
        ],
    );
    let mut answers = Vec::new();
    for _ in 0..4 {
        let r = gate.handle(scan_from("203.0.113.7")).await;
        assert_eq!(r.status(), 202, "{:?}", r.body());
        answers.push(json(&r));
    }

    let messages = rig.moto.sqs_messages();
    assert_eq!(messages.len(), 4, "one message per 202");
    let tiers = ["within", "within", "soft", "hard"];
    for (n, ((message, answer), tier)) in messages.iter().zip(&answers).zip(tiers).enumerate() {
        let job: Value = serde_json::from_str(message["body"].as_str().unwrap()).unwrap();
        assert_eq!(job["scanId"], answer["scanId"]);
        assert_eq!(job["tier"], tier);
        assert_eq!(job["scope"], "ip");
        assert_eq!(job["count"], n as u64 + 1);
        assert_eq!(job["limit"], 2);
        assert_eq!(job["delayMs"], answer["delayMs"]);
        assert_eq!(job["deferredMs"], answer["deferredMs"]);
        assert_eq!(job["request"], json!({ "image": IMAGE }));
        assert_eq!(job["digest"].as_str().unwrap().len(), 64);
        for field in ["receivedAt", "notBefore"] {
            assert!(job[field].as_str().unwrap().ends_with('Z'), "{field}");
        }
        // The request's trace (one the gate started: no context was given).
        let traceparent = job["trace"]["traceparent"].as_str().unwrap();
        assert_eq!(
            message["message_attributes"],
            json!({
                "scope": {"DataType": "String", "StringValue": "ip"},
                "tier": {"DataType": "String", "StringValue": tier},
                "traceparent": {"DataType": "String", "StringValue": traceparent},
            })
        );
        let deferred = answer["deferredMs"].as_u64().unwrap();
        assert_eq!(
            applied_delay_seconds(message),
            ceil_seconds(deferred),
            "{job}"
        );
    }
    let applied: Vec<u64> = messages.iter().map(applied_delay_seconds).collect();
    assert_eq!(
        applied,
        [0, 0, 2, 60],
        "1.5 s rounds up to 2; the hard 60 s whole"
    );

    // What a consumer sees: the two undelayed jobs now, the others later.
    assert_eq!(
        rig.queue_attribute(QueueAttributeName::ApproximateNumberOfMessages)
            .await,
        2
    );
    assert_eq!(
        rig.queue_attribute(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
            .await,
        2
    );
    let received = rig.receive(0).await;
    assert_eq!(received.len(), 2);
    for m in &received {
        let attrs = m.message_attributes.as_ref().unwrap();
        assert_eq!(attrs["tier"].string_value(), Some("within"));
        assert_eq!(attrs["scope"].data_type(), "String");
    }
}

/// A new rig, and through a gate on it with `vars` one scan within quota
/// (a quota of 1), then the soft one the test is about: the rig, that
/// scan's body, when it was answered and how long it took.
async fn soft_scan(vars: &[(&str, &str)]) -> (Rig, Value, Instant, Duration) {
    let rig = Rig::start().await;
    let gate = rig.gate(&rig.queue_url, &with_vars(&[("QUOTA_ANON", "1")], vars));
    assert_eq!(gate.handle(scan_from("203.0.113.7")).await.status(), 202);
    let started = Instant::now();
    let r = gate.handle(scan_from("203.0.113.7")).await;
    let answered = Instant::now();
    assert_eq!(r.status(), 202, "{:?}", r.body());
    (rig, json(&r), answered, answered - started)
}

/// In sleep mode only the part beyond the budget is deferred, and a fractional second rounds up.
#[tokio::test]
async fn sleep_mode_defers_the_remainder() {
    // Budget 1.5 s − 1 s margin = 0.5 s of sleep; 1.7 s soft delay leaves 1.2 s.
    let (rig, body, _, took) = soft_scan(&[
        ("QUOTA_SOFT_DELAY_MS", "1700"),
        ("QUOTA_GATEWAY_TIMEOUT_MS", "1500"),
    ])
    .await;
    assert!(took >= Duration::from_millis(500));
    assert_eq!(
        (body["sleptMs"].as_u64(), body["deferredMs"].as_u64()),
        (Some(500), Some(1200))
    );
    let messages = rig.moto.sqs_messages();
    assert_eq!(messages.len(), 2);
    assert_eq!(
        applied_delay_seconds(&messages[1]),
        2,
        "1.2 s rounds up to 2 s"
    );
}

/// A delayed message stays invisible to consumers until its DelaySeconds have passed.
#[tokio::test]
async fn delayed_message_is_invisible_until_due() {
    let defer = [
        ("QUOTA_SOFT_DELAY_MS", "1000"),
        ("QUOTA_DELAY_MODE", "defer"),
    ];
    let (rig, body, answered, _) = soft_scan(&defer).await;
    assert_eq!(body["deferredMs"], 1000);

    let now = rig.receive(0).await;
    assert_eq!(now.len(), 1, "only the undelayed job is visible at once");
    assert_eq!(job_of(&now[0])["tier"], "within");

    // Long polling returns as soon as the delayed job becomes visible.
    let later = rig.receive(3).await;
    let waited = answered.elapsed();
    assert_eq!(later.len(), 1);
    assert_eq!(job_of(&later[0])["scanId"], body["scanId"]);
    assert!(
        waited >= Duration::from_millis(900),
        "visible after {waited:?}"
    );
}

/// A queue that does not exist gives 503 + Retry-After, queues nothing and leaves the counter where it was.
#[tokio::test]
async fn missing_queue_refunds() {
    let rig = Rig::start().await;
    let good = rig.gate(&rig.queue_url, &[]);
    assert_eq!(good.handle(scan_from("203.0.113.9")).await.status(), 202);
    assert_eq!(rig.counter().await, Some(1));

    let bad = rig.gate(&rig.missing_queue_url(), &[]);
    for _ in 0..3 {
        assert_queue_unavailable(&bad.handle(scan_from("203.0.113.9")).await);
    }
    assert_eq!(rig.counter().await, Some(1), "every failed scan refunded");
    assert_eq!(rig.moto.sqs_messages().len(), 1, "nothing queued");
}

/// A first scan whose enqueue fails leaves its subject at zero.
#[tokio::test]
async fn failed_first_scan_leaves_zero() {
    let rig = Rig::start().await;
    let r = rig
        .gate(&rig.missing_queue_url(), &[])
        .handle(scan_from("192.0.2.60"))
        .await;
    assert_queue_unavailable(&r);
    // The script created the key; the refund took the count back to 0.
    assert_eq!(rig.counter().await.unwrap_or(0), 0);
}

/// A stopped emulator gives 503 + Retry-After within the enqueue bound and the counter is back where it was.
#[tokio::test]
async fn stopped_emulator_refunds() {
    let mut rig = Rig::start().await;
    let gate = rig.gate(&rig.queue_url, &[]);
    assert_eq!(gate.handle(scan_from("203.0.113.9")).await.status(), 202);
    assert_eq!(rig.counter().await, Some(1));

    rig.moto.stop();
    let started = Instant::now();
    assert_queue_unavailable(&gate.handle(scan_from("203.0.113.9")).await);
    assert!(
        started.elapsed() < ENQUEUE_TIMEOUT + Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(rig.counter().await, Some(1), "the failed scan was refunded");
}

/// A scan accepted while the store is down (fail open) goes to SQS as
/// `unmetered`: in the body (`count` 0) and in the `tier` attribute, never `within`.
#[tokio::test]
async fn unmetered_scans_say_so_on_sqs() {
    let rig = Rig::start().await;
    let config = config(&[
        ("VALKEY_URL", "redis://127.0.0.1:1"),
        ("SCAN_QUEUE_URL", rig.queue_url.as_str()),
    ]);
    let down = Valkey::new("redis://127.0.0.1:1", false, config.store.timeout).unwrap();
    let gate = Gate::new(
        config,
        ValkeyStore::new(down),
        SqsQueue::new(&rig.sdk, &rig.queue_url),
        Meter::new("test", None),
    )
    .unwrap();
    let r = gate.handle(scan_from("203.0.113.10")).await;
    assert_eq!(r.status(), 202);
    assert_eq!(r.headers()["x-stella-quota"], "unavailable");
    let received = rig.receive(0).await;
    let message = &received[0];
    let job = job_of(message);
    assert_eq!(
        (job["tier"].as_str(), job["count"].as_u64()),
        (Some("unmetered"), Some(0))
    );
    let attrs = message.message_attributes.as_ref().unwrap();
    assert_eq!(attrs["tier"].string_value(), Some("unmetered"));
}

/// The lanes apart on SQS: with `SCAN_QUEUE_OVER_URL`, a within-quota job
/// goes to the scan queue without a message group, an over-quota one to
/// the over lane's queue with its tenant as `MessageGroupId` (SQS fair
/// queues); without it, both share the scan queue, the over-quota one
/// still in its tenant's group.
#[tokio::test]
async fn over_quota_jobs_take_their_lane_and_their_tenants_group() {
    let rig = Rig::start().await;
    let over_url = rig.moto.create_queue("scans-over").await;
    let url = rig.valkey.url();
    let vars = [
        ("VALKEY_URL", url.as_str()),
        ("SCAN_QUEUE_URL", rig.queue_url.as_str()),
        ("SCAN_QUEUE_OVER_URL", over_url.as_str()),
        ("QUOTA_STORE_TIMEOUT_MS", "1000"),
        ("QUOTA_ANON", "1"),
        ("QUOTA_DELAY_MODE", "defer"),
    ];
    let config = config(&vars);
    let queue = SqsQueue::new(&rig.sdk, &rig.queue_url).with_over_lane(config.queue_over.clone());
    let valkey = Valkey::new(&url, false, config.store.timeout).unwrap();
    let gate = Gate::new(
        config,
        ValkeyStore::new(valkey),
        queue,
        Meter::new("test", None),
    )
    .unwrap();
    for _ in 0..2 {
        assert_eq!(gate.handle(scan_from("192.0.2.7")).await.status(), 202);
    }
    let receive = |queue: String| {
        let sqs = rig.sqs.clone();
        async move {
            let out = sqs
                .receive_message()
                .queue_url(queue)
                .max_number_of_messages(10);
            let out = out
                .message_system_attribute_names("All".into())
                .wait_time_seconds(1);
            out.send().await.unwrap().messages.unwrap_or_default()
        }
    };
    let within = receive(rig.queue_url.clone()).await;
    assert_eq!(within.len(), 1, "{within:?}");
    assert_eq!(job_of(&within[0])["lane"], "within");
    let group = |m: &Message| {
        m.attributes.as_ref().and_then(|a| {
            a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::MessageGroupId)
                .cloned()
        })
    };
    assert_eq!(group(&within[0]), None);
    // The over-quota job is held back by its DelaySeconds: read moto's record.
    let over: Vec<Value> = rig
        .moto
        .sqs_messages()
        .into_iter()
        .filter(|m| {
            m["body"]
                .as_str()
                .is_some_and(|b| b.contains(r#""lane":"over""#))
        })
        .collect();
    assert_eq!(over.len(), 1, "{over:?}");
    let job: Value = serde_json::from_str(over[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(over[0]["group_id"], job["tenant"], "{over:?}");
    assert!(
        job["tenant"]
            .as_str()
            .is_some_and(|t| !t.contains("192.0.2.7"))
    );
}
