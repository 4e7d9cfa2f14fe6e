//! Failover, for real: a Valkey primary with a replica, both behind a TCP
//! proxy (what the gate sees of ElastiCache's primary endpoint). The
//! replica falls behind (its link to the primary cut), a burst of keyed
//! and unkeyed scans is answered by the primary alone, then the primary is
//! SIGKILLed, the replica promoted (`REPLICAOF NO ONE`), the proxy
//! switched to it and a new replica of it started; every keyed client
//! retries until it gets a 202. The jobs
//! go to a queue outside the failover (its own server, as SQS is).
//!
//! Measured: counts lost, records lost, keyed scans queued twice, scans lost.
//! Without the remedy, every record written in the lag is gone and every
//! keyed scan of the lag is queued (and run) twice; with
//! `VALKEY_WAIT_REPLICAS=1` a keyed scan of the lag is refused until its
//! claim is safe, none is queued twice, and either way the counts lost are
//! the unkeyed scans of the lag, no more (docs/production.md, "Failover").

use quota_gate_testkit as common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use common::proxy::Proxy;
use common::*;
use quota_gate::gate::{ENQUEUE_TIMEOUT, Gate, GateRequest};
use quota_gate::io::connection::Valkey;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::store::valkey::ValkeyStore;
use redis::AsyncCommands;

/// Scans per phase and kind: before the lag and during it.
const SCANS: usize = 12;

type FailoverGate = Gate<ValkeyStore, StreamQueue>;

/// What a failover cost.
#[derive(Debug, Default, PartialEq, Eq)]
struct Loss {
    /// Counted scans (each keyed scan once) less the counter after.
    counts: i64,
    /// Keyed scans answered 202 before the failover whose record is gone.
    records: usize,
    /// Keyed scans with jobs under more than one `scanId`.
    queued_twice: usize,
    /// 202s without their job.
    scans: usize,
}

/// A gate counting through `store_url`; its jobs go to a stream on `queue`,
/// or on the store itself.
fn gate(store_url: &str, queue: Option<&ValkeyServer>, wait: u32) -> FailoverGate {
    // A short lease, so a retry takes over an abandoned attempt soon.
    gate_within(store_url, queue, wait, "3000")
}

/// [`gate`], its answers (and leases) bound by `gateway_ms`.
fn gate_within(
    store_url: &str,
    queue: Option<&ValkeyServer>,
    wait: u32,
    gateway_ms: &str,
) -> FailoverGate {
    let wait = wait.to_string();
    let config = config(&[
        ("VALKEY_URL", store_url),
        ("VALKEY_WAIT_REPLICAS", wait.as_str()),
        ("QUOTA_ANON", "1000"),
        ("QUOTA_DELAY_MODE", "defer"),
        ("QUOTA_PACING", "off"),
        ("QUOTA_BREAKER_FAILURES", "0"),
        ("QUOTA_STORE_TIMEOUT_MS", "300"),
        ("QUOTA_GATEWAY_TIMEOUT_MS", gateway_ms),
    ]);
    wired(config, queue)
}

/// A gate on its defaults (sleep mode, pacing, the default limits and
/// store timeout) with `VALKEY_WAIT_REPLICAS=1` and its jobs on the store's
/// stream, as `serve` runs it.
fn default_gate(store_url: &str) -> FailoverGate {
    wired(
        config(&[("VALKEY_URL", store_url), ("VALKEY_WAIT_REPLICAS", "1")]),
        None,
    )
}

/// The gate of `config`, its jobs on a stream on `queue`, or on the store.
fn wired(config: quota_gate::config::Config, queue: Option<&ValkeyServer>) -> FailoverGate {
    let store = Valkey::from_config(&config).unwrap().unwrap();
    let wait = config.store.valkey.as_ref().unwrap().wait_replicas;
    // A stream on the store's Valkey waits for its replicas as the store
    // does (as the gate wires it); one apart has none.
    let queue = match queue {
        Some(q) => StreamQueue::new(
            Valkey::new(&q.url(), false, Duration::from_secs(1)).unwrap(),
            "jobs",
        ),
        None => StreamQueue::new(store.clone(), "jobs").with_wait(wait),
    };
    Gate::new(
        config,
        ValkeyStore::new(store).with_wait(wait),
        queue,
        Meter::new("test", None),
    )
    .unwrap()
}

/// Scan `n` of a phase: its own body, from one of five subjects, keyed or not.
fn scan(phase: &str, n: usize, keyed: bool) -> GateRequest {
    let mut r = scan_from(&format!("198.51.100.{}", n % 5 + 1));
    let kind = if keyed { "keyed" } else { "plain" };
    r.body = format!(r#"{{"image":"registry.example.com/{phase}/{kind}:{n}"}}"#).into();
    if keyed {
        r.headers
            .insert("idempotency-key", format!("{phase}-{n}").parse().unwrap());
    }
    r
}

/// Keeps a keyed client at it until its 202 (409 and 503 say to retry).
async fn until_accepted(gate: &FailoverGate, request: &GateRequest) -> serde_json::Value {
    until_accepted_every(gate, request, 60, Duration::from_millis(250)).await
}

/// Every subject's counter on `server`, summed.
async fn counted_on(server: &ValkeyServer) -> i64 {
    let mut c = server.client().await;
    let keys: Vec<String> = c.keys("quota:*").await.unwrap();
    let mut total = 0;
    // The subjects' counters (a network level's counts the same scans again).
    for key in keys
        .iter()
        .filter(|k| k.ends_with('}') && !k.starts_with("quota:net:"))
    {
        let n: i64 = c.get(key).await.unwrap();
        total += n;
    }
    total
}

/// One failover under a burst, with `wait` replicas required of a keyed
/// claim; the jobs on a queue of their own, or on the store's stream.
async fn failover(wait: u32, queue_apart: bool) -> Loss {
    let primary = ValkeyServer::start();
    // The replica follows the primary through a link the test can cut.
    let link = Proxy::start(primary.addr()).await;
    let replica = ValkeyServer::replica_of(link.addr).await;
    let queue = ValkeyServer::start();
    let proxy = Proxy::start(primary.addr()).await;
    let gate = gate(&proxy.url(), queue_apart.then_some(&queue), wait);

    // `scanId`s answered before the failover; unkeyed 202s (each counted).
    let (mut answered, mut plain) = (HashSet::new(), 0);
    // The image of every scan answered 202: each names one scan.
    let mut images = HashSet::new();
    let mut keyed = Vec::new();
    let note = |body: &serde_json::Value, answered: &mut HashSet<String>| {
        answered.insert(body["scanId"].as_str().unwrap().to_owned());
    };
    // Before the lag: replicated as it happens.
    for n in 0..SCANS {
        let k = scan("before", n, true);
        note(&until_accepted(&gate, &k).await, &mut answered);
        images.insert(k.body.clone());
        keyed.push(k);
        let plain_scan = scan("before", n, false);
        images.insert(plain_scan.body.clone());
        let r = gate.handle(plain_scan).await;
        assert_eq!(r.status(), 202);
        note(&json(&r), &mut answered);
        plain += 1;
    }
    // Replication is asynchronous: the replica is made to hold all of it
    // (a write of the test's own, then `WAIT`) before its link is cut.
    let mut c = primary.client().await;
    let () = c.set("replicated", 1).await.unwrap();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(acked, 1, "the replica caught up before the lag");
    // The lag: the replica is cut off from the primary's writes.
    link.cut();
    let mut lagged = Vec::new();
    for n in 0..SCANS {
        let k = scan("during", n, true);
        let r = gate.handle(k.clone()).await;
        if r.status() == 202 {
            note(&json(&r), &mut answered);
            lagged.push(k.body.clone());
        }
        keyed.push(k);
        let plain_scan = scan("during", n, false);
        let r = gate.handle(plain_scan.clone()).await;
        // Counted either way; answered 202 only when its job is safe: with
        // the stream on the store and `wait`, not before the replica has it.
        plain += 1;
        if wait > 0 && !queue_apart {
            assert_eq!(r.status(), 503, "a job on the primary alone is no 202");
            assert_eq!(json(&r)["queued"], "unknown");
            continue;
        }
        assert_eq!(r.status(), 202, "a job apart waits for no replica");
        images.insert(plain_scan.body.clone());
        note(&json(&r), &mut answered);
    }
    // The failover: the primary dies, the replica is promoted, the endpoint moves.
    primary.signal("KILL");
    replica.promote().await;
    proxy.switch(replica.addr());
    // The failed node replaced, as ElastiCache does: a new replica of the
    // promoted one (until then a `WAIT 1` there reaches nobody, and every
    // write that needs it is refused as unknown).
    let _replacement = ValkeyServer::replica_of(replica.addr()).await;
    // Every keyed client retries until it gets its 202. A scan answered in
    // the lag whose retry gets another scanId lost its record.
    let mut records = 0;
    for k in &keyed {
        let body = until_accepted(&gate, k).await;
        let id = body["scanId"].as_str().unwrap();
        if lagged.contains(&k.body) && !answered.contains(id) {
            records += 1;
        }
        images.insert(k.body.clone());
    }
    let jobs = stream_jobs(if queue_apart { &queue } else { &replica }, "jobs").await;
    let mut by_image: HashMap<String, HashSet<String>> = HashMap::new();
    for job in &jobs {
        let image = job["request"]["image"].as_str().unwrap();
        by_image
            .entry(format!(r#"{{"image":"{image}"}}"#))
            .or_default()
            .insert(job["scanId"].as_str().unwrap().to_owned());
    }
    // Each scan counted once: every unkeyed 202, every keyed scan.
    let counted = (plain + keyed.len()) as i64;
    Loss {
        counts: counted - counted_on(&replica).await,
        records,
        queued_twice: by_image.values().filter(|ids| ids.len() > 1).count(),
        scans: images.len() - by_image.len(),
    }
}

/// With the jobs on a stream apart from the failing Valkey, no keyed scan
/// is queued twice across a failover. Without the remedy it loses every
/// record and count written in the replica's lag: each keyed retry of the
/// lag claims its key anew, under a new `scanId`, and is counted again, but
/// the stream holds a marker per record and answers the retry with the
/// `scanId` of the job it holds (SQS has no such marker: there the lag's
/// keyed scans are queued twice). With `VALKEY_WAIT_REPLICAS=1` the counts
/// lost are the unkeyed scans of the lag, no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_the_stream_apart_queues_no_keyed_scan_twice() {
    for wait in [0, 1] {
        let loss = failover(wait, true).await;
        println!("failover, stream apart, VALKEY_WAIT_REPLICAS={wait}: {loss:?}");
        assert_eq!(
            loss,
            Loss {
                counts: SCANS as i64,
                records: 0,
                queued_twice: 0,
                scans: 0,
            },
            "VALKEY_WAIT_REPLICAS={wait}"
        );
    }
}

/// With the jobs on the failing Valkey's own stream and no remedy, the lag's
/// jobs go with it: its unkeyed scans are lost (202 without a job) and its
/// keyed scans are queued again by their retries, once each. With
/// `VALKEY_WAIT_REPLICAS=1` nothing is answered 202 before the replica has
/// its job: the lag's unkeyed scans get 503 `"queued":"unknown"` (counted;
/// those counts go with the primary), its keyed scans are refused until
/// safe, and no 202 is without its job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_of_the_stream_loses_the_lags_unkeyed_scans() {
    for wait in [0, 1] {
        let loss = failover(wait, false).await;
        println!("failover, stream on the store, VALKEY_WAIT_REPLICAS={wait}: {loss:?}");
        assert_eq!(
            loss,
            Loss {
                counts: SCANS as i64,
                records: if wait == 0 { SCANS } else { 0 },
                queued_twice: 0,
                scans: if wait == 0 { SCANS } else { 0 },
            }
        );
    }
}

/// A keyed scan whose settlement fails at a failover is settled once the
/// endpoint moves, within its attempt's deadline, so its retry goes on at
/// once rather than meeting 409 until the lease (29 s) runs out. The job's
/// queue hangs, so the enqueue times out and the lease is to be released;
/// the primary is dead when the release goes out, and the replica is
/// promoted a second later. (Before the settlement was retried, the retry
/// met 409 for 24 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_failed_at_a_failover_is_retried_within_the_deadline() {
    let primary = ValkeyServer::start();
    let replica = ValkeyServer::replica_of(primary.addr()).await;
    let queue = ValkeyServer::start();
    let proxy = Proxy::start(primary.addr()).await;
    // The claim reaches the replica before the scan goes on (`WAIT 1`).
    let gate = gate_within(&proxy.url(), Some(&queue), 1, "29000");
    // Both connections up first, so the enqueue is sent and hangs.
    assert_eq!(gate.handle(scan("settle", 1, false)).await.status(), 202);
    let keyed = scan("settle", 0, true);
    queue.signal("STOP");
    let started = Instant::now();
    let failover = async {
        // Mid-enqueue, the primary dies; the endpoint moves a second after
        // the enqueue gives up (ENQUEUE_TIMEOUT), and the queue wakes.
        tokio::time::sleep(Duration::from_secs(1)).await;
        primary.signal("KILL");
        tokio::time::sleep(ENQUEUE_TIMEOUT).await;
        replica.promote().await;
        proxy.switch(replica.addr());
        queue.signal("CONT");
    };
    let attempt = async {
        let r = gate.handle(keyed.clone()).await;
        (r, started.elapsed())
    };
    let ((first, answered), ()) = tokio::join!(attempt, failover);
    assert_eq!(first.status(), 503, "{:?}", first.body());
    assert_eq!(
        json(&first)["queued"],
        "unknown",
        "{:?} after {answered:?}",
        json(&first)
    );
    // The client retries: its retry takes the released scan over at once.
    let mut statuses = Vec::new();
    let accepted = loop {
        let r = gate.handle(keyed.clone()).await;
        statuses.push(r.status().as_u16());
        if r.status() == 202 {
            break json(&r);
        }
        assert!(
            started.elapsed() < Duration::from_secs(12),
            "no 202 within 12 s of a 29 s lease (first answer after {answered:?}): {statuses:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    println!(
        "settlement at a failover: first answer after {answered:?}, 202 after {:?}, {statuses:?}",
        started.elapsed()
    );
    // One job: the hung enqueue landed, and the retry's was deduplicated.
    let jobs = stream_jobs(&queue, "jobs").await;
    let ids: Vec<_> = jobs.iter().map(|j| j["scanId"].clone()).skip(1).collect();
    assert_eq!(ids, [accepted["scanId"].clone()]);
}

/// `WAIT` names no key, so a cluster cannot take the remedy: refused at start, naming the variable.
#[test]
fn wait_needs_a_standalone_valkey() {
    let vars = [
        ("QUOTA_HASH_SECRET", SECRET_TEXT),
        ("VALKEY_URL", "redis://127.0.0.1:6379"),
        ("VALKEY_CLUSTER", "true"),
        ("VALKEY_WAIT_REPLICAS", "1"),
    ];
    let lookup = |k: &str| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    let e = quota_gate::Config::from_lookup(lookup).unwrap_err();
    assert!(e.to_string().contains("VALKEY_WAIT_REPLICAS"), "{e}");
    let standalone = |k: &str| (k != "VALKEY_CLUSTER").then(|| lookup(k)).flatten();
    let c = quota_gate::Config::from_lookup(standalone).unwrap();
    assert_eq!(c.store.valkey.unwrap().wait_replicas, 1);
}

/// Keyed clients in the lagged failover, and the keyed scans each sends.
const CLIENTS: usize = 10;
const KEYED_EACH: usize = 25;

/// What one lagged failover did to the keyed scans, read from the new
/// primary's stream and the scanner's log.
#[derive(Debug, Default)]
struct Runs {
    /// Keys whose scan is in the stream under more than one `scanId`.
    queued_twice: Vec<String>,
    /// `scanId`s that ran (ended) more than once.
    ran_twice: Vec<String>,
    /// 202'd `scanId`s with no job on the new primary.
    lost: Vec<String>,
    /// Replays that answered another `scanId` than the client's 202.
    replayed_otherwise: Vec<String>,
    /// Keys whose scan ran under more than one `scanId` (one of them may
    /// have run from a consumer's hands, its job on the old primary only).
    ran_under_two_ids: Vec<String>,
}

impl Runs {
    fn clean(&self) -> bool {
        self.queued_twice.is_empty()
            && self.ran_twice.is_empty()
            && self.lost.is_empty()
            && self.replayed_otherwise.is_empty()
            && self.ran_under_two_ids.is_empty()
    }
}

/// Client `c`'s `n`th keyed scan: its own subject, key and image.
fn keyed_scan(c: usize, n: usize) -> GateRequest {
    let mut r = scan_from(&format!("198.51.100.{}", c + 1));
    r.body = format!(r#"{{"image":"registry.example.com/c{c}:{n}"}}"#).into();
    let key = format!("c{c}-{n}");
    r.headers.insert("idempotency-key", key.parse().unwrap());
    r
}

/// The `Idempotency-Key` of a job, read back from its image.
fn key_of(job: &serde_json::Value) -> Option<String> {
    key_of_image(job["request"]["image"].as_str()?)
}

/// The `Idempotency-Key` of a keyed scan's image.
fn key_of_image(image: &str) -> Option<String> {
    let (c, n) = image
        .strip_prefix("registry.example.com/")?
        .split_once(':')?;
    c.starts_with('c').then(|| format!("{c}-{n}"))
}

/// How often a keyed client retries on any non-202, through the whole
/// outage, as the clients of the report did.
const RETRY_EVERY: Duration = Duration::from_millis(200);

/// One keyed client: its scans 0.1 s apart, each retried with the same key
/// on any non-202 until it has its 202; the `scanId` each key was answered.
async fn keyed_client(gate: &FailoverGate, c: usize) -> Vec<(String, String)> {
    let mut answered = Vec::new();
    for n in 0..KEYED_EACH {
        let request = keyed_scan(c, n);
        let body = until_accepted_every(gate, &request, 400, RETRY_EVERY).await;
        answered.push((format!("c{c}-{n}"), body["scanId"].as_str().unwrap().into()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    answered
}

/// Sends `request` up to `tries` times, `pause` apart, until its 202.
async fn until_accepted_every(
    gate: &FailoverGate,
    request: &GateRequest,
    tries: usize,
    pause: Duration,
) -> serde_json::Value {
    for _ in 0..tries {
        let r = gate.handle(request.clone()).await;
        match r.status().as_u16() {
            202 => return json(&r),
            409 | 503 => tokio::time::sleep(pause).await,
            other => panic!("{other}: {:?}", r.body()),
        }
    }
    panic!("no 202 in {tries} tries");
}

/// The lagged failover, end to end: a primary with AOF and a
/// replica that follows it through a link frozen `freeze_ms` before the
/// primary is killed; the gate and two consumers (`--lease lease_s`) reach
/// the primary through an endpoint that moves to the promoted replica;
/// `VALKEY_WAIT_REPLICAS=1`, the jobs on the failing Valkey's stream. The
/// endpoint moves `outage_ms` after the kill (the clients meet a dead
/// endpoint until then), and the promoted replica gets a replica of its
/// own then.
async fn lagged_failover(freeze_ms: u64, lease_s: u64, outage_ms: u64, defaults: bool) -> Runs {
    let primary = ValkeyServer::start_with(&["--appendonly", "yes"]);
    let link = Proxy::start(primary.addr()).await;
    let replica = ValkeyServer::replica_of(link.addr).await;
    let endpoint = Proxy::start(primary.addr()).await;
    let gate = if defaults {
        default_gate(&endpoint.url())
    } else {
        gate(&endpoint.url(), None, 1)
    };
    let scanner = common::consumer::Scanner::new();
    let url = endpoint.url();
    let vars = [
        ("VALKEY_URL", url.as_str()),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("VALKEY_WAIT_REPLICAS", "1"),
        ("SLEEP", "0.2"),
    ];
    let lease = format!("{lease_s}s");
    let args = ["--lease", lease.as_str(), "--concurrency", "4"];
    let _a = scanner.consume("a", &args, &vars, std::process::Stdio::null());
    let _b = scanner.consume("b", &args, &vars, std::process::Stdio::null());
    // The consumers have made the group before the burst.
    let deadline = Instant::now() + Duration::from_secs(10);
    while primary.keys("jobs").await.is_empty() {
        assert!(Instant::now() < deadline, "{}", scanner.all_errors());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = Instant::now();
    let clients = (0..CLIENTS).map(|c| keyed_client(&gate, c));
    let plain = (0..2).map(|p| {
        let gate = &gate;
        async move {
            for n in 0..KEYED_EACH {
                let mut r = scan_from(&format!("198.51.100.{}", 100 + p));
                r.body = format!(r#"{{"image":"registry.example.com/plain{p}:{n}"}}"#).into();
                let _ = gate.handle(r).await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let failover = async {
        tokio::time::sleep_until(started + Duration::from_millis(800)).await;
        link.freeze();
        tokio::time::sleep(Duration::from_millis(freeze_ms)).await;
        primary.signal("KILL");
        link.cut();
        endpoint.cut();
        replica.promote().await;
        tokio::time::sleep(Duration::from_millis(outage_ms)).await;
        endpoint.switch(replica.addr());
        ValkeyServer::replica_of(replica.addr()).await
    };
    let (answered, _, _replacement) = tokio::join!(
        futures_util::future::join_all(clients),
        futures_util::future::join_all(plain),
        failover
    );
    let answered: HashMap<String, String> = answered.into_iter().flatten().collect();
    let mut runs = Runs::default();
    // Every key replayed once: the same scanId (through a 409 as long as a
    // lease taken in the outage holds: the gateway's timeout at most).
    for c in 0..CLIENTS {
        for n in 0..KEYED_EACH {
            let body = until_accepted_every(&gate, &keyed_scan(c, n), 200, RETRY_EVERY).await;
            let key = format!("c{c}-{n}");
            if body["scanId"].as_str() != Some(answered[&key].as_str()) {
                runs.replayed_otherwise.push(key);
            }
        }
    }
    let jobs = stream_jobs(&replica, "jobs").await;
    let mut by_key: HashMap<String, HashSet<String>> = HashMap::new();
    let mut queued = HashSet::new();
    for job in &jobs {
        let id = job["scanId"].as_str().unwrap().to_owned();
        queued.insert(id.clone());
        if let Some(key) = key_of(job) {
            by_key.entry(key).or_default().insert(id);
        }
    }
    runs.queued_twice = by_key
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|(k, ids)| format!("{k}: {ids:?}"))
        .collect();
    runs.lost = answered
        .values()
        .filter(|id| !queued.contains(*id))
        .cloned()
        .collect();
    // Every job left to run, then room for a second run to show.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ended: HashSet<String> = scanner.ends().into_iter().map(|l| l.scan_id).collect();
        if queued.iter().all(|id| ended.contains(id)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} jobs ended\n{}",
            ended.len(),
            queued.len(),
            scanner.all_errors()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(lease_s + 1)).await;
    let mut ends: HashMap<String, Vec<String>> = HashMap::new();
    for l in scanner.ends() {
        ends.entry(l.scan_id.clone())
            .or_default()
            .push(format!("{} {} #{}", l.at_ms, l.tag, l.attempt));
    }
    runs.ran_twice = ends
        .into_iter()
        .filter(|(_, e)| e.len() > 1)
        .map(|(id, e)| format!("{id}: {e:?}"))
        .collect();
    let mut ran: HashMap<String, HashSet<String>> = HashMap::new();
    for l in scanner.ends() {
        if let Some(key) = key_of_image(&l.image) {
            ran.entry(key).or_default().insert(l.scan_id);
        }
    }
    runs.ran_under_two_ids = ran
        .into_iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|(k, ids)| format!("{k}: {ids:?}"))
        .collect();
    runs
}

/// Through a lagged failover with `VALKEY_WAIT_REPLICAS=1` and
/// the jobs on the failing Valkey's stream, every keyed scan is queued
/// under one `scanId` and runs once, every 202's job is on the new primary
/// and every replay answers the first 202's `scanId`; repeated with the
/// lag (freeze to kill) and the consumers' lease varied, every other round
/// on the gate's defaults (`FAILOVER_ROUNDS=N` for more rounds,
/// `FAILOVER_DEFAULTS=1` for all on the defaults).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagged_failover_runs_every_keyed_scan_once() {
    let rounds: Vec<(u64, u64, u64)> = match std::env::var("FAILOVER_ROUNDS") {
        Ok(n) => (0..n.parse::<u64>().unwrap())
            .map(|i| (200 + (i * 397) % 1800, 2 + i % 4, (i * 1_300) % 5_000))
            .collect(),
        Err(_) => vec![
            (1000, 3, 4000),
            (200, 2, 0),
            (2000, 5, 2500),
            (600, 4, 4000),
        ],
    };
    // The rounds run at once, each on servers, proxies and consumers of its own: they mostly wait.
    let rounds =
        rounds
            .iter()
            .enumerate()
            .map(|(round, &(freeze_ms, lease_s, outage_ms))| async move {
                // Every other round on the gate's defaults (sleep, pacing, the
                // default limits and store timeout); all with FAILOVER_DEFAULTS.
                let defaults = round % 2 == 1 || std::env::var("FAILOVER_DEFAULTS").is_ok();
                let runs = lagged_failover(freeze_ms, lease_s, outage_ms, defaults).await;
                println!(
                    "lagged failover {round}: freeze {freeze_ms} ms, lease {lease_s} s, \
             outage {outage_ms} ms, defaults {defaults}: {runs:?}"
                );
                (!runs.clean()).then_some((freeze_ms, lease_s, outage_ms, runs))
            });
    let bad: Vec<_> = futures_util::future::join_all(rounds)
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(bad.is_empty(), "{bad:#?}");
}

/// A write that ran and a `WAIT` the server refused (a node that is no
/// longer a primary) is a write short of its replicas, never a refused
/// write: the queue reads it as a job that may have landed, so a keyed
/// scan's record is kept for its retry, not refunded as not queued. A
/// refused write is still a refusal.
#[tokio::test]
async fn a_refused_wait_is_a_write_short_of_its_replicas() {
    let primary = ValkeyServer::start();
    let replica = ValkeyServer::replica_of(primary.addr()).await;
    let mut c = replica.client().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("replica-read-only")
        .arg("no")
        .query_async(&mut c)
        .await
        .unwrap();
    let valkey = Valkey::new(&replica.url(), false, Duration::from_secs(1)).unwrap();
    let mut set = redis::cmd("SET");
    set.arg("landed").arg("1");
    let (answer, replicated): (String, bool) = valkey
        .send_replicated(set, 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!((answer.as_str(), replicated), ("OK", false));
    let landed: Option<String> = c.get("landed").await.unwrap();
    assert_eq!(landed.as_deref(), Some("1"), "the write ran");
    let mut refused = redis::cmd("LPUSH");
    refused.arg("landed").arg("x");
    let e = valkey
        .send_replicated::<i64>(refused, 1, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(
        matches!(e, quota_gate::io::connection::SendError::Refused(_)),
        "{e:?}"
    );
}
