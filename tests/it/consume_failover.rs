//! The consumer through a failover with replication lag, for real: a Valkey
//! primary with a replica that follows it through a link the test cuts (a
//! lagging replica), both behind a TCP proxy that stands for the primary
//! endpoint; two consumers (`--lease 3s`) run a burst of jobs queued before
//! the lag; mid-burst the link is cut, scans go on against the primary
//! alone, then the primary is `SIGKILL`ed, the replica promoted, the
//! endpoint switched to it and a new replica of it started (the failed node
//! replaced).
//!
//! With `VALKEY_WAIT_REPLICAS=1` a new attempt's claim and a done marker
//! count only once a replica holds them (src/consume/marker.rs): no scan
//! completes twice, and no attempt number is handed to a scanner twice.
//! With `0` the done markers and acks of the lag die with the primary, so a
//! scan that finished in the lag may run again, as attempt 1 again: at most
//! the scans that ended in the lag (and more than half of them in every
//! run), attempt numbers repeat (at most those handed out in the lag), and
//! no job is lost (docs/production.md, "Failover": each test prints its
//! figures and asserts the bounds that table states).

use quota_gate_testkit as common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::consumer::*;
use common::proxy::Proxy;
use common::*;

/// Jobs in the burst.
const JOBS: usize = 24;

/// What a failover did to the burst, from the scanner's own log.
#[derive(Debug)]
struct Outcome {
    /// Ends per `scanId`.
    ends: HashMap<String, usize>,
    /// Starts that repeated an attempt number of their `scanId`.
    repeated_attempts: usize,
    /// Scans that ended while the replica was cut off.
    ended_in_lag: usize,
    /// Starts while the replica was cut off.
    started_in_lag: usize,
}

impl Outcome {
    /// Scans that ran more than once, counted once per extra run.
    fn again(&self) -> usize {
        self.ends.values().map(|n| n - 1).sum()
    }

    /// The figures behind the bounds docs/production.md's failover table states.
    fn figures(&self) -> String {
        format!(
            "ran twice {} (ended in the lag {}), attempts repeated {} (started in the lag {}), \
             scans run {} of {JOBS}",
            self.again(),
            self.ended_in_lag,
            self.repeated_attempts,
            self.started_in_lag,
            self.ends.len()
        )
    }
}

async fn failover(wait: u32) -> Outcome {
    let primary = ValkeyServer::start();
    let link = Proxy::start(primary.addr()).await;
    let replica = ValkeyServer::replica_of(link.addr).await;
    let endpoint = Proxy::start(primary.addr()).await;
    let scanner = Scanner::new();
    let url = endpoint.url();
    let wait_text = wait.to_string();
    let vars = [
        ("VALKEY_URL", url.as_str()),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("VALKEY_WAIT_REPLICAS", wait_text.as_str()),
        ("SLEEP", "0.5"),
    ];
    let args = ["--lease", "3s", "--concurrency", "3"];
    let _a = scanner.consume("a", &args, &vars, std::process::Stdio::null());
    let _b = scanner.consume("b", &args, &vars, std::process::Stdio::null());
    // The group exists once a consumer has started; the burst is replicated.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while primary.keys("jobs").await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            scanner.all_errors()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let jobs: Vec<_> = (0..JOBS).map(|_| job(now_ms())).collect();
    let expected = queue_all(&primary, "jobs", &jobs).await;
    replica.wait_in_sync().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    scanner.wait_for("start", 4, Duration::from_secs(10));

    // The lag: the primary alone takes the consumers' writes.
    let cut_at = now_ms();
    link.cut();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // The failover.
    primary.signal("KILL");
    let failed_at = now_ms();
    replica.promote().await;
    endpoint.switch(replica.addr());
    let _replacement = ValkeyServer::replica_of(replica.addr()).await;

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ended: HashSet<String> = scanner.ends().into_iter().map(|l| l.scan_id).collect();
        if expected.keys().all(|id| ended.contains(id)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "wait={wait}: {} of {JOBS} scans ended\n{:?}\n{}",
            ended.len(),
            scanner.lines(),
            scanner.all_errors()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Room for a second run of a scan to show.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let lines = scanner.lines();
    let mut ends = HashMap::new();
    let mut attempts: HashSet<(String, u64)> = HashSet::new();
    let mut repeated_attempts = 0;
    for l in &lines {
        assert!(expected.contains_key(&l.scan_id), "{l:?}");
        match l.what.as_str() {
            "end" => *ends.entry(l.scan_id.clone()).or_insert(0) += 1,
            "start" if !attempts.insert((l.scan_id.clone(), l.attempt)) => repeated_attempts += 1,
            _ => {}
        }
    }
    let in_lag = |what: &str| {
        lines
            .iter()
            .filter(|l| l.what == what && (cut_at..failed_at).contains(&l.at_ms))
            .count()
    };
    Outcome {
        ends,
        repeated_attempts,
        ended_in_lag: in_lag("end"),
        started_in_lag: in_lag("start"),
    }
}

/// With `VALKEY_WAIT_REPLICAS=1`: every scan ends exactly once, and no
/// attempt number repeats (docs/production.md's failover table, `1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_wait_completes_each_scan_once() {
    for round in 0..2 {
        let outcome = failover(1).await;
        println!(
            "consumer failover, VALKEY_WAIT_REPLICAS=1, round {round}: {}",
            outcome.figures()
        );
        let twice: Vec<_> = outcome.ends.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "ran twice: {twice:?}");
        assert_eq!(outcome.ends.len(), JOBS, "a job was lost: {outcome:?}");
        assert_eq!(outcome.repeated_attempts, 0, "{outcome:?}");
    }
}

/// With `0` (docs/production.md's failover table): no job is lost; scans run
/// twice, more than half and at most all of those that ended in the lag
/// (their done markers and acks went with the primary); attempt numbers
/// repeat, at most those handed out in the lag (their counter's increments
/// went with it too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_without_wait_reruns_at_most_the_lags_scans() {
    for round in 0..2 {
        let outcome = failover(0).await;
        println!(
            "consumer failover, VALKEY_WAIT_REPLICAS=0, round {round}: {}",
            outcome.figures()
        );
        assert_eq!(outcome.ends.len(), JOBS, "a job was lost: {outcome:?}");
        let again = outcome.again();
        assert!(again <= outcome.ended_in_lag, "{outcome:?}");
        assert!(again * 2 > outcome.ended_in_lag, "{outcome:?}");
        let repeated = outcome.repeated_attempts;
        assert!(
            (1..=outcome.started_in_lag).contains(&repeated),
            "{outcome:?}"
        );
    }
}
