//! Gateway-safe delays end to end, through the Lambda front end
//! (`to_gate_request` on the sample events), with Tokio time paused: a
//! 60 s hard delay costs no real time here.
//!
//! The store is the in-memory one and the queue records jobs in process:
//! both do no I/O, so paused time advances only when the handler sleeps and
//! the elapsed (virtual) time is exactly what it slept. The SQS side of the
//! deferral (DelaySeconds on a real queue) is in `tests/it/sqs.rs`.

use quota_gate_testkit as common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use quota_gate::front::lambda::to_gate_request;
use quota_gate::gate::{Gate, GateRequest};
use quota_gate::io::clock::Clock;
use quota_gate::io::queue::ScanJob;
use quota_gate::io::queue::sqs::delay_seconds;
use quota_gate::io::store::memory::MemoryStore;
use serde_json::Value;
use tokio::time::Instant;

/// One scan of quota, no soft window: the second scan is hard-tier.
const HARD_ON_SECOND: &[(&str, &str)] = &[("QUOTA_ANON", "1"), ("QUOTA_SOFT_WINDOW", "0")];

fn gate_with(vars: &[(&str, &str)]) -> (Gate<MemoryStore, RecordingQueue>, RecordingQueue) {
    let recorder = RecordingQueue::default();
    let all = with_vars(HARD_ON_SECOND, vars);
    (
        gate(&all, MemoryStore::default(), recorder.clone()).with_clock(Clock::tokio()),
        recorder,
    )
}

/// The HTTP API sample event, with a Lambda context whose deadline is `remaining` away.
fn http_api_event(remaining: Option<Duration>) -> GateRequest {
    let mut request = event("http-api-v2-ipv4.json");
    if let Some(remaining) = remaining {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let mut context = lambda_http::Context::default();
        context.deadline = (now + remaining).as_millis() as u64;
        request = lambda_http::RequestExt::with_lambda_context(request, context);
    }
    to_gate_request(request)
}

/// Sends the over-quota scan and returns the body, the virtual time it took and the job.
async fn hard_scan(
    gate: &Gate<MemoryStore, RecordingQueue>,
    recorder: &RecordingQueue,
    remaining: Option<Duration>,
) -> (Value, Duration, ScanJob) {
    let first = gate.handle(http_api_event(remaining)).await;
    assert_eq!(json(&first)["delayMs"], 0);
    let started = Instant::now();
    let r = gate.handle(http_api_event(remaining)).await;
    let took = started.elapsed();
    assert_eq!(r.status(), 202, "{:?}", r.body());
    let body = json(&r);
    assert_eq!(body["delayMs"], 60_000);
    assert_eq!(r.headers()["x-stella-quota-delay-ms"], "60000");
    (body, took, recorder.last())
}

/// With the defaults, a hard-tier scan behind the HTTP API sleeps 28 s and defers 32 s (DelaySeconds 32).
#[tokio::test(start_paused = true)]
async fn hard_tier_sleeps_28s_defers_32s() {
    // As deployed: the template's 35 s function timeout leaves more than the gateway's 29 s.
    for remaining in [None, Some(Duration::from_secs(35))] {
        let (gate, recorder) = gate_with(&[]);
        let (body, took, job) = hard_scan(&gate, &recorder, remaining).await;
        assert_eq!(took, Duration::from_secs(28), "{remaining:?}");
        assert_eq!(body["sleptMs"], 28_000);
        assert_eq!(body["deferredMs"], 32_000);
        assert_eq!(job.tier, quota_gate::rules::job::JobTier::Hard);
        assert_eq!((job.delay_ms, job.deferred_ms), (60_000, 32_000));
        assert_eq!(delay_seconds(job.deferred()), 32);
    }
}

/// In defer mode the hard tier answers at once and defers all 60 s (DelaySeconds 60).
#[tokio::test(start_paused = true)]
async fn defer_mode_sleeps_nothing() {
    let (gate, recorder) = gate_with(&[("QUOTA_DELAY_MODE", "defer")]);
    let (body, took, job) = hard_scan(&gate, &recorder, Some(Duration::from_secs(35))).await;
    assert_eq!(took, Duration::ZERO);
    assert_eq!(
        (body["sleptMs"].as_u64(), body["deferredMs"].as_u64()),
        (Some(0), Some(60_000))
    );
    assert_eq!(job.deferred_ms, 60_000);
    assert_eq!(delay_seconds(job.deferred()), 60);
}

/// The Lambda's remaining time caps the sleep below the gateway's budget; nothing of the delay is lost.
#[tokio::test(start_paused = true)]
async fn lambda_remaining_time_caps_the_sleep() {
    let (gate, recorder) = gate_with(&[]);
    let (body, took, job) = hard_scan(&gate, &recorder, Some(Duration::from_secs(10))).await;
    // 10 s left (less the wall-clock microseconds spent so far) − 1 s margin.
    let slept = body["sleptMs"].as_u64().unwrap();
    assert!((8_900..=9_000).contains(&slept), "slept {slept} ms");
    assert_eq!(slept + body["deferredMs"].as_u64().unwrap(), 60_000);
    assert!(took >= Duration::from_millis(slept) && took < Duration::from_millis(slept + 1));
    assert_eq!(job.deferred_ms, 60_000 - slept);

    // Less than the margin left: no sleep at all, the whole delay deferred.
    let (gate, recorder) = gate_with(&[]);
    let (body, took, _) = hard_scan(&gate, &recorder, Some(Duration::from_millis(800))).await;
    assert_eq!(took, Duration::ZERO);
    assert_eq!(body["deferredMs"], 60_000);
}

/// The soft tier's 5 s fits the budget whole: slept, nothing deferred.
#[tokio::test(start_paused = true)]
async fn soft_tier_sleeps_whole() {
    let recorder = RecordingQueue::default();
    let gate = gate(
        &[("QUOTA_ANON", "1")],
        MemoryStore::default(),
        recorder.clone(),
    );
    gate.handle(http_api_event(None)).await;
    let started = Instant::now();
    let body = json(&gate.handle(http_api_event(None)).await);
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert_eq!(
        (body["sleptMs"].as_u64(), body["deferredMs"].as_u64()),
        (Some(5_000), Some(0))
    );
    assert_eq!(delay_seconds(recorder.last().deferred()), 0);
}

/// Behind a Function URL configured as the template suggests (62 s budget, 65 s timeout) the full 60 s is slept in line.
#[tokio::test(start_paused = true)]
async fn function_url_sleeps_the_full_delay() {
    let (gate, recorder) = gate_with(&[("QUOTA_GATEWAY_TIMEOUT_MS", "62000")]);
    let request = || {
        let mut r = to_gate_request(event("function-url.json"));
        r.remaining = Some(Duration::from_secs(65));
        r
    };
    gate.handle(request()).await;
    let started = Instant::now();
    let body = json(&gate.handle(request()).await);
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    assert_eq!(
        (body["sleptMs"].as_u64(), body["deferredMs"].as_u64()),
        (Some(60_000), Some(0))
    );
    assert_eq!(recorder.last().deferred_ms, 0);
}

/// A client that waits for each answer sees exactly the seed's delays with
/// pacing on (the default), through the Lambda front end: soft 1 s three
/// times, then hard 3 s, each slept whole (the budget is above both).
#[tokio::test(start_paused = true)]
async fn sequential_client_sees_the_seeds_delays() {
    let (gate, recorder) = gate_with(SEED_DELAYS);
    let mut delays = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let r = gate
            .handle(http_api_event(Some(Duration::from_secs(35))))
            .await;
        let body = json(&r);
        let delay = body["delayMs"].as_u64().unwrap();
        assert_eq!(body["sleptMs"], delay, "slept whole");
        assert_eq!(started.elapsed(), Duration::from_millis(delay));
        delays.push(delay);
    }
    assert_eq!(
        delays,
        [0, 0, 1000, 1000, 1000, 3000, 3000, 3000, 3000, 3000]
    );
    assert_eq!(recorder.len(), 10);
}

/// The same scans sent at once are spread out: each starts one delay after
/// the one before, soft then hard.
#[tokio::test(start_paused = true)]
async fn parallel_client_is_paced() {
    let (gate, recorder) = gate_with(&with_vars(SEED_DELAYS, &[("QUOTA_DELAY_MODE", "defer")]));
    let answers = all_at_once(&Arc::new(gate), (0..10).map(|_| http_api_event(None))).await;
    let mut delays: Vec<u64> = answers
        .iter()
        .map(|r| json(r)["delayMs"].as_u64().unwrap())
        .collect();
    delays.sort_unstable();
    assert_eq!(
        delays,
        [0, 0, 1000, 2000, 3000, 6000, 9000, 12000, 15000, 18000]
    );
    assert_eq!(recorder.len(), 10);
}
