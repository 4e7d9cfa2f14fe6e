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
        while !scanner.errors_of("a").contains("scan timeout") {
            assert!(Instant::now() < deadline, "{}", scanner.errors_of("a"));
            std::thread::sleep(Duration::from_millis(50));
        }
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
