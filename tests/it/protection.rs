//! What any number of addresses can cost the gate's own infrastructure,
//! on a real Valkey: requests asleep (each a Lambda environment) are
//! bounded fleet-wide by `QUOTA_MAX_ASLEEP`, a sleep lease a killed sleeper held
//! comes back by itself, a refused scan leaves no key behind, a refused
//! flood sends the store one refusal a second at most, and writes no log
//! line of its own.

use quota_gate_testkit as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::client::{build, send};
use common::cluster::{ValkeyCluster, cluster_gate};
use common::serve::{spawn_serve, stderr_of};
use common::*;
use quota_gate::gate::{Gate, GateRequest};
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::store::valkey::ValkeyStore;
use serde_json::Value;

type ValkeyGate = Gate<ValkeyStore, StreamQueue>;

/// The store timeout of these tests: long enough that a loaded machine
/// running the whole suite never fails a count open (which would change
/// what is counted and slept), as a slow store would.
const TIMEOUT_MS: &str = "10000";

/// One answer, as a client saw it: the body, and when its sleep ended and
/// began (the answer's arrival, less `sleptMs`).
struct Seen {
    status: u16,
    body: Value,
    slept: (Instant, Instant),
    /// From the request to its answer.
    took: Duration,
}

/// Sends `requests` all at once, round-robin over `gates` (as many Lambda
/// environments would take them), and returns what each client saw.
async fn burst(gates: &[Arc<ValkeyGate>], requests: Vec<GateRequest>) -> Vec<Seen> {
    let tasks: Vec<_> = requests
        .into_iter()
        .enumerate()
        .map(|(i, request)| {
            let gate = gates[i % gates.len()].clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let response = gate.handle(request).await;
                let end = Instant::now();
                let body = json(&response);
                let slept = Duration::from_millis(body["sleptMs"].as_u64().unwrap_or(0));
                Seen {
                    status: response.status().as_u16(),
                    body,
                    slept: (end - slept, end),
                    took: end - sent,
                }
            })
        })
        .collect();
    let mut seen = Vec::new();
    for task in tasks {
        seen.push(task.await.expect("no panic"));
    }
    seen
}

/// The most sleeps that overlapped at one instant.
fn most_asleep(seen: &[Seen]) -> usize {
    let mut edges: Vec<(Instant, i32)> = seen
        .iter()
        .filter(|s| s.slept.0 < s.slept.1)
        .flat_map(|s| [(s.slept.0, 1), (s.slept.1, -1)])
        .collect();
    // An end before a start at the same instant: touching is not overlapping.
    edges.sort();
    let mut asleep = 0;
    let mut most = 0;
    for (_, step) in edges {
        asleep += step;
        most = most.max(asleep);
    }
    usize::try_from(most).unwrap()
}

/// Over-quota scans through a store that answers late but within its
/// timeout (2.5 s of 3 s; the count, the pacing step and the enqueue each
/// wait that long): every answer comes within the gateway's 11 s of its
/// request, the handler's part of each delay ends by then, and no more
/// than `QUOTA_MAX_ASLEEP` sleep at once across two overlapping waves
/// (a sleep lies within its request's first `sleptMs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_store_keeps_the_sleep_within_its_bounds() {
    let server = ValkeyServer::start();
    let proxy = common::proxy::Proxy::start(server.addr()).await;
    let url = proxy.url();
    let vars = [
        ("VALKEY_URL", url.as_str()),
        ("QUOTA_ANON", "1"),
        ("QUOTA_NETWORKS", "off"),
        ("QUOTA_SOFT_WINDOW", "0"),
        ("QUOTA_GATEWAY_TIMEOUT_MS", "11000"),
        ("QUOTA_STORE_TIMEOUT_MS", "3000"),
        ("QUOTA_MAX_ASLEEP", "10"),
    ];
    let gate = Arc::new(stream_gate(&vars));
    let ip = |i: usize| format!("10.9.{i}.1");
    for i in 0..30 {
        assert_eq!(gate.handle(scan_from(&ip(i))).await.status(), 202);
    }
    proxy.slow(Duration::from_millis(2_500));
    let wave = |range: std::ops::Range<usize>, after: Duration| {
        let gate = gate.clone();
        let ip = &ip;
        let requests: Vec<GateRequest> = range.map(|i| scan_from(&ip(i))).collect();
        async move {
            tokio::time::sleep(after).await;
            timed_burst(&gate, requests).await
        }
    };
    let (a, b) = tokio::join!(
        wave(0..15, Duration::ZERO),
        wave(15..30, Duration::from_secs(3))
    );
    let seen: Vec<Seen> = a.into_iter().chain(b).collect();
    for s in &seen {
        assert_eq!(s.status, 202, "{}", s.body);
        assert!(
            s.took <= Duration::from_secs(11),
            "answered after {:?}: {}",
            s.took,
            s.body
        );
    }
    let most = most_asleep(&seen);
    assert!((1..=10).contains(&most), "{most} asleep at once, cap 10");
    let jobs = stream_jobs(&server, "jobs").await;
    let over: Vec<Value> = jobs.into_iter().filter(|j| j["tier"] != "within").collect();
    every_accepted_scan_is_queued(&over, &seen);
}

/// Sends `requests` at once to `gate`: what each client saw, each sleep
/// taken to lie within the request's first `sleptMs` (the handler's part
/// of the delay is counted from the arrival).
async fn timed_burst(gate: &Arc<ValkeyGate>, requests: Vec<GateRequest>) -> Vec<Seen> {
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let gate = gate.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let response = gate.handle(request).await;
                let body = json(&response);
                let slept = Duration::from_millis(body["sleptMs"].as_u64().unwrap_or(0));
                Seen {
                    status: response.status().as_u16(),
                    body,
                    slept: (sent, sent + slept),
                    took: sent.elapsed(),
                }
            })
        })
        .collect();
    let mut seen = Vec::new();
    for task in tasks {
        seen.push(task.await.expect("no panic"));
    }
    seen
}

/// Every 202 has its job among `jobs`, whose start is the whole delay
/// after its arrival, whatever was slept; and slept + deferred is the delay.
fn every_accepted_scan_is_queued(jobs: &[Value], seen: &[Seen]) {
    let accepted: Vec<&Value> = seen
        .iter()
        .filter(|s| s.status == 202)
        .map(|s| &s.body)
        .collect();
    assert_eq!(jobs.len(), accepted.len(), "one job per 202");
    for body in accepted {
        let job = jobs
            .iter()
            .find(|j| j["scanId"] == body["scanId"])
            .unwrap_or_else(|| panic!("no job for {body}"));
        let delay = body["delayMs"].as_u64().unwrap();
        assert_eq!(job["delayMs"].as_u64(), Some(delay), "{job}");
        let start = unix_ms(job["notBefore"].as_str().unwrap());
        let received = unix_ms(job["receivedAt"].as_str().unwrap());
        assert_eq!(u64::try_from(start - received).unwrap(), delay, "{job}");
        let (slept, deferred) = (body["sleptMs"].as_u64(), body["deferredMs"].as_u64());
        assert_eq!(slept.unwrap() + deferred.unwrap(), delay, "{body}");
    }
}

/// 50 /24 networks, each pushed over its limit by a parallel burst from
/// six of its addresses, through two gates on one Valkey (two processes):
/// at most `QUOTA_MAX_ASLEEP` requests sleep at once, at a small cap and at
/// the default (which 200 would-be sleepers exceed); the others sleep
/// nothing and defer their whole delay, so every 202 keeps its job and its
/// start time. Each cap, twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sleepers_are_bounded_across_networks_and_gates() {
    for cap in ["5", "5", "100", "100"] {
        let server = ValkeyServer::start();
        let vars = [
            ("QUOTA_ANON", "1"),
            ("QUOTA_NETWORKS", "v4/24=2"),
            ("QUOTA_SOFT_WINDOW", "2"),
            ("QUOTA_SOFT_DELAY_MS", "400"),
            ("QUOTA_HARD_DELAY_MS", "800"),
            ("QUOTA_STORE_TIMEOUT_MS", TIMEOUT_MS),
            ("QUOTA_MAX_ASLEEP", cap),
        ];
        let gates: Vec<Arc<ValkeyGate>> = (0..2)
            .map(|_| Arc::new(valkey_gate(&server, &vars)))
            .collect();
        let requests = (0..50)
            .flat_map(|net| (1..=6).map(move |host| scan_from(&format!("10.{net}.0.{host}"))))
            .collect();
        let seen = burst(&gates, requests).await;
        assert!(seen.iter().all(|s| s.status == 202));
        let cap: usize = cap.parse().unwrap();
        let most = most_asleep(&seen);
        assert!(most <= cap, "{most} asleep at once, cap {cap}");
        let denied = seen
            .iter()
            .filter(|s| s.body["delayMs"].as_u64() > Some(0) && s.body["sleptMs"] == 0)
            .count();
        assert!(denied >= 200 - cap, "{denied} deferred whole, cap {cap}");
        assert!(most >= cap.min(5), "the sleep_leases were used: {most}");
        every_accepted_scan_is_queued(&stream_jobs(&server, "jobs").await, &seen);
    }
}

/// `POST /scan` from `ip`, through the trusted proxy 127.0.0.1.
fn forwarded_scan(ip: &str) -> Vec<u8> {
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Forwarded-For", ip),
        ("Connection", "close"),
    ];
    build("POST", "/scan", &headers, SCAN_BODY).into_bytes()
}

/// A `serve` on `server`'s Valkey, trusting 127.0.0.1's `X-Forwarded-For`.
fn serve_on(server: &ValkeyServer, extra: &[(&str, &str)]) -> (KillOnDrop, std::net::SocketAddr) {
    let url = server.url();
    let base = [
        ("VALKEY_URL", url.as_str()),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("QUOTA_TRUSTED_PROXIES", "127.0.0.1/32"),
        ("QUOTA_HASH_SECRET", SECRET_TEXT),
        ("QUOTA_STORE_TIMEOUT_MS", TIMEOUT_MS),
    ];
    spawn_serve(&with_vars(&base, extra))
}

/// One scan through `addr`; its status and JSON body.
fn scan_through(addr: std::net::SocketAddr, ip: &str) -> (u16, Value) {
    let (status, text) = send(addr, &forwarded_scan(ip), Duration::from_secs(30)).unwrap();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// A sleeper killed with its `serve` (SIGKILL: nothing cleans up) holds its
/// sleep lease only until its lease ends (its sleep and a second): a scan then
/// finds it taken and sleeps nothing, one after the lease sleeps again.
#[test]
fn a_killed_sleepers_lease_comes_back_by_itself() {
    let server = ValkeyServer::start();
    let vars = [
        ("QUOTA_ANON", "1"),
        ("QUOTA_NETWORKS", "off"),
        ("QUOTA_SOFT_WINDOW", "10"),
        ("QUOTA_SOFT_DELAY_MS", "6000"),
        ("QUOTA_MAX_ASLEEP", "1"),
    ];
    let ip = "198.51.100.1";
    let (mut first, addr) = serve_on(&server, &vars);
    assert_eq!(scan_through(addr, ip).0, 202, "within quota");
    // Over quota: it takes the one sleep lease and sleeps 6 s, until its serve is killed.
    let asleep_at = Instant::now();
    let sleeper = std::thread::spawn(move || scan_through(addr, ip));
    std::thread::sleep(Duration::from_millis(500));
    first.kill_now();
    assert!(sleeper.join().is_err(), "the sleeper died with its serve");
    let held: u64 = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(server.query(redis::cmd("ZCARD").arg("quota:asleep")));
    assert_eq!(held, 1, "its lease is still held");

    let (_second, addr) = serve_on(&server, &vars);
    let (status, taken) = scan_through(addr, ip);
    assert_eq!(status, 202);
    assert!(
        asleep_at.elapsed() < Duration::from_secs(7),
        "slow start: the lease ended already"
    );
    assert!(taken["delayMs"].as_u64() > Some(0), "{taken}");
    assert_eq!(
        taken["sleptMs"], 0,
        "the sleep_lease is still leased: {taken}"
    );
    // The lease ends 6 s (the sleep) and 1 s after the killed scan's arrival.
    let lease_end = asleep_at + Duration::from_millis(7_200);
    std::thread::sleep(lease_end.saturating_duration_since(Instant::now()));
    let (status, back) = scan_through(addr, ip);
    assert_eq!(status, 202);
    assert!(
        back["sleptMs"].as_u64() > Some(0),
        "the sleep_lease came back: {back}"
    );
}

/// Every key on `server`, for a failure's message.
async fn all_keys(server: &ValkeyServer) -> Vec<String> {
    server.keys("*").await
}

/// A network flood: 10 scans of a /48 within its limit, then hard-tier
/// scans paced `hard_ms` apart, refused past `backlog_ms`; every address
/// its own /64, each within its own limit of one.
fn flood_vars<'a>(hard_ms: &'a str, backlog_ms: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("QUOTA_ANON", "1"),
        ("QUOTA_NETWORKS", "v6/48=10"),
        ("QUOTA_SOFT_WINDOW", "0"),
        ("QUOTA_HARD_DELAY_MS", hard_ms),
        ("QUOTA_MAX_BACKLOG_MS", backlog_ms),
        ("QUOTA_DELAY_MODE", "defer"),
        ("QUOTA_STORE_TIMEOUT_MS", TIMEOUT_MS),
    ]
}

/// The `i`-th /64 of the flooding /48.
fn flooder(i: u32) -> String {
    format!("2001:db8:77:{i:x}::1")
}

/// 20,000 /64s of one /48, a thousand at once, through eight gates (eight
/// Lambda environments, each remembering its own refusals): the scans
/// refused (the /48's line full) leave no key; what remains is the
/// accepted subjects' counters and first-seen keys, the /48's counter and
/// slot, and the job stream's two lanes. Twice, each on a fresh server.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_scans_leave_no_key() {
    for _ in 0..2 {
        let server = ValkeyServer::start();
        let vars = flood_vars("60000", "300000");
        let gates: Vec<Arc<ValkeyGate>> = (0..8)
            .map(|_| Arc::new(valkey_gate(&server, &vars)))
            .collect();
        let mut seen = Vec::new();
        for wave in 0..20 {
            let flood = (wave * 1_000..(wave + 1) * 1_000).map(|i| scan_from(&flooder(i)));
            seen.extend(burst(&gates, flood.collect()).await);
        }
        let accepted = seen.iter().filter(|s| s.status == 202).count();
        let refused = seen.iter().filter(|s| s.status == 503).count();
        assert_eq!((accepted, refused), (15, 19_985), "10 within, 5 paced");
        let keys = all_keys(&server).await;
        assert_eq!(keys.len(), 2 * accepted + 2 + 2, "{keys:#?}");
        every_accepted_scan_is_queued(&stream_jobs(&server, "jobs").await, &seen);
    }
}

/// The calls Valkey ran since its stats were reset, less the test's own
/// `INFO` and `CONFIG` (sent on `admin`, connected before the reset).
async fn commands_run(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    command_calls(admin).await.values().sum()
}

/// After its first refusal, a network's flood (every scan a new /64) is
/// answered 503 with its `Retry-After` without one store command for a
/// second; then the store is asked again, and refuses again.
#[tokio::test]
async fn a_refused_flood_asks_the_store_once_a_second() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &flood_vars("2000", "4000"));
    let mut i = 0;
    let first = loop {
        i += 1;
        let answer = gate.handle(scan_from(&flooder(i))).await;
        if answer.status() == 503 {
            break answer;
        }
        assert!(i < 20, "the /48's line never filled");
    };
    let refused_at = Instant::now();
    assert_eq!(json(&first)["error"], "backlog_full");
    let retry = retry_after(&first);
    assert!((1..=2).contains(&retry), "{retry}");
    let mut admin = server.client().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .unwrap();
    for _ in 0..500 {
        i += 1;
        let answer = gate.handle(scan_from(&flooder(i))).await;
        assert_eq!(answer.status(), 503);
        assert!(
            retry_after(&answer) <= retry,
            "never later than the store said"
        );
    }
    assert!(
        refused_at.elapsed() < Duration::from_secs(1),
        "the test was too slow"
    );
    let known = commands_run(&mut admin).await;
    assert_eq!(known, 0, "no store command for a known refusal");
    let recheck = refused_at + Duration::from_millis(1_100);
    tokio::time::sleep(recheck.saturating_duration_since(Instant::now())).await;
    let again = gate.handle(scan_from(&flooder(i + 1))).await;
    assert_eq!(again.status(), 503, "still full");
    assert!(
        commands_run(&mut admin).await > 0,
        "asked again a second later"
    );
}

/// A refused flood through `serve` writes no log line of its own, and
/// under 100 bytes of output per refusal in all (EMF and logs together),
/// in text and in JSON logs (no span's end line for a refused request):
/// refusals are metered in aggregate, one EMF line per interval.
#[test]
fn a_refused_flood_writes_almost_nothing() {
    for format in ["text", "json"] {
        refused_flood_output(format);
    }
}

fn refused_flood_output(format: &str) {
    let server = ValkeyServer::start();
    let mut vars = flood_vars("60000", "300000");
    vars.push(("QUOTA_LOG_FORMAT", format));
    let (mut serve, addr) = serve_on(&server, &vars);
    let refused = (1..=1_000)
        .filter(|i| scan_through(addr, &flooder(*i)).0 == 503)
        .count();
    assert_eq!(refused, 1_000 - 15);
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    assert!(serve.wait().unwrap().success());
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut serve.stdout.take().unwrap(), &mut stdout).unwrap();
    let stderr = stderr_of(&mut serve);
    assert!(!stderr.contains("scan refused"), "{stderr}");
    assert!(!stderr.contains("backlog"), "{stderr}");
    let bytes = stdout.len() + stderr.len();
    assert!(
        bytes < 100 * refused,
        "{format}: {bytes} bytes for {refused} refusals: {stderr}"
    );
    // Every refusal is counted, in a few EMF lines (the first at once, the
    // rest when serve stopped).
    let lines: Vec<u64> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|d| d["stella_quota_requests_backlog_full_total"].as_u64())
        .collect();
    assert_eq!(lines.iter().sum::<u64>(), refused as u64, "{stdout}");
    assert!(lines.len() <= 3, "{lines:?}");
}

/// On a 3-primary cluster, where the sleep leases, each network and each subject
/// live in slots of their own (the sleep lease asked after the pacing step, each
/// level paced and refunded on its own node): a /48's parallel burst of
/// 60 /64s sleeps at most two at once, every 202 has its job and start,
/// and the refused scans leave no key. Twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_beds_hold_and_refusals_leave_no_key() {
    for _ in 0..2 {
        let cluster = ValkeyCluster::start();
        let vars = [
            ("QUOTA_ANON", "1"),
            ("QUOTA_NETWORKS", "v6/48=4"),
            ("QUOTA_SOFT_WINDOW", "2"),
            ("QUOTA_SOFT_DELAY_MS", "300"),
            ("QUOTA_HARD_DELAY_MS", "600"),
            ("QUOTA_MAX_BACKLOG_MS", "1500"),
            ("QUOTA_MAX_ASLEEP", "2"),
            ("QUOTA_STORE_TIMEOUT_MS", TIMEOUT_MS),
        ];
        let gates: Vec<Arc<ValkeyGate>> = (0..2)
            .map(|_| Arc::new(cluster_gate(&cluster, &vars)))
            .collect();
        let seen = burst(&gates, (0..60).map(|i| scan_from(&flooder(i))).collect()).await;
        let accepted = seen.iter().filter(|s| s.status == 202).count();
        assert_eq!(
            accepted + seen.iter().filter(|s| s.status == 503).count(),
            60
        );
        assert!((6..=8).contains(&accepted), "{accepted} accepted");
        let most = most_asleep(&seen);
        assert!((1..=2).contains(&most), "{most} asleep at once");
        every_accepted_scan_is_queued(&cluster.stream_jobs("jobs").await, &seen);
        let keys: Vec<String> = (cluster.keys("quota:*").into_iter())
            .filter(|k| k != "quota:asleep")
            .collect();
        assert_eq!(keys.len(), 2 * accepted + 2, "{keys:#?}");
    }
}

/// The refusal memory never hides a saved answer: a keyed scan accepted
/// before its network's line filled is replayed on retry (one read of its
/// record), while a new key from the same network is refused at once.
#[tokio::test]
async fn a_known_refusal_still_replays_a_saved_answer() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &flood_vars("60000", "300000"));
    let keyed = |i: u32, key: &'static str| {
        let mut r = scan_from(&flooder(i));
        r.headers
            .insert("idempotency-key", http::HeaderValue::from_static(key));
        r
    };
    let first = gate.handle(keyed(0, "k-1")).await;
    assert_eq!(first.status(), 202);
    let mut i = 0;
    while gate.handle(scan_from(&flooder(i + 1))).await.status() == 202 {
        i += 1;
        assert!(i < 20, "the /48's line never filled");
    }
    let replay = gate.handle(keyed(0, "k-1")).await;
    assert_eq!(replay.status(), 202, "{}", json(&replay));
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(json(&replay)["scanId"], json(&first)["scanId"]);
    let fresh = gate.handle(keyed(0, "k-2")).await;
    assert_eq!(fresh.status(), 503);
    assert_eq!(json(&fresh)["error"], "backlog_full");
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 1 + i as usize);
}
