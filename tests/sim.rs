//! The request path explored, not sampled: thousands of seeded schedules of
//! the real gate over a simulated store and queue (testkit's `sim`), each
//! checked against the guarantees; and each past bug, switched back on,
//! found within the same budget.
//!
//! `SIM_SEEDS=N` runs N schedules (default 10,000); `SIM_SEED=S` replays
//! one (`SIM_BUG=<name>` with a bug switched on). A failure prints the
//! command that replays it and the schedule's events.

use quota_gate_testkit as common;

use std::time::Instant;

use common::sim;
use quota_gate::bugs::Bug;

const DEFAULT_SEEDS: u64 = 10_000;

/// The first seed of a run: fixed, so CI explores the same schedules each
/// time (`SIM_FIRST` moves the window).
fn first_seed() -> u64 {
    std::env::var("SIM_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

fn seeds() -> u64 {
    std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SEEDS)
}

fn bug_named(name: &str) -> Option<Bug> {
    Bug::ALL.into_iter().find(|b| format!("{b:?}") == name)
}

/// Runs `seeds` schedules from `first` on `threads` threads; the failing
/// seeds, sorted (on one thread, the first is the first of the run).
fn explore(first: u64, seeds: u64, bug: Option<Bug>, threads: u64) -> Vec<(u64, String)> {
    let stop_at_first = true;
    let found = std::sync::Mutex::new(Vec::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (found, stop) = (&found, &stop);
            s.spawn(move || {
                let mut seed = first + t;
                while seed < first + seeds {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    if let Err(e) = sim::run(seed, bug) {
                        found.lock().unwrap().push((seed, e));
                        if stop_at_first {
                            stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                    seed += threads;
                }
            });
        }
    });
    let mut found = found.into_inner().unwrap();
    found.sort_by_key(|(seed, _)| *seed);
    found
}

fn replay_command(seed: u64, bug: Option<Bug>) -> String {
    match bug {
        Some(b) => format!("SIM_SEED={seed} SIM_BUG={b:?} cargo test --test sim replay"),
        None => format!("SIM_SEED={seed} cargo test --test sim replay"),
    }
}

/// Every schedule of the run keeps every guarantee (10,000 unless `SIM_SEEDS`).
#[test]
fn schedules_keep_the_guarantees() {
    if std::env::var("SIM_SEED").is_ok() {
        return; // `replay` runs that one.
    }
    let started = Instant::now();
    let n = seeds();
    let failed = explore(first_seed(), n, None, 2);
    if let Some((seed, report)) = failed.first() {
        panic!(
            "seed {seed} broke a guarantee; replay: {}\n{report}",
            replay_command(*seed, None)
        );
    }
    eprintln!("{n} schedules in {:.1} s", started.elapsed().as_secs_f64());
}

/// `SIM_SEED=S` replays one schedule (with `SIM_BUG`'s bug, if set) and shows what it checked.
#[test]
fn replay() {
    let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|v| v.parse().ok()) else {
        return;
    };
    let bug = std::env::var("SIM_BUG").ok().and_then(|b| bug_named(&b));
    eprintln!("{:#?}", sim::Plan::draw(seed));
    match sim::run(seed, bug) {
        Ok(stats) => eprintln!("seed {seed}: every guarantee held ({stats:?})"),
        Err(report) => panic!("seed {seed}: {report}"),
    }
}

/// Each past bug, switched back on, breaks a guarantee within the run's budget.
#[test]
fn each_past_bug_is_found() {
    if std::env::var("SIM_SEED").is_ok() {
        return;
    }
    let n = seeds();
    for bug in Bug::ALL {
        let failed = explore(first_seed(), n, Some(bug), 1);
        let Some((seed, report)) = failed.first() else {
            panic!("{bug:?}: no schedule of {n} found it");
        };
        let first_line = report.lines().next().unwrap_or("");
        eprintln!(
            "{bug:?}: found at seed {seed} ({} schedules): {first_line}",
            seed - first_seed() + 1
        );
    }
}
