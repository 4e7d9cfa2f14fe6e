//! `Idempotency-Key`, and what the gate promises through a store that
//! stalls (SIGSTOP) instead of failing cleanly: a timeout does not cancel a
//! command already sent, so every answer must stay true once the late
//! commands have run.

use quota_gate_testkit as common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use http::HeaderValue;
use quota_gate::gate::{Gate, GateRequest};
use quota_gate::io::connection::Valkey;
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::queue::{Once, ScanJob, ScanQueue};
use quota_gate::io::store::memory::MemoryStore;
use quota_gate::io::store::valkey::ValkeyStore;
use quota_gate::io::store::{
    Claim, Claimed, CountArgs, PaceArgs, Paced, QuotaKey, QuotaStore, RecordUpdate, Refund,
    SendError, TakeOver,
};
use quota_gate::rules::scope::Scope;
use quota_gate::rules::unix::UnixSecs;
use serde_json::Value;

const IP: &str = "198.51.100.90";

fn keyed(ip: &str, key: &str) -> GateRequest {
    let mut r = scan_from(ip);
    r.headers
        .insert("idempotency-key", HeaderValue::from_str(key).unwrap());
    r
}

/// The subject's counter on `server` (0 when it does not exist).
async fn count_on<S: QuotaStore, Q: ScanQueue>(
    gate: &Gate<S, Q>,
    server: &ValkeyServer,
    ip: &str,
) -> u64 {
    let key = QuotaKey::new(Scope::Ip, &gate.identifier().ip_digest(ip.parse().unwrap()));
    let mut c = server.client().await;
    let n: Option<u64> = redis::AsyncCommands::get(&mut c, &key.counter)
        .await
        .unwrap();
    n.unwrap_or(0)
}

/// Replay, mismatch, invalid keys and other subjects, against `gate`;
/// `jobs` reads the queue, `count` the subject's counter.
async fn contract<S: QuotaStore, Q: ScanQueue>(
    gate: &Gate<S, Q>,
    jobs: impl AsyncFn() -> usize,
    count: impl AsyncFn(&str) -> u64,
) {
    let first = gate.handle(keyed(IP, "order-42")).await;
    assert_eq!(first.status(), 202);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let again = gate.handle(keyed(IP, "order-42")).await;
    assert_eq!(again.status(), 202);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(json(&again)["scanId"], json(&first)["scanId"]);
    assert_eq!(
        json(&again)["quota"],
        json(&first)["quota"],
        "same quota figures"
    );
    assert_eq!(
        again.headers()["x-stella-quota-remaining"],
        first.headers()["x-stella-quota-remaining"]
    );
    assert_eq!(count(IP).await, 1, "a replay is not counted");
    assert_eq!(jobs().await, 1, "a replay is not queued");

    // The same key with another body.
    let mut other = keyed(IP, "order-42");
    other.body = bytes::Bytes::from_static(br#"{"image":"debian:12"}"#);
    let r = gate.handle(other).await;
    assert_eq!(r.status(), 422);
    assert_eq!(json(&r)["error"], "idempotency_key_mismatch");

    // Invalid keys: 400, not counted.
    for bad in ["", &"k".repeat(256), "caf\u{e9}"] {
        let mut r = scan_from(IP);
        r.headers.insert(
            "idempotency-key",
            HeaderValue::from_bytes(bad.as_bytes()).unwrap(),
        );
        let r = gate.handle(r).await;
        assert_eq!(r.status(), 400, "{bad:?}");
        assert_eq!(json(&r)["error"], "invalid_idempotency_key");
    }
    assert_eq!(count(IP).await, 1, "invalid keys are not counted");

    // Another subject with the same key is another scan.
    let theirs = gate.handle(keyed("198.51.100.91", "order-42")).await;
    assert_eq!(theirs.status(), 202);
    assert!(theirs.headers().get("idempotent-replayed").is_none());
    assert_ne!(json(&theirs)["scanId"], json(&first)["scanId"]);
    assert_eq!(jobs().await, 2);
}

#[tokio::test]
async fn keyed_retries_on_valkey() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    contract(
        &gate,
        async || stream_jobs(&server, "jobs").await.len(),
        async |ip| count_on(&gate, &server, ip).await,
    )
    .await;
    // The record lives beside the counter, under the subject's hash tag.
    let mut c = server.client().await;
    let records: Vec<String> = redis::AsyncCommands::keys(&mut c, "quota:ip:{*}:idem:*")
        .await
        .unwrap();
    assert_eq!(records.len(), 2);
    let ttl: i64 = redis::AsyncCommands::ttl(&mut c, &records[0])
        .await
        .unwrap();
    assert!(ttl > 86_000 && ttl <= 86_400, "24 h: {ttl}");
}

/// A failover that loses a keyed scan's record but not its job (the claim
/// short of the replica, the job landed on the new primary by a send that
/// waited out the outage): the retry counts afresh under a new `scanId`,
/// but its job does not land twice, and its 202 and every replay name the
/// job that is queued.
#[tokio::test]
async fn a_retry_whose_record_was_lost_answers_the_queued_job() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    let first = gate.handle(keyed(IP, "order-7")).await;
    assert_eq!(first.status(), 202);
    let queued = json(&first)["scanId"].clone();
    let mut c = server.client().await;
    let records: Vec<String> = redis::AsyncCommands::keys(&mut c, "quota:ip:{*}:idem:*")
        .await
        .unwrap();
    // The stream's marker of the record lasts as long as the record.
    let markers: Vec<String> = redis::AsyncCommands::keys(&mut c, "{jobs}:landed:*")
        .await
        .unwrap();
    let expiry = |key: String| {
        let mut c = c.clone();
        async move {
            let at: i64 = redis::cmd("EXPIRETIME")
                .arg(key)
                .query_async(&mut c)
                .await
                .unwrap();
            at
        }
    };
    let (record_at, marker_at) = (
        expiry(records[0].clone()).await,
        expiry(markers[0].clone()).await,
    );
    assert!(
        (record_at - marker_at).abs() <= 1,
        "{record_at} {marker_at}"
    );
    let () = redis::AsyncCommands::del(&mut c, &records).await.unwrap();
    let retry = gate.handle(keyed(IP, "order-7")).await;
    assert_eq!(retry.status(), 202);
    assert!(retry.headers().get("idempotent-replayed").is_none());
    assert_eq!(json(&retry)["scanId"], queued, "the queued job's id");
    let jobs = stream_jobs(&server, "jobs").await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["scanId"], queued);
    let replay = gate.handle(keyed(IP, "order-7")).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json(&replay)["scanId"], queued);
    // Another key of the subject lands as ever.
    let other = gate.handle(keyed(IP, "order-8")).await;
    assert_ne!(json(&other)["scanId"], queued);
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 2);
}

/// The stream's markers of earlier versions (one per `scanId`) still hold
/// for as long as they last: a take-over of a job landed before an upgrade
/// adds no second entry; another record's job lands.
#[tokio::test]
async fn a_job_marked_by_an_earlier_version_lands_no_more() {
    let server = ValkeyServer::start();
    let valkey = Valkey::new(&server.url(), false, Duration::from_secs(1)).unwrap();
    let queue = StreamQueue::new(valkey, "jobs");
    let job: ScanJob = serde_json::from_value(common::consumer::job(now() * 1000)).unwrap();
    let mut c = server.client().await;
    let marker = format!("{{jobs}}:scan:{}", job.scan_id);
    let () = redis::AsyncCommands::set(&mut c, &marker, "1")
        .await
        .unwrap();
    let once = |record| Once {
        record,
        expires_at: UnixSecs(now() + 60),
    };
    let landed = queue.enqueue_once(&job, once("quota:a")).await.unwrap();
    assert_eq!(landed, job.scan_id);
    assert!(stream_jobs(&server, "jobs").await.is_empty());
    let () = redis::AsyncCommands::del(&mut c, &marker).await.unwrap();
    queue.enqueue_once(&job, once("quota:b")).await.unwrap();
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 1);
}

#[tokio::test]
async fn keyed_retries_in_memory() {
    let jobs = RecordingQueue::default();
    let store = MemoryStore::default();
    let gate = gate(&[], store.clone(), jobs.clone());
    let used = |ip: &str| {
        let key = QuotaKey::new(Scope::Ip, &gate.identifier().ip_digest(ip.parse().unwrap()));
        store.used(&key, UnixSecs(now())).unwrap_or(0)
    };
    contract(&gate, async || jobs.len(), async |ip| used(ip)).await;
}

/// While the first request with a key sleeps its delay, a repeat is 409
/// with Retry-After, and is neither counted nor queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeat_in_flight_is_409() {
    let server = ValkeyServer::start();
    let gate = Arc::new(valkey_gate(
        &server,
        &[("QUOTA_ANON", "1"), ("QUOTA_SOFT_DELAY_MS", "1500")],
    ));
    assert_eq!(gate.handle(scan_from(IP)).await.status(), 202);
    let slow = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.handle(keyed(IP, "slow-1")).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = gate.handle(keyed(IP, "slow-1")).await;
    assert_eq!(r.status(), 409);
    assert_eq!(json(&r)["error"], "idempotency_in_progress");
    assert!(retry_after(&r) >= 1);
    let first = slow.await.unwrap();
    assert_eq!(first.status(), 202);
    assert_eq!(json(&first)["delayMs"], 1500);
    // Once answered, a repeat is a replay, at once.
    let started = std::time::Instant::now();
    let again = gate.handle(keyed(IP, "slow-1")).await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "not delayed"
    );
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(count_on(&*gate, &server, IP).await, 2);
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 2);
}

/// A gate on `server` for the stall tests: a 200 ms store timeout (the stall
/// outlasts it), no breaker (each request meets the stall itself), nothing slept.
fn stall_gate(
    server: &ValkeyServer,
    extra: &[(&str, &str)],
) -> Arc<Gate<ValkeyStore, StreamQueue>> {
    let mut vars = vec![
        ("QUOTA_STORE_TIMEOUT_MS", "200"),
        ("QUOTA_BREAKER_FAILURES", "0"),
        ("QUOTA_DELAY_MODE", "defer"),
    ];
    vars.extend_from_slice(extra);
    Arc::new(valkey_gate(server, &vars))
}

/// Stops `server` (SIGSTOP), sends `requests` to `gate` all at once, lets
/// `stall` pass once they are answered, and resumes the server; returns each
/// answer's status and body.
async fn through_a_stall(
    server: &ValkeyServer,
    gate: &Arc<Gate<ValkeyStore, StreamQueue>>,
    requests: impl IntoIterator<Item = GateRequest>,
    stall: Duration,
) -> Vec<(u16, Value)> {
    server.signal("STOP");
    let answers = statuses_and_bodies(&all_at_once(gate, requests).await);
    tokio::time::sleep(stall).await;
    server.signal("CONT");
    answers
}

/// Retries `request` until it is answered 202 (503 and 409 say to retry).
async fn settle<S: QuotaStore, Q: ScanQueue>(gate: &Gate<S, Q>, key: &str) -> Value {
    for _ in 0..100 {
        let r = gate.handle(keyed(IP, key)).await;
        match r.status().as_u16() {
            202 => return json(&r),
            409 | 503 => tokio::time::sleep(Duration::from_millis(200)).await,
            other => panic!("{key}: unexpected {other}: {:?}", r.body()),
        }
    }
    panic!("{key} never settled");
}

/// The stall: 12 keyed scans sent while Valkey is stopped (SIGSTOP) past
/// the store timeout, Valkey resumed, then each key retried until 202.
/// Every key ends as exactly one job in the stream, whose scanId is the one
/// its client holds, no stray job, and the count grew by exactly 12.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_scans_settle_exactly_once_after_a_stall() {
    let server = ValkeyServer::start();
    let gate = stall_gate(&server, &[("QUOTA_GATEWAY_TIMEOUT_MS", "5000")]);
    // Connect first, so the stall hits commands, not the handshake; and
    // load the scripts, so the late ones run rather than fail NOSCRIPT.
    let warm = gate.handle(keyed("192.0.2.1", "warm-up")).await;
    assert_eq!(warm.status(), 202);
    assert_eq!(
        gate.handle(keyed("192.0.2.1", "warm-up")).await.status(),
        202
    );
    let jobs_before = stream_jobs(&server, "jobs").await.len();

    let keys = (0..12).map(|i| keyed(IP, &format!("stall-{i}")));
    let first_answers = through_a_stall(&server, &gate, keys, Duration::from_millis(2_500)).await;
    for (status, body) in &first_answers {
        match status {
            // The job may land (queued unknown), or nothing was queued and
            // the count may land (counted unknown): the retry settles both.
            503 => assert!(
                body["queued"] == "unknown" || body["counted"] == "unknown",
                "{body}"
            ),
            202 => {}
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(
        first_answers.iter().any(|(s, _)| *s == 503),
        "the stall was felt"
    );

    let mut held = HashSet::new();
    for i in 0..12 {
        let body = settle(&*gate, &format!("stall-{i}")).await;
        held.insert(body["scanId"].as_str().unwrap().to_owned());
    }
    assert_eq!(held.len(), 12, "one scanId per key");
    let jobs = stream_jobs(&server, "jobs").await;
    let ours: Vec<&Value> = jobs[jobs_before..].iter().collect();
    let queued: HashSet<String> = ours
        .iter()
        .map(|j| j["scanId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ours.len(), 12, "exactly one job per key: {ours:?}");
    assert_eq!(
        queued, held,
        "every job is one a client holds, and the reverse"
    );
    for job in &ours {
        assert!(
            !(job["tier"] == "within" && job["count"] == 0),
            "no uncounted job passes as within: {job}"
        );
    }
    assert_eq!(
        count_on(&*gate, &server, IP).await,
        12,
        "counted once per key"
    );
}

/// Without a key, through the same stall: each 503 says whether its job
/// may still land, and once the stall is over the counter holds exactly the
/// 202s (a late job of a 503 runs uncounted, never charged twice); every 202
/// has its job; no job is `within` with count 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unkeyed_answers_stay_true_after_a_stall() {
    let server = ValkeyServer::start();
    let gate = stall_gate(&server, &[]);
    assert_eq!(gate.handle(scan_from(IP)).await.status(), 202);
    let scans = (0..10).map(|_| scan_from(IP));
    let answers = through_a_stall(&server, &gate, scans, Duration::from_millis(1_500)).await;
    // After the stall, the gate works again (the breaker is off).
    let mut after = 0;
    for _ in 0..50 {
        if gate.handle(scan_from(IP)).await.status() == 202 {
            after += 1;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(after, 1);
    let accepted: Vec<&Value> = answers
        .iter()
        .filter(|(s, _)| *s == 202)
        .map(|(_, b)| b)
        .collect();
    for (status, body) in &answers {
        assert!(*status == 202 || *status == 503, "{status}: {body}");
        if *status == 503 {
            assert_eq!(
                body["queued"], "unknown",
                "the gate cannot know: it says so"
            );
        }
    }
    let jobs = stream_jobs(&server, "jobs").await;
    let queued: HashSet<&str> = jobs.iter().map(|j| j["scanId"].as_str().unwrap()).collect();
    for body in &accepted {
        assert!(
            queued.contains(body["scanId"].as_str().unwrap()),
            "a 202 without a job"
        );
    }
    for job in &jobs {
        assert!(!(job["tier"] == "within" && job["count"] == 0), "{job}");
    }
    // The first and last scans plus every 202 of the stall; nothing for a 503.
    assert_eq!(
        count_on(&*gate, &server, IP).await,
        2 + accepted.len() as u64
    );
}

/// Fail closed through a stall: the 503s say "not counted", and once the
/// stall is over that is still true (the refund runs after the late count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_mode_refusals_are_not_counted_after_a_stall() {
    let server = ValkeyServer::start();
    let gate = stall_gate(&server, &[("QUOTA_FAIL_MODE", "closed")]);
    assert_eq!(gate.handle(scan_from(IP)).await.status(), 202);
    let scans = [scan_from(IP), keyed(IP, "closed-1"), scan_from(IP)];
    for (status, body) in through_a_stall(&server, &gate, scans, Duration::from_secs(1)).await {
        assert_eq!(
            (status, body["error"].as_str()),
            (503, Some("store_unavailable"))
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count_on(&*gate, &server, IP).await,
        1,
        "only the scan before the stall"
    );
    // The keyed refusal left no record behind: a retry is a fresh scan.
    let r = gate.handle(keyed(IP, "closed-1")).await;
    assert_eq!(r.status(), 202);
    assert!(r.headers().get("idempotent-replayed").is_none());
    assert_eq!(json(&r)["quota"]["used"], 2);
}

/// A refund issued after 00:00 UTC leaves the new day's counter alone.
#[tokio::test]
async fn refund_is_tied_to_its_day() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    let key = QuotaKey::new(Scope::Ip, &gate.identifier().ip_digest(IP.parse().unwrap()));
    let mut c = server.client().await;
    let today_end = now() - now().rem_euclid(86_400) + 86_400;
    // Today's counter (the new day, from the refund's point of view) at 5.
    let _: () = redis::cmd("SET")
        .arg(&key.counter)
        .arg(5)
        .arg("EXAT")
        .arg(today_end)
        .query_async(&mut c)
        .await
        .unwrap();
    // A refund of a scan counted yesterday (whose counter expired at today's start).
    let refund = |period_end| Refund {
        levels: &[],
        key: &key,
        period_end: UnixSecs(period_end),
        record: None,
        now: UnixSecs(now()),
    };
    gate.store()
        .refund(refund(today_end - 86_400))
        .await
        .unwrap();
    assert_eq!(count_on(&gate, &server, IP).await, 5);
    gate.store().refund(refund(today_end)).await.unwrap();
    assert_eq!(count_on(&gate, &server, IP).await, 4);
}

/// The Valkey store, but each pacing step is sent only when the test says
/// so: the stall of "a reply that comes after the gate gave up", placed
/// exactly between the count and the pacing step (a `SIGSTOP` cannot be
/// timed into the microseconds between the two). The step itself is the
/// real `pace.lua` on the real server; it runs late, as a stalled one would.
#[derive(Clone)]
struct LatePace {
    inner: ValkeyStore,
    go: Arc<tokio::sync::Semaphore>,
    ran: Arc<tokio::sync::Mutex<Vec<Paced>>>,
}

impl QuotaStore for LatePace {
    fn bounds_itself(&self) -> bool {
        false
    }

    async fn count(
        &self,
        args: CountArgs<'_>,
    ) -> Result<quota_gate::io::store::Tally, quota_gate::io::store::CountFailed> {
        self.inner.count(args).await
    }
    async fn count_keyed(
        &self,
        args: CountArgs<'_>,
        claim: &Claim,
    ) -> Result<Claimed, quota_gate::io::store::CountFailed> {
        self.inner.count_keyed(args, claim).await
    }
    async fn peek(
        &self,
        key: &quota_gate::io::store::QuotaKey,
        now: UnixSecs,
    ) -> Result<quota_gate::io::store::Peek, SendError> {
        self.inner.peek(key, now).await
    }
    async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, SendError> {
        let (store, go, ran) = (self.inner.clone(), self.go.clone(), self.ran.clone());
        let step = OwnedPace::new(&args);
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Detached: the gate dropping its future does not stop the step.
        tokio::spawn(async move {
            go.acquire().await.unwrap().forget();
            let paced = store.pace(step.args(&step.lanes())).await;
            if let Ok(p) = &paced {
                ran.lock().await.push(p.clone());
            }
            let _ = tx.send(paced);
        });
        rx.await.unwrap_or(Err(SendError::Unanswered))
    }
    async fn has_record(&self, record: &str, now: UnixSecs) -> Result<bool, SendError> {
        self.inner.has_record(record, now).await
    }
    async fn take_sleep_lease(
        &self,
        lone: quota_gate::rules::delay::LoneSleepAsk,
    ) -> Result<quota_gate::rules::delay::SleepLease, SendError> {
        self.inner.take_sleep_lease(lone).await
    }
    async fn refund(&self, refund: Refund<'_>) -> Result<(), SendError> {
        self.inner.refund(refund).await
    }
    async fn release(
        &self,
        record: &str,
        scan_id: uuid::Uuid,
        now: UnixSecs,
    ) -> Result<(), SendError> {
        self.inner.release(record, scan_id, now).await
    }
    async fn update_record(&self, update: RecordUpdate<'_>) -> Result<(), SendError> {
        self.inner.update_record(update).await
    }
    async fn take_over(&self, args: TakeOver<'_>) -> Result<bool, SendError> {
        self.inner.take_over(args).await
    }
}

/// A pacing step that times out is a scan accepted with its tier's delay;
/// when the step then runs late and finds the backlog full, it must not
/// take that scan's count back or drop its record (it used to: the scan ran
/// uncounted, and a keyed retry was queued again). A refusal the gate does
/// see still takes its count back.
#[tokio::test]
async fn a_late_pacing_step_never_uncounts_an_accepted_scan() {
    let server = ValkeyServer::start();
    // 1 within, then hard 60 s; the backlog holds one hard slot.
    let vars = [
        ("VALKEY_URL", server.url()),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs".to_owned()),
        ("QUOTA_ANON", "1".to_owned()),
        ("QUOTA_SOFT_WINDOW", "0".to_owned()),
        ("QUOTA_DELAY_MODE", "defer".to_owned()),
        ("QUOTA_MAX_BACKLOG_MS", "60000".to_owned()),
        ("QUOTA_STORE_TIMEOUT_MS", "200".to_owned()),
    ];
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let config = config(&vars);
    let valkey = quota_gate::io::connection::Valkey::from_config(&config)
        .unwrap()
        .unwrap();
    let store = LatePace {
        inner: ValkeyStore::new(valkey.clone()),
        go: Arc::new(tokio::sync::Semaphore::new(0)),
        ran: Arc::default(),
    };
    let gate = Gate::new(
        config,
        store.clone(),
        StreamQueue::new(valkey, "jobs"),
        quota_gate::io::meter::Meter::new("test", None),
    )
    .unwrap();

    // Within quota: no pacing step. Over it: the first step runs in time.
    assert_eq!(gate.handle(keyed(IP, "k-1")).await.status(), 202);
    store.go.add_permits(1);
    assert_eq!(gate.handle(keyed(IP, "k-2")).await.status(), 202);
    // The third scan's step is held past the store timeout: accepted.
    let late = gate.handle(keyed(IP, "k-3")).await;
    assert_eq!(late.status(), 202, "{}", json(&late));
    assert_eq!(count_on(&gate, &server, IP).await, 3);
    // Now the step runs: the backlog is full, and it must change nothing.
    store.go.add_permits(1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while store.ran.lock().await.len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(matches!(store.ran.lock().await[1], Paced::Full { .. }));
    assert_eq!(
        count_on(&gate, &server, IP).await,
        3,
        "the accepted scan stays counted"
    );
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 3);
    // Its record stays: a retry is a replay, not a second job.
    let retry = gate.handle(keyed(IP, "k-3")).await;
    assert_eq!(retry.status(), 202);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(json(&retry)["scanId"], json(&late)["scanId"]);
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 3);

    // A refusal the gate sees in time: 503, count taken back, nothing queued.
    store.go.add_permits(1);
    let refused = gate.handle(keyed(IP, "k-4")).await;
    assert_eq!(refused.status(), 503, "{}", json(&refused));
    assert_eq!(json(&refused)["error"], "backlog_full");
    assert_eq!(count_on(&gate, &server, IP).await, 3);
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 3);
}
