//! Exactly once at every timing of a store stall, through the real
//! `quota-gate serve` on a real Valkey (`SIGSTOP`, then `SIGCONT`), with the
//! scan queue a stream on that same Valkey: the matrix of timings, worker
//! counts and fail modes, each case run several times.
//!
//! A case: a warm-up, Valkey stopped, keyed and unkeyed scans sent by
//! clients of their own a gap apart, Valkey resumed when the stall is over
//! (their answers still awaited), every key retried (at once or after a
//! wait) until 202, then the stream and the counter read. What must hold afterwards:
//! - keyed: exactly one job per key, under the scanId the retry returned,
//!   with the retry's tier and delay; the count grew by one per key;
//! - unkeyed: every 202 has exactly one job, a 503 that said `"queued":
//!   false` has none, a job no 202 holds sits behind a 503 that said
//!   `"unknown"`, and the counter equals the counted answers;
//! - closed mode never un-counts a counted scan, open mode never answers
//!   unmetered once the store is back (200 ms grace).
//!
//! The full matrix (every combination, 20 runs each) is `scripts/stall-soak`;
//! the suite runs a covering subset, cases in parallel.

use quota_gate_testkit as common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::client::{build, send};
use common::serve::spawn_serve;
use common::{ValkeyServer, stream_jobs};
use serde_json::Value;

/// One timing of the stall.
#[derive(Debug, Clone, Copy)]
struct Case {
    /// Between two requests sent during the stall.
    gap: Duration,
    /// From `SIGSTOP` to `SIGCONT`.
    stall: Duration,
    /// From `SIGCONT` to the first retry.
    retry_after: Duration,
    closed: bool,
    workers: u8,
    /// Warm every worker before the stall (several scans), or one scan.
    warm_all: bool,
    /// Every scan over quota (hard tier, deferred 60 s), or all within.
    over_quota: bool,
}

const KEYED: usize = 6;
const UNKEYED: usize = 3;
const SCAN: &str = r#"{"image":"alpine:3.20"}"#;

/// One answer: status, body, whether it was unmetered, and when it came.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    body: Value,
    unmetered: bool,
    at: Instant,
}

fn scan(addr: SocketAddr, key: Option<&str>) -> Answer {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(key) = key {
        headers.push(("Idempotency-Key", key));
    }
    let request = build("POST", "/scan", &headers, SCAN);
    let (status, text) = send(addr, request.as_bytes(), Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("no answer: {e}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Answer {
        status,
        body: serde_json::from_str(body).unwrap_or(Value::Null),
        unmetered: head
            .to_ascii_lowercase()
            .contains("x-stella-quota: unavailable"),
        at: Instant::now(),
    }
}

/// Retries a key until it is answered 202 (409 and 503 say to retry).
fn settle(addr: SocketAddr, key: &str) -> Answer {
    for _ in 0..150 {
        let a = scan(addr, Some(key));
        match a.status {
            202 => return a,
            409 | 503 => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("{key}: unexpected {other}: {}", a.body),
        }
    }
    panic!("{key} never settled");
}

/// The subject's counter (every scan here comes from 127.0.0.1).
fn counter(rt: &tokio::runtime::Runtime, server: &ValkeyServer) -> i64 {
    rt.block_on(async {
        match server.keys("quota:ip:{*}").await.first() {
            Some(k) => server.get::<Option<i64>>(k).await.unwrap_or(0),
            None => 0,
        }
    })
}

fn run(case: Case, round: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = ValkeyServer::start();
    let (url, workers) = (server.url(), case.workers.to_string());
    let mut vars = vec![
        ("VALKEY_URL", url.as_str()),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("QUOTA_BREAKER_FAILURES", "0"),
        ("QUOTA_SERVE_WORKERS", workers.as_str()),
        (
            "QUOTA_FAIL_MODE",
            if case.closed { "closed" } else { "open" },
        ),
        ("QUOTA_DELAY_MODE", "defer"),
    ];
    if case.over_quota {
        // Every scan hard (60 s, deferred), with room for all of them.
        vars.extend([
            ("QUOTA_ANON", "1"),
            ("QUOTA_SOFT_WINDOW", "0"),
            ("QUOTA_MAX_BACKLOG_MS", "86400000"),
        ]);
    } else {
        vars.push(("QUOTA_ANON", "1000"));
    }
    let (_serve, addr) = spawn_serve(&vars);
    let tag = format!("{case:?} round {round}");

    for i in 0..if case.warm_all { 6 } else { 1 } {
        assert_eq!(scan(addr, Some(&format!("warm-{i}"))).status, 202, "{tag}");
    }
    let before = counter(&rt, &server);
    let jobs_before = rt.block_on(stream_jobs(&server, "jobs")).len();

    server.signal("STOP");
    let stopped = Instant::now();
    // Clients of their own, sent `gap` apart, each waiting for its answer
    // while the store is stopped and as it comes back.
    let (first, unkeyed, resumed) = std::thread::scope(|s| {
        let mut sent = Vec::new();
        for i in 0..KEYED + UNKEYED {
            let key = (i % 3 != 2).then(|| format!("stall-{}", i - i / 3));
            sent.push(s.spawn(move || {
                let answer = scan(addr, key.as_deref());
                (key, answer)
            }));
            std::thread::sleep(case.gap);
        }
        std::thread::sleep(case.stall.saturating_sub(stopped.elapsed()));
        server.signal("CONT");
        let resumed = Instant::now();
        let mut first = HashMap::new();
        let mut unkeyed = Vec::new();
        for client in sent {
            match client.join().unwrap() {
                (Some(key), answer) => {
                    first.insert(key, answer);
                }
                (None, answer) => unkeyed.push(answer),
            }
        }
        (first, unkeyed, resumed)
    });
    std::thread::sleep(case.retry_after.saturating_sub(resumed.elapsed()));

    // Each key's client retries on its own, as real ones do, all at once.
    let settled: HashMap<String, Answer> = std::thread::scope(|s| {
        let retries: Vec<_> = first
            .keys()
            .map(|key| s.spawn(move || (key.clone(), settle(addr, key))))
            .collect();
        retries.into_iter().map(|r| r.join().unwrap()).collect()
    });
    // Unkeyed scans once the store is back are counted, not unmetered.
    let after: Vec<Answer> = (0..2).map(|_| scan(addr, None)).collect();
    // Late commands have landed by now (they ran as the server woke).
    std::thread::sleep(Duration::from_millis(300));
    let jobs = rt.block_on(stream_jobs(&server, "jobs"));
    let jobs = &jobs[jobs_before..];
    let grew = counter(&rt, &server) - before;

    check_keyed(&tag, &first, &settled, jobs);
    let counted_unkeyed = check_unkeyed(&tag, case, &unkeyed, &after, &settled, jobs);
    for a in &after {
        assert_eq!(a.status, 202, "{tag}: {}", a.body);
        assert!(!a.unmetered, "{tag}: unmetered after the store was back");
    }
    for a in settled.values().chain(&after) {
        if a.at > resumed + Duration::from_millis(200) {
            assert!(!a.unmetered, "{tag}: unmetered after resume: {}", a.body);
        }
    }
    let expected = (KEYED + counted_unkeyed + after.len()) as i64;
    assert_eq!(grew, expected, "{tag}: the counter grew by {grew}");
}

/// Keyed: one job per key, under the retry's scanId, with its tier and delay.
fn check_keyed(
    tag: &str,
    first: &HashMap<String, Answer>,
    settled: &HashMap<String, Answer>,
    jobs: &[Value],
) {
    for (key, answer) in settled {
        let id = answer.body["scanId"].as_str().unwrap();
        let mine: Vec<&Value> = jobs.iter().filter(|j| j["scanId"] == id).collect();
        assert_eq!(mine.len(), 1, "{tag}: {key} has {} jobs", mine.len());
        let job = mine[0];
        assert_ne!(job["tier"], "unmetered", "{tag}: {key}: {job}");
        assert!(
            !answer.unmetered,
            "{tag}: {key} settled unmetered: {}",
            answer.body
        );
        assert_eq!(
            job["delayMs"], answer.body["delayMs"],
            "{tag}: {key}: {job}"
        );
        assert_eq!(job["notBefore"], answer.body["notBefore"], "{tag}: {key}");
        if let Some(first_id) = first[key].body["scanId"].as_str() {
            assert_eq!(first_id, id, "{tag}: {key} changed its scanId");
        }
    }
}

/// Unkeyed: every 202 has one job, a 503 "not queued" none, a stray job sits
/// behind a 503 "unknown". Returns how many unkeyed answers were counted.
fn check_unkeyed(
    tag: &str,
    case: Case,
    unkeyed: &[Answer],
    after: &[Answer],
    settled: &HashMap<String, Answer>,
    jobs: &[Value],
) -> usize {
    let keyed_ids: HashSet<&str> = settled
        .values()
        .chain(after)
        .map(|a| a.body["scanId"].as_str().unwrap())
        .collect();
    let mut counted = 0;
    let mut unknown = 0;
    for a in unkeyed {
        match a.status {
            202 => {
                let id = a.body["scanId"].as_str().unwrap();
                let n = jobs.iter().filter(|j| j["scanId"] == id).count();
                assert_eq!(n, 1, "{tag}: a 202 with {n} jobs");
                counted += usize::from(!a.unmetered);
                assert!(!case.closed || !a.unmetered, "{tag}: closed mode unmetered");
            }
            503 if a.body["queued"] == "unknown" => unknown += 1,
            503 => {}
            other => panic!("{tag}: unexpected {other}: {}", a.body),
        }
    }
    let accepted: HashSet<&str> = unkeyed
        .iter()
        .filter_map(|a| a.body["scanId"].as_str())
        .collect();
    let stray = jobs
        .iter()
        .filter_map(|j| j["scanId"].as_str())
        .filter(|id| !keyed_ids.contains(id) && !accepted.contains(id))
        .count();
    assert!(
        stray <= unknown,
        "{tag}: {stray} jobs no answer holds, {unknown} answers said unknown"
    );
    counted
}

/// The covering subset: every value of every dimension appears, and the
/// dimensions the failures hinged on (workers, warm-up, retry timing) are
/// crossed with both fail modes.
fn cases() -> Vec<Case> {
    let ms = Duration::from_millis;
    let s = Duration::from_secs;
    let case = |gap, stall, retry_after, closed, workers, warm_all, over_quota| Case {
        gap: ms(gap),
        stall: s(stall),
        retry_after: s(retry_after),
        closed,
        workers,
        warm_all,
        over_quota,
    };
    vec![
        case(0, 1, 0, false, 2, false, false),
        case(100, 3, 3, false, 2, false, false),
        case(300, 6, 0, false, 2, false, false),
        case(0, 3, 0, false, 1, true, false),
        case(100, 1, 3, false, 1, false, true),
        case(0, 1, 0, false, 2, false, true),
        case(0, 1, 0, true, 2, false, false),
        case(300, 3, 3, true, 2, true, false),
        case(100, 1, 0, true, 1, false, true),
        case(0, 6, 3, true, 2, false, true),
    ]
}

/// Every combination of the matrix (`STALL_MATRIX=full`, for the soak).
fn full_matrix() -> Vec<Case> {
    let mut all = Vec::new();
    for gap in [0, 100, 300] {
        for stall in [1, 3, 6] {
            for retry_after in [0, 3] {
                for closed in [false, true] {
                    for workers in [1, 2] {
                        for warm_all in [false, true] {
                            for over_quota in [false, true] {
                                all.push(Case {
                                    gap: Duration::from_millis(gap),
                                    stall: Duration::from_secs(stall),
                                    retry_after: Duration::from_secs(retry_after),
                                    closed,
                                    workers,
                                    warm_all,
                                    over_quota,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    all
}

/// How many cases run at once: a case mostly waits (on its stall, its
/// retries and the leases they meet), so ten cost little CPU.
const RUNNERS: usize = 10;

/// Every case of the covering subset, twice, [`RUNNERS`] at a time (each
/// runner takes the next case as soon as its last one ends): exactly one
/// job and one count per keyed scan, and every unkeyed answer true afterwards.
/// `STALL_MATRIX=full` and `STALL_ROUNDS=n` make it the soak (`scripts/stall-soak`).
#[test]
fn every_timing_of_a_stall_settles_exactly_once() {
    let full = std::env::var("STALL_MATRIX").is_ok_and(|m| m == "full");
    let rounds: usize = std::env::var("STALL_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let runs: Vec<(Case, usize)> = if full { full_matrix() } else { cases() }
        .into_iter()
        .flat_map(|c| (0..rounds).map(move |r| (c, r)))
        .collect();
    let next = std::sync::Mutex::new(runs.into_iter());
    let failures: Vec<String> = std::thread::scope(|s| {
        let runners: Vec<_> = (0..RUNNERS)
            .map(|_| {
                s.spawn(|| {
                    let mut failures = Vec::new();
                    loop {
                        // Taken, and the lock let go, before the run.
                        let taken = next.lock().unwrap().next();
                        let Some((case, round)) = taken else { break };
                        let ran = std::panic::catch_unwind(|| run(case, round));
                        failures.extend(ran.err().map(|e| {
                            e.downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                                .unwrap_or_default()
                        }));
                    }
                    failures
                })
            })
            .collect();
        runners
            .into_iter()
            .flat_map(|r| r.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "{failures:#?}");
}
