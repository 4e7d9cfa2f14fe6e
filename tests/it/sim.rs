//! The request path explored, not sampled: thousands of seeded schedules of
//! the real gate over a simulated store and queue (testkit's `sim`), each
//! checked against the guarantees; and each past bug, switched back on,
//! found within the same budget.
//!
//! `SIM_SEEDS=N` runs N schedules (default 10,000); `SIM_SEED=S` replays
//! one (`SIM_BUG=<name>` with a bug switched on). A failure prints the
//! command that replays it and the schedule's events. A variable that is
//! set but unreadable (a seed that is not a number, a bug that has no such
//! name) fails the run: it never falls back to a default.

use quota_gate_testkit as common;

use std::time::Instant;

use common::sim;
use quota_gate::bugs::Bug;

const DEFAULT_SEEDS: u64 = 10_000;

/// The first seed of a run: fixed, so CI explores the same schedules each
/// time (`SIM_FIRST` moves the window).
fn first_seed() -> u64 {
    env_number("SIM_FIRST").unwrap_or(1)
}

fn seeds() -> u64 {
    env_number("SIM_SEEDS").unwrap_or(DEFAULT_SEEDS)
}

/// The whole number in `var`, if it is set; a value that is not one panics.
fn env_number(var: &str) -> Option<u64> {
    let value = std::env::var(var).ok()?;
    match value.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{var}={value:?} is not a whole number"),
    }
}

/// `SIM_BUG`'s bug, if it is set; an unknown name panics with the known ones.
fn env_bug() -> Option<Bug> {
    let name = std::env::var("SIM_BUG").ok()?;
    Some(Bug::named(&name).unwrap_or_else(|e| panic!("SIM_BUG: {e}")))
}

/// The regression seeds: where each past bug was first found, replayed by
/// [`replay`] when no `SIM_SEED` is given. Each must keep every guarantee
/// with no bug on and break one with its bug on; a change to the simulator
/// that moves where a bug is found moves its seed here.
const REGRESSIONS: &[(u64, Bug)] = &[
    (42, Bug::RefundOfUnsentCount),
    (4, Bug::TakeOverUnderFreshId),
    (3, Bug::UnknownCountQueuedUnmetered),
    (255, Bug::ConnectErrorAsUnanswered),
    (145, Bug::DisconnectDropsScan),
    (1, Bug::LevelNotRefunded),
    (15, Bug::LevelRefundUnguarded),
];

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
        Some(b) => format!("SIM_SEED={seed} SIM_BUG={b:?} cargo test --test it sim::replay"),
        None => format!("SIM_SEED={seed} cargo test --test it sim::replay"),
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

/// `SIM_SEED=S` replays one schedule (with `SIM_BUG`'s bug, if set) and
/// shows what it checked. Without `SIM_SEED` it replays the
/// [`REGRESSIONS`]: each seed keeps every guarantee with no bug on, and
/// breaks one with its bug on (so a replay is never a test that cannot
/// fail). `SIM_BUG` without `SIM_SEED` is an error.
#[test]
fn replay() {
    let bug = env_bug();
    let Some(seed) = env_number("SIM_SEED") else {
        if let Some(bug) = bug {
            panic!("SIM_BUG={bug:?} needs SIM_SEED=<seed> to replay");
        }
        return replay_regressions();
    };
    eprintln!("{:#?}", sim::Plan::draw(seed));
    match sim::run(seed, bug) {
        Ok(stats) => eprintln!("seed {seed}: every guarantee held ({stats:?})"),
        Err(report) => panic!("seed {seed}: {report}"),
    }
}

/// Each of the [`REGRESSIONS`] holds with no bug on, and fails with its own.
fn replay_regressions() {
    for &(seed, bug) in REGRESSIONS {
        if let Err(report) = sim::run(seed, None) {
            panic!(
                "seed {seed}, where {bug:?} was found, broke a guarantee with no bug on; replay: {}\n{report}",
                replay_command(seed, None)
            );
        }
        assert!(
            sim::run(seed, Some(bug)).is_err(),
            "seed {seed} with {bug:?} on broke no guarantee: the replay no longer finds it \
             (move the seed in REGRESSIONS to where each_past_bug_is_found finds it)"
        );
    }
    eprintln!("{} regression seeds replayed", REGRESSIONS.len());
}

/// A bug is switched on by its variant's name only; any other name is
/// refused with the known names, so a misspelt `SIM_BUG` never runs clean.
#[test]
fn bugs_are_named_exactly() {
    for bug in Bug::ALL {
        assert_eq!(Bug::named(&format!("{bug:?}")), Ok(bug));
    }
    let refused = Bug::named("RefundOfUnsentCounts").unwrap_err();
    for bug in Bug::ALL {
        assert!(refused.contains(&format!("{bug:?}")), "{refused}");
    }
    assert!(Bug::named("").is_err());
}

/// Each past bug, switched back on, breaks a guarantee within the run's budget.
#[test]
fn each_past_bug_is_found() {
    if std::env::var("SIM_SEED").is_ok() {
        return;
    }
    let n = seeds();
    for bug in Bug::GATE {
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
