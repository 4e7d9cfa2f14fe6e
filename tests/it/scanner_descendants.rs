//! No descendant of a scanner outlives its hand-off: a scanner that starts
//! a daemon in a new session (`setsid -f`, out of every process group the
//! consumer knows) and ignores `SIGTERM` leaves nothing alive after each of
//! the four ways a scan ends: the scanner exits by itself, `--scan-timeout`,
//! `SIGTERM` past `--grace`, and the consumer `SIGKILL`ed. The guard the
//! consumer runs each scanner under is the daemon's subreaper, and kills and
//! reaps it (src/consume/guard.rs).
//!
//! A spool consumer (`--from -`, one job on its stdin) is enough: what is
//! tested is the process tree, not the queue. Each end runs twice.
//!
//! Nor does a scanner, or its guard, get the consumer's secrets: their
//! environments hold the allowed variables, `--scanner-env`'s and the job's.

use quota_gate_testkit as common;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::consumer::*;

/// How a scan ends.
#[derive(Debug, Clone, Copy)]
enum End {
    /// The scanner exits 0, its daemon still running.
    Exits,
    /// The scanner runs past `--scan-timeout`.
    TimedOut,
    /// The consumer gets `SIGTERM` and the scan outlasts `--grace`.
    TermPastGrace,
    /// The consumer is `SIGKILL`ed mid-scan.
    ConsumerKilled,
}

/// The scanner: starts a daemon in a new session that writes its pid to
/// `$RUNS/daemon` and sleeps 30 s; ignores `SIGTERM`; then exits at once
/// (`exits`) or sleeps 30 s itself.
fn scanner_command(exits: bool) -> String {
    let rest = if exits { "exit 0" } else { "sleep 30" };
    format!(
        r#"setsid -f sh -c 'echo $$ > "$RUNS/daemon.tmp"; mv "$RUNS/daemon.tmp" "$RUNS/daemon"; exec sleep 30'
trap '' TERM
while [ ! -s "$RUNS/daemon" ]; do sleep 0.05; done
{rest}"#
    )
}

/// A live process: one with a `/proc` entry that is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        state != Some("Z")
    })
}

/// Waits for the daemon's pid file and reads it.
fn daemon_pid(runs: &Path, consumer_log: impl Fn() -> String) -> u32 {
    let file = runs.join("daemon");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "the scanner's daemon never started:\n{}",
            consumer_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs one scan to `end` and asserts that its daemon is gone soon after.
fn run(end: End) {
    let scanner = Scanner::new();
    let command = scanner_command(matches!(end, End::Exits));
    let args: Vec<&str> = match end {
        End::TimedOut => vec!["--scan-timeout", "1s", "--max-attempts", "1"],
        End::TermPastGrace => vec!["--grace", "1s"],
        End::Exits | End::ConsumerKilled => vec![],
    };
    let mut all = vec!["--from", "-", "--exec", command.as_str()];
    all.extend(args);
    let mut consumer = scanner.consume("a", &all, &[], Stdio::piped());
    {
        let stdin = consumer.stdin.as_mut().unwrap();
        writeln!(stdin, "{}", job(now_ms())).unwrap();
        stdin.flush().unwrap();
    }
    let daemon = daemon_pid(&scanner.dir.path().join("runs"), || scanner.errors_of("a"));
    // A scanner that exits at once may have its daemon reaped before this
    // look: its pid file is the proof it ran. Every other end keeps it
    // alive until the consumer ends the scan.
    assert!(
        matches!(end, End::Exits) || alive(daemon),
        "{end:?}: the daemon is not running"
    );
    match end {
        End::Exits | End::TimedOut => {}
        End::TermPastGrace => {
            signal(consumer.id(), "TERM");
            let exited = consumer.wait().unwrap();
            assert!(exited.success(), "{end:?}: {}", scanner.errors_of("a"));
        }
        End::ConsumerKilled => consumer.kill_now(),
    }
    // The timeout's second, the grace's, and room for a slow machine.
    let deadline = Instant::now() + Duration::from_secs(8);
    while alive(daemon) {
        assert!(
            Instant::now() < deadline,
            "{end:?}: the scanner's daemon (pid {daemon}) outlived its scan:\n{}",
            scanner.errors_of("a")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    if let End::TimedOut = end {
        // It was the timeout that ended it (logged once the guard is gone).
        let left = deadline.saturating_duration_since(Instant::now());
        scanner.wait_for_log("a", "scan timeout", left);
    }
}

/// Each end, twice.
#[test]
fn no_end_leaves_a_daemon() {
    for end in [
        End::Exits,
        End::TimedOut,
        End::TermPastGrace,
        End::ConsumerKilled,
    ] {
        for _ in 0..2 {
            run(end);
        }
    }
}

/// The secrets a consumer may hold, by name and value: none of either may
/// reach a scanner.
const SECRETS: [(&str, &str); 6] = [
    ("VALKEY_URL", "redis://:hunter2@127.0.0.1:1/"),
    ("QUOTA_HASH_SECRET", "s3cr3t-hash-key-0123456789abcdef"),
    (
        "AWS_SECRET_ACCESS_KEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    ("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE"),
    (
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "http://169.254.170.23/v1/credentials-token",
    ),
    ("SCAN_QUEUE_URL", "valkey-stream:secret-jobs"),
];

/// The beginnings of names the consumer has that its scanners must not get
/// (`NOT_SET` is named with `--scanner-env` but unset).
const KEPT_BACK: [&str; 6] = [
    "VALKEY_",
    "QUOTA_",
    "AWS_",
    "SCAN_QUEUE_URL",
    "RUST_LOG",
    "NOT_SET",
];

/// Waits for `file` (written by the scanner) and reads its
/// `NAME=value` entries, NUL-separated as in `/proc/<pid>/environ`.
fn environ(file: &Path, consumer_log: impl Fn() -> String) -> Vec<(String, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "no scanner ran:\n{}",
            consumer_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(file).unwrap();
    for (name, value) in SECRETS {
        assert!(!text.contains(value), "{name}'s value in {text:?}");
    }
    text.split('\0')
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.split_once('=')
                .map(|(k, v)| (k.into(), v.into()))
                .unwrap()
        })
        .collect()
}

/// The scanner and its guard hold no secret of their consumer: only PATH,
/// what `--scanner-env` names (and the consumer has) and the job's own
/// variables, which win over the consumer's.
#[test]
fn scanners_get_no_secrets() {
    let scanner = Scanner::new();
    let runs = scanner.dir.path().join("runs");
    // Its own environment and its parent's (the guard's), as the kernel holds them.
    let command = r#"cat /proc/$PPID/environ > "$RUNS/guard.tmp"
cat /proc/$$/environ > "$RUNS/scanner.tmp"
mv "$RUNS/guard.tmp" "$RUNS/guard"; mv "$RUNS/scanner.tmp" "$RUNS/scanner""#;
    let args = [
        "--from",
        "-",
        "--exec",
        command,
        "--scanner-env",
        "KEEP_ME,NOT_SET",
        "--scanner-env",
        "SCAN_ID",
    ];
    let mut vars = SECRETS.to_vec();
    vars.extend([("KEEP_ME", "1"), ("SCAN_ID", "the-consumer's")]);
    let mut consumer = scanner.consume("a", &args, &vars, Stdio::piped());
    let job = job(now_ms());
    writeln!(consumer.stdin.take().unwrap(), "{job}").unwrap();
    let log = || scanner.errors_of("a");
    for who in ["scanner", "guard"] {
        let env = environ(&runs.join(who), log);
        let value = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let path = std::env::var("PATH").unwrap_or_default();
        assert_eq!(value("PATH"), Some(path.as_str()), "{who}: {env:?}");
        assert_eq!(value("KEEP_ME"), Some("1"), "{who}: {env:?}");
        assert_eq!(value("SCAN_ID"), job["scanId"].as_str(), "{who}: {env:?}");
        assert_eq!(value("SCAN_ATTEMPT"), Some("1"), "{who}: {env:?}");
        assert_eq!(value("IMAGE"), Some("alpine:3.20"), "{who}: {env:?}");
        for (name, _) in &env {
            let kept_back = KEPT_BACK.iter().any(|p| name.starts_with(p));
            assert!(!kept_back, "{who} got {name}: {env:?}");
        }
    }
    assert!(consumer.wait().unwrap().success(), "{}", log());
}

/// Nor can a scanner of the same user read the consumer's own environment:
/// the consumer is not dumpable, so its `/proc/<pid>/environ` is root's.
/// Run as an unprivileged user (`setpriv`), the scanner finds its
/// grandparent's environ refused, and the consumer's secret nowhere.
#[test]
fn the_consumers_environ_is_out_of_the_scanners_reach() {
    let root = rustix::process::getuid().is_root();
    assert!(root, "run as root: the test drops to an unprivileged user");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // The scanner's parent is its guard; the guard's is the consumer.
    let command = format!(
        r#"consumer=$(cut -d' ' -f4 /proc/$PPID/stat)
cat /proc/$consumer/environ > {out} 2>&1 || echo refused >> {out}"#,
        out = out.display()
    );
    let mut consumer = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(common::bin("quota-gate"))
        .args(["consume", "--from", "-", "--exec", &command])
        .env("QUOTA_HASH_SECRET", "the-consumers-secret-0123456789")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let job = job(now_ms());
    writeln!(consumer.stdin.take().unwrap(), "{job}").unwrap();
    let status = consumer.wait().unwrap();
    assert!(status.success(), "{status}");
    let read = std::fs::read_to_string(&out).expect("the scanner ran");
    assert!(read.contains("refused"), "{read}");
    assert!(!read.contains("the-consumers-secret"), "{read}");
}
