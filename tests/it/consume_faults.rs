//! The consumer's fault matrix: real `valkey-server`, real consumers, real
//! scanner processes (testkit's [`consumer`](common::consumer) scanner,
//! which records its starts, ends and overlaps), and the faults a
//! production consumer meets: connections killed at every stage, Valkey
//! restarted with and without AOF, a consumer SIGKILLed or SIGSTOPped
//! mid-scan, SIGTERM past its grace, a hung scanner, a failing one, garbage
//! in the stream, a clock 20 s ahead, a spool consumer killed with held jobs.
//!
//! Every case checks the promises on the scanner's own record: each
//! `scanId` ends exactly once, none starts before its `notBefore`, no two
//! attempts of one scan run at once (the one documented exception: a
//! consumer paused longer than its lease), none is lost. The cheap cases
//! run several rounds each.

use quota_gate_testkit as common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::consumer::*;
use common::*;

/// A short lease, so takeovers happen within the test's seconds.
const LEASE: &[&str] = &["--lease", "2s"];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = LEASE.to_vec();
    a.extend_from_slice(extra);
    a
}

/// `CLIENT KILL TYPE normal` (every client connection but ours).
async fn kill_connections(valkey: &ValkeyServer) {
    let mut c = valkey.client().await;
    let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut c)
        .await;
}

/// `n` jobs due `in_ms` from now (one due at once, the rest spread out).
fn jobs(n: usize, in_ms: i64) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| job(now_ms() + in_ms * i64::try_from(i).unwrap() / 4))
        .collect()
}

/// The connection killed over and over while two consumers hold, run and
/// ack a burst (every stage, several times each): every job ends exactly
/// once, on time, and jobs queued after the last kill run within 5 s.
#[tokio::test(flavor = "multi_thread")]
async fn connections_killed_at_every_stage() {
    let mut rig = StreamRig::start();
    for round in 0..2 {
        rig.scanner = Scanner::new();
        let scanner = &rig.scanner;
        let _a = rig.consume("a", &args(&[]), &[("SLEEP", "0.3")]);
        let _b = rig.consume("b", &args(&[]), &[("SLEEP", "0.3")]);
        let mut expected = rig.queue(&jobs(12, 2_000)).await;
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            kill_connections(&rig.valkey).await;
        }
        let after = jobs(4, 0);
        let queued_at = Instant::now();
        expected.extend(rig.queue(&after).await);
        scanner.wait_for("end", expected.len(), Duration::from_secs(20));
        assert!(
            queued_at.elapsed() < Duration::from_secs(5) + Duration::from_millis(300),
            "round {round}: jobs after the last kill took {:?}",
            queued_at.elapsed()
        );
        std::thread::sleep(Duration::from_millis(1500));
        scanner.assert_once_on_time(&expected, false);
        assert_eq!(rig.pending().await, 0, "{}", scanner.all_errors());
    }
}

/// Valkey crashes (SIGKILL) and restarts with its AOF while consumers hold
/// and run jobs: every job queued before and after runs exactly once, the
/// later ones within 5 s of the restart.
#[tokio::test(flavor = "multi_thread")]
async fn valkey_restarted_with_aof_runs_everything_once() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut rig = StreamRig::on(ValkeyServer::start_with(&aof));
    let _a = rig.consume("a", &args(&[]), &[("SLEEP", "0.5")]);
    let _b = rig.consume("b", &args(&[]), &[("SLEEP", "0.5")]);
    let mut expected = rig.queue(&jobs(10, 3_000)).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    rig.valkey.crash_and_restart(Duration::from_secs(1), &aof);
    let restarted = now_ms();
    let after = rig.queue(&jobs(6, 0)).await;
    expected.extend(after.clone());
    let scanner = &rig.scanner;
    let lines = scanner.wait_for_ends(expected.len(), Duration::from_secs(30));
    scanner.assert_once_on_time(&expected, false);
    for l in lines
        .iter()
        .filter(|l| l.what == "end" && after.contains_key(&l.scan_id))
    {
        // 5 s to reconnect and start, plus the scan's own 0.5 s.
        assert!(
            l.at_ms - restarted < 5_500,
            "{l:?} after a restart at {restarted}\n{lines:#?}\n{}",
            scanner.all_errors()
        );
    }
    assert_eq!(rig.pending().await, 0, "{}", scanner.all_errors());
}

/// Valkey restarted *without* persistence: the stream, the group and the
/// markers are gone (the README says so, and each consumer warned at start);
/// the consumers create the group again and run every job queued after,
/// exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn valkey_restarted_without_aof_recovers_for_new_jobs() {
    let mut rig = StreamRig::start();
    let _a = rig.consume("a", &args(&[]), &[]);
    let _b = rig.consume("b", &args(&[]), &[]);
    // Both consume (their group made) before the crash: one started after would make the group
    // at its start, and neither would meet it gone.
    for tag in ["a", "b"] {
        rig.scanner
            .wait_for_log(tag, "quota-gate consuming", Duration::from_secs(15));
    }
    let before = rig.queue(&jobs(3, 0)).await;
    rig.scanner.wait_for("end", 3, Duration::from_secs(15));
    rig.valkey
        .crash_and_restart(Duration::from_millis(500), &[]);
    let scanner = &rig.scanner;
    let mut expected = before;
    for _ in 0..2 {
        expected.extend(rig.queue(&jobs(4, 0)).await);
        scanner.wait_for("end", expected.len(), Duration::from_secs(15));
    }
    std::thread::sleep(Duration::from_millis(1500));
    scanner.assert_once_on_time(&expected, false);
    for tag in ["a", "b"] {
        let log = scanner.errors_of(tag);
        assert!(log.contains("no persistence"), "{log}");
    }
    // The first consumer to meet NOGROUP creates the group for both.
    let logs = scanner.all_errors();
    assert!(logs.contains("consumer group is gone"), "{logs}");
}

/// A consumer SIGKILLed mid-scan: its scanners (whose work runs in a
/// background subshell) die with it within a second, and the other
/// consumer runs each of those scans to its end once, after the lease.
#[tokio::test(flavor = "multi_thread")]
async fn sigkilled_consumer_takes_its_scanners_along() {
    let mut rig = StreamRig::start();
    let slow = [("SLEEP", "3")];
    for round in 0..2 {
        rig.scanner = Scanner::new();
        let scanner = &rig.scanner;
        let mut a = rig.consume("a", &args(&[]), &slow);
        let expected = rig.queue(&jobs(4, 0)).await;
        scanner.wait_for("start", 4, Duration::from_secs(10));
        a.kill_now();
        let killed = now_ms();
        let _b = rig.consume("b", &args(&[]), &slow);
        let lines = scanner.wait_for_ends(4, Duration::from_secs(20));
        let a_after = lines
            .iter()
            .filter(|l| l.tag == "a" && l.what == "end" && l.at_ms > killed + 1_000);
        assert_eq!(
            a_after.count(),
            0,
            "round {round}: a's scanner outlived it: {lines:?}"
        );
        scanner.assert_once_on_time(&expected, false);
        assert!(
            lines.iter().all(|l| l.what != "end" || l.tag == "b"),
            "{lines:?}"
        );
    }
}

/// SIGTERM with a grace shorter than the scan: the scanners are killed
/// (the whole group, not only `sh`) before the consumer exits, their
/// markers freed; another consumer runs each once.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_past_grace_kills_the_scanners() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    let mut a = rig.consume("a", &args(&["--grace", "1s"]), &[("SLEEP", "4")]);
    let expected = rig.queue(&jobs(3, 0)).await;
    scanner.wait_for("start", 3, Duration::from_secs(10));
    signal(a.id(), "TERM");
    let exited = a.wait().unwrap();
    assert!(exited.success(), "{}", scanner.errors_of("a"));
    let stopped = now_ms();
    let _b = rig.consume("b", &args(&[]), &[("SLEEP", "0.2")]);
    let lines = scanner.wait_for_ends(3, Duration::from_secs(15));
    scanner.assert_once_on_time(&expected, false);
    assert!(
        lines.iter().all(|l| !(l.tag == "a" && l.what == "end")),
        "a's scanners finished after their kill: {lines:?}"
    );
    // Freed markers: b did not wait out a's lease for its starts.
    let b_start = lines.iter().filter(|l| l.tag == "b" && l.what == "start");
    assert!(
        b_start.map(|l| l.at_ms).max().unwrap() - stopped < 2_000,
        "{lines:?}"
    );
}

/// A consumer paused (SIGSTOP) past its lease mid-scan: the other consumer
/// takes the scan over as attempt 2 (the one window where two attempts
/// overlap); when the paused one resumes its scanner is killed at once, and
/// the scan ends exactly once, by attempt 2. Each scanner saw its number.
#[tokio::test(flavor = "multi_thread")]
async fn paused_consumer_loses_its_lease_and_its_scanner() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    let slow = [("SLEEP", "6")];
    let a = rig.consume("a", &args(&[]), &slow);
    let expected = rig.queue(&jobs(1, 0)).await;
    scanner.wait_for("start", 1, Duration::from_secs(10));
    signal(a.id(), "STOP");
    let _b = rig.consume("b", &args(&[]), &slow);
    scanner.wait_for("start", 2, Duration::from_secs(10));
    signal(a.id(), "CONT");
    let resumed = now_ms();
    let lines = scanner.wait_for_ends(1, Duration::from_secs(15));
    scanner.assert_once_on_time(&expected, true);
    let start = |tag: &str| {
        lines
            .iter()
            .find(|l| l.what == "start" && l.tag == tag)
            .unwrap()
    };
    assert_eq!(
        (start("a").attempt, start("b").attempt),
        (1, 2),
        "{lines:?}"
    );
    let end = lines.iter().find(|l| l.what == "end").unwrap();
    assert_eq!((end.tag.as_str(), end.attempt), ("b", 2), "{lines:?}");
    assert!(end.at_ms > resumed, "{lines:?}");
    let log = scanner.errors_of("a");
    assert!(log.contains("lost the scan's lease"), "{log}");
}

/// Valkey stopped (SIGSTOP) past the lease while a scan runs: the consumer
/// stops its scanner (it lost the lease) and runs the scan again as a new
/// attempt, with a higher `SCAN_ATTEMPT` than the stopped run, though the
/// renewals it sent during the stall land when Valkey resumes. The scan ends
/// once, by the last attempt, and `{jobs}:attempt:<scanId>` counts every run.
#[tokio::test(flavor = "multi_thread")]
async fn rerun_after_a_lost_lease_is_a_new_attempt() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    let _a = rig.consume("a", &args(&[]), &[("SLEEP", "4")]);
    let expected = rig.queue(&jobs(1, 0)).await;
    scanner.wait_for("start", 1, Duration::from_secs(10));
    // A renewal has held; then Valkey stalls past the 2 s lease.
    tokio::time::sleep(Duration::from_millis(700)).await;
    rig.valkey.signal("STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    rig.valkey.signal("CONT");
    let lines = scanner.wait_for_ends(1, Duration::from_secs(20));
    scanner.assert_once_on_time(&expected, false);
    let log = scanner.errors_of("a");
    assert!(log.contains("lost the scan's lease"), "{log}");
    let attempts: Vec<u64> = lines
        .iter()
        .filter(|l| l.what == "start")
        .map(|l| l.attempt)
        .collect();
    assert!(attempts.len() >= 2, "not run again: {lines:?}\n{log}");
    assert!(
        attempts.windows(2).all(|w| w[0] < w[1]),
        "a run reused an attempt number: {attempts:?}\n{lines:?}\n{log}"
    );
    let last = *attempts.last().unwrap();
    let end = lines.iter().find(|l| l.what == "end").unwrap();
    assert_eq!(end.attempt, last, "{lines:?}");
    let id = expected.keys().next().unwrap();
    let counted: u64 = rig
        .valkey
        .query(redis::cmd("GET").arg(format!("{{jobs}}:attempt:{id}")))
        .await;
    assert_eq!(counted, last, "{lines:?}");
}

/// A scanner that hangs is killed at `--scan-timeout`, retried, then
/// dead-lettered; the due jobs behind it run meanwhile (here, on the second
/// consumer, once the busy one stops renewing them), each once.
#[tokio::test(flavor = "multi_thread")]
async fn hung_scanner_times_out_and_blocks_nothing() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    let one = [
        "--concurrency",
        "1",
        "--scan-timeout",
        "3s",
        "--max-attempts",
        "2",
        "--backoff",
        "100ms",
    ];
    let _a = rig.consume("a", &args(&one), &[]);
    let hung = job_for("hang", now_ms());
    let hung_id = hung["scanId"].as_str().unwrap().to_owned();
    rig.queue(std::slice::from_ref(&hung)).await;
    scanner.wait_for("start", 1, Duration::from_secs(10));
    let due = rig.queue(&jobs(4, 0)).await;
    let _b = rig.consume("b", &args(&one), &[]);
    scanner.wait_for("end", 4, Duration::from_secs(20));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if xlen(&rig.valkey, "jobs:dead").await == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{:?}\n{}",
            scanner.lines(),
            scanner.all_errors()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines: Vec<Line> = scanner
        .lines()
        .into_iter()
        .filter(|l| l.scan_id != hung_id)
        .collect();
    assert_once_on_time(&lines, &due, false);
    let hung_starts = scanner
        .lines()
        .into_iter()
        .filter(|l| l.scan_id == hung_id && l.what == "start")
        .count();
    assert_eq!(hung_starts, 2, "{:?}", scanner.lines());
    let log = scanner.errors_of("a") + &scanner.errors_of("b");
    assert!(log.contains("scan timeout"), "{log}");
}

/// Garbage among jobs (no job field, broken JSON, an unknown version) and a
/// scanner that fails a few times: the garbage is dead-lettered at once,
/// every real job ends once.
#[tokio::test(flavor = "multi_thread")]
async fn garbage_and_failures_lose_nothing() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    // Fails the first attempt of every scan: the retry runs it.
    let flaky = format!(
        "if [ \"$SCAN_ATTEMPT\" = 1 ]; then exit 3; fi; {}",
        scanner.exec()
    );
    let mut c = rig.valkey.client().await;
    for garbage in [
        vec![("other", "x".to_owned())],
        vec![("job", "{not json".to_owned())],
        vec![(
            "job",
            r#"{"version":99,"scanId":"01a22ae3-0721-75a3-a454-7957ef912430"}"#.to_owned(),
        )],
    ] {
        let mut cmd = redis::cmd("XADD");
        cmd.arg("jobs").arg("*");
        for (k, v) in garbage {
            cmd.arg(k).arg(v);
        }
        let _: String = cmd.query_async(&mut c).await.unwrap();
    }
    let expected = rig.queue(&jobs(6, 1_000)).await;
    let _a = rig.consume("a", &args(&["--exec", &flaky, "--backoff", "100ms"]), &[]);
    scanner.wait_for("end", 6, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(1000));
    scanner.assert_once_on_time(&expected, false);
    assert_eq!(xlen(&rig.valkey, "jobs:dead").await, 3);
    assert_eq!(rig.pending().await, 0);
}

/// A consumer whose clock runs 20 s ahead (libfaketime) times jobs by
/// Valkey's clock: none starts before its notBefore by real time, and the
/// skew is logged. libfaketime's shared memory goes with the consumer.
#[tokio::test(flavor = "multi_thread")]
async fn clock_ahead_starts_nothing_early() {
    let rig = StreamRig::start();
    let a = rig.consume_under_faketime("a", &args(&[]), &[("FAKETIME", "+20s")]);
    let expected = rig.queue(&jobs(4, 6_000)).await;
    rig.scanner.wait_for("end", 4, Duration::from_secs(20));
    rig.scanner.assert_once_on_time(&expected, false);
    let log = rig.scanner.errors_of("a");
    assert!(log.contains("clock is off"), "{log}");
    // The files are where they are looked for, and gone with the consumer.
    let shm = faketime_shm(a.0.id());
    assert!(shm.iter().all(|f| f.exists()), "no {shm:?}");
    drop(a);
    assert!(!shm.iter().any(|f| f.exists()), "left {shm:?}");
}

/// The spool with `--journal`: a consumer SIGKILLed while it holds deferred
/// jobs, restarted on the same journal, runs every job it had read once.
#[tokio::test(flavor = "multi_thread")]
async fn spool_journal_survives_a_killed_consumer() {
    let scanner = Scanner::new();
    let journal = scanner.dir.path().join("journal");
    let journal_arg = journal.to_string_lossy().into_owned();
    let jobs: Vec<_> = (0..8).map(|i| job(now_ms() + 3_000 + i * 100)).collect();
    let expected = not_befores(&jobs);
    let mut a = scanner.consume(
        "a",
        &["--from", "-", "--journal", &journal_arg],
        &[],
        Stdio::piped(),
    );
    {
        use std::io::Write;
        let stdin = a.stdin.as_mut().unwrap();
        for j in &jobs {
            writeln!(stdin, "{j}").unwrap();
        }
        stdin.flush().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&journal)
        .unwrap_or_default()
        .lines()
        .count()
        < jobs.len()
    {
        assert!(Instant::now() < deadline, "{}", scanner.errors_of("a"));
        std::thread::sleep(Duration::from_millis(50));
    }
    a.kill_now();
    assert!(scanner.lines().is_empty(), "ran before its notBefore");
    let mut b = scanner.consume(
        "b",
        &["--from", "-", "--journal", &journal_arg],
        &[],
        Stdio::null(),
    );
    let finished = b.wait().unwrap();
    assert!(finished.success(), "{}", scanner.errors_of("b"));
    scanner.assert_once_on_time(&expected, false);
    // Restarted again: nothing left to run.
    let mut c = scanner.consume(
        "c",
        &["--from", "-", "--journal", &journal_arg],
        &[],
        Stdio::null(),
    );
    assert!(c.wait().unwrap().success());
    assert_eq!(scanner.ends().len(), jobs.len());
}

/// The spool with `--journal`: a consumer SIGKILLed while its scan runs,
/// restarted on the same journal, runs the scan again as attempt 2 (the
/// journal recorded that attempt 1 started), and it ends once.
#[tokio::test(flavor = "multi_thread")]
async fn spool_journal_replay_is_a_new_attempt() {
    let scanner = Scanner::new();
    let journal = scanner.dir.path().join("journal");
    let journal_arg = journal.to_string_lossy().into_owned();
    let spool = ["--from", "-", "--journal", journal_arg.as_str()];
    let jobs = [job(now_ms())];
    let expected = not_befores(&jobs);
    let mut a = scanner.consume("a", &spool, &[("SLEEP", "30")], Stdio::piped());
    {
        use std::io::Write;
        let stdin = a.stdin.as_mut().unwrap();
        writeln!(stdin, "{}", jobs[0]).unwrap();
        stdin.flush().unwrap();
    }
    scanner.wait_for("start", 1, Duration::from_secs(10));
    a.kill_now();
    // Its scanner dies with it (the guard); give the kernel a moment.
    std::thread::sleep(Duration::from_millis(500));
    let mut b = scanner.consume("b", &spool, &[], Stdio::null());
    assert!(b.wait().unwrap().success(), "{}", scanner.errors_of("b"));
    scanner.assert_once_on_time(&expected, false);
    let starts: Vec<(String, u64)> = scanner
        .of("start")
        .into_iter()
        .map(|l| (l.tag, l.attempt))
        .collect();
    assert_eq!(
        starts,
        [("a".into(), 1), ("b".into(), 2)],
        "{}",
        scanner.all_errors()
    );
}
