//! A consumer's wall clock stepped forward after start starts nothing
//! early: the consumer anchors Valkey's `TIME` to the monotonic clock
//! (src/consume/clock.rs), so only the server's clock and real elapsed time
//! decide when a job is due.
//!
//! The step is libfaketime's: its offset is read from a file that the test
//! rewrites from `+0` to `+20s` once the consumer runs, with the monotonic
//! clock left alone (`FAKETIME_DONT_FAKE_MONOTONIC`), as a real `date -s`
//! or a resumed VM leaves it. The scanner reads the real time (`date` with
//! `LD_PRELOAD` unset), so "early" is by the real clock.

use quota_gate_testkit as common;

use std::time::Duration;

use common::consumer::*;

#[tokio::test(flavor = "multi_thread")]
async fn wall_clock_stepped_forward_starts_nothing_early() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    let offset = scanner.dir.path().join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let offset_arg = offset.to_string_lossy();
    let stepped = [
        ("FAKETIME_TIMESTAMP_FILE", &*offset_arg),
        ("FAKETIME_NO_CACHE", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let _a = rig.consume_under_faketime("a", &["--lease", "2s"], &stepped);
    // Running and measured: the first job ran.
    let first = rig.queue(&[job(now_ms())]).await;
    scanner.wait_for("end", 1, Duration::from_secs(15));
    // The step, then jobs due over the next seconds (before the 30 s re-sync).
    std::fs::write(&offset, "+20s\n").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = now_ms();
    let jobs: Vec<_> = (0..8).map(|i| job(base + 1_000 + i * 700)).collect();
    let mut expected = rig.queue(&jobs).await;
    expected.extend(first);
    scanner.wait_for("end", 9, Duration::from_secs(25));
    scanner.assert_once_on_time(&expected, false);
}
