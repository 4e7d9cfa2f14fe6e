//! `cargo bench --bench gate`: quota-gate against Valkey and HTTP alone, in one run.
//!
//! Starts its own pinned `valkey-server` on a free port and prints one table:
//!
//! - 1: the ceiling: `INCR` round trips/s from the gate's own redis-rs client
//!   (a `ConnectionManager`, i.e. one multiplexed connection), N tasks each
//!   awaiting one command at a time, no explicit pipelining;
//! - 1r: `redis-benchmark -c N -t incr` against the same server;
//! - 2: the count alone (`ValkeyStore::count`: INCR, EXPIREAT NX, SET NX
//!   EXAT, EXPIRETIME in one pipeline);
//! - 0: the gate with no I/O (in-memory store, a queue that only serializes);
//! - 3: full gate decisions in process (`Gate::handle`: validate, identify,
//!   hash, count, decide, XADD to a Valkey stream, build the 202, write the
//!   EMF line to `io::sink()`), delays zero, for an IP and for JWT callers;
//! - 4f / 5f: the HTTP floor, a minimal hyper server on `serve`'s runtime
//!   settings answering a fixed 202, under the built-in generator and `wrk`;
//! - 4 / 5: `quota-gate serve` (the release binary cargo built for this
//!   bench) with a Valkey stream queue, under the same two generators;
//! - 5h: the same `serve` process's `GET /healthz` under `wrk`: its HTTP
//!   alone, the denominator of the CPU target;
//!
//! then Valkey's command time per decision (`INFO commandstats`), each
//! target as a ratio next to its figure, time to first request, peak RSS,
//! binary and zip sizes, and the in-memory store's bound with 1,000,000
//! subjects.
//!
//! Modes: `cargo bench --bench gate` runs the full bench. Under `cargo test
//! --all-targets` (no `--bench` argument), with `--quick` or with
//! `QUOTA_BENCH_QUICK=1` it runs a small smoke version in a few seconds and
//! fails only if something did not work, never on a figure.
//! `QUOTA_BENCH_CONCURRENCY` (64) and `QUOTA_BENCH_SECS` (4) tune a full run.

mod external;
mod floor;
mod load;
mod paths;
mod process;

use external::WrkPath;

/// The allocator of the shipped binaries, so the in-process lines measure
/// what `serve` and Lambda run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::Algorithm;
use quota_gate::config::ResetPolicy;
use quota_gate::gate::{Gate, GateRequest};
use quota_gate::io::connection::Valkey;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::queue::{ScanJob, ScanQueue, SendError};
use quota_gate::io::store::memory::MemoryStore;
use quota_gate::io::store::valkey::ValkeyStore;
use quota_gate::io::store::{CountArgs, QuotaKey, QuotaStore, period_end};
use quota_gate::rules::digest::Hasher;
use quota_gate::rules::scope::Scope;
use quota_gate_testkit::{self as common, client};
use serde_json::json;

use load::{Plan, Stats, closed_loop, with_cpu};

/// Set in the child process that measures the in-memory store.
pub const CHILD_ENV: &str = "QUOTA_BENCH_CHILD";

const MIB: f64 = 1024.0 * 1024.0;

type ValkeyGate = Gate<ValkeyStore, StreamQueue>;

/// Which kind of line, for the ratio and target columns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// 1: INCR through redis-rs.
    Ceiling,
    /// 1r: INCR from redis-benchmark.
    RedisBenchmark,
    /// 2: the counting pipeline alone.
    Count,
    /// 0: the gate without I/O.
    NoIo,
    /// 3: the gate in process.
    InProcess,
    /// 4f: the HTTP floor, built-in generator.
    Floor,
    /// 4: serve, built-in generator.
    Http,
    /// 5f: the HTTP floor under wrk.
    WrkFloor,
    /// 5: serve under wrk.
    WrkHttp,
    /// 5h: serve's `GET /healthz` under wrk, the same process's HTTP alone.
    WrkHealthz,
}

impl Kind {
    /// The line this one's ratio and added latency are taken against.
    fn reference(self) -> Option<Kind> {
        match self {
            Kind::Ceiling | Kind::Floor => None,
            Kind::RedisBenchmark | Kind::Count | Kind::NoIo | Kind::InProcess => {
                Some(Kind::Ceiling)
            }
            Kind::Http => Some(Kind::Floor),
            Kind::WrkFloor | Kind::WrkHttp | Kind::WrkHealthz => Some(Kind::RedisBenchmark),
        }
    }

    fn id(self) -> &'static str {
        match self {
            Kind::Ceiling => "1",
            Kind::RedisBenchmark => "1r",
            Kind::Count => "2",
            Kind::NoIo => "0",
            Kind::InProcess => "3",
            Kind::Floor => "4f",
            Kind::Http => "4",
            Kind::WrkFloor => "5f",
            Kind::WrkHttp => "5",
            Kind::WrkHealthz => "5h",
        }
    }
}

struct Row {
    name: String,
    kind: Kind,
    stats: Stats,
    /// CPU µs per op: valkey-server, the server process (the gate, the
    /// floor, or this process for in-process lines), the load generator.
    cpu: [f64; 3],
}

impl Row {
    fn new(name: &str, kind: Kind, (stats, cpu): (Stats, Vec<f64>)) -> Self {
        let at = |i: usize| cpu.get(i).copied().unwrap_or(f64::NAN);
        Self {
            name: format!("{} {name}", kind.id()),
            kind,
            stats,
            cpu: [at(0), at(1), at(2)],
        }
    }
}

/// Valkey's command time over line 1 and line 3 IP (`INFO commandstats`).
#[derive(Default)]
struct ValkeyTime {
    /// Line 1: one INCR's usec_per_call.
    incr_per_call: Option<f64>,
    /// Line 3 IP: per command, (calls, usec); and the decisions made.
    gate: external::CommandStats,
    decisions: u64,
}

struct Settings {
    quick: bool,
    plan: Plan,
    start_runs: usize,
    subjects: u64,
}

impl Settings {
    fn from_env() -> Self {
        let args: Vec<String> = std::env::args().collect();
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        // cargo passes `--bench` only under `cargo bench`; `cargo test` runs
        // this binary without it, and then it is a smoke test.
        let quick = args.iter().any(|a| a == "--quick")
            || var("QUOTA_BENCH_QUICK").is_some_and(|v| v != "0")
            || !args.iter().any(|a| a == "--bench");
        // A smoke run is a debug build, where one JWT check takes milliseconds:
        // 64 in flight would only time out against the 100 ms store timeout.
        let concurrency = var("QUOTA_BENCH_CONCURRENCY")
            .and_then(|v| v.parse().ok())
            .filter(|&c: &usize| (1..=1024).contains(&c))
            .unwrap_or(if quick { 4 } else { 64 });
        let secs = var("QUOTA_BENCH_SECS")
            .and_then(|v| v.parse().ok())
            .filter(|&s: &f64| s > 0.0 && s <= 600.0)
            .unwrap_or(4.0);
        let plan = if quick {
            Plan {
                concurrency,
                warmup: Duration::ZERO,
                measure: Duration::from_millis(250),
            }
        } else {
            Plan {
                concurrency,
                warmup: Duration::from_secs(1),
                measure: Duration::from_secs_f64(secs),
            }
        };
        Self {
            quick,
            plan,
            start_runs: if quick { 1 } else { 7 },
            subjects: if quick { 20_000 } else { 1_000_000 },
        }
    }
}

fn main() -> ExitCode {
    if let Ok(child) = std::env::var(CHILD_ENV) {
        if let Some(n) = child.strip_prefix("memory:").and_then(|n| n.parse().ok()) {
            process::memory_child(n);
            return ExitCode::SUCCESS;
        }
        if let Some(n) = child.strip_prefix("profile:").and_then(|n| n.parse().ok()) {
            return match profile_child(n) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("profile: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        if let Some(addr) = child.strip_prefix("floor:") {
            return match floor::child(addr) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("floor: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        eprintln!("unknown {CHILD_ENV}={child}");
        return ExitCode::FAILURE;
    }
    let settings = Settings::from_env();
    match run(&settings) {
        Ok(failures) if failures.is_empty() => {
            if settings.quick {
                println!("bench: 1 passed, 0 failed");
            }
            ExitCode::SUCCESS
        }
        Ok(failures) => {
            for f in &failures {
                eprintln!("bench: {f}");
            }
            if settings.quick {
                println!("bench: 0 passed, 1 failed");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs everything; returns what did not work (never a missed figure).
fn run(settings: &Settings) -> Result<Vec<String>, String> {
    let plan = settings.plan;
    let server = common::ValkeyServer::start();
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "quota-gate bench{}: {} in flight, {:.1} s per line after {:.1} s warm-up, \
         valkey-server on 127.0.0.1:{}, {cpus} CPUs",
        if settings.quick {
            " (quick smoke run: figures mean nothing)"
        } else {
            ""
        },
        plan.concurrency,
        plan.measure.as_secs_f64(),
        plan.warmup.as_secs_f64(),
        server.port,
    );

    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut valkey_time = ValkeyTime::default();
    let valkey_pid = server.pid().to_string();
    let scratch = std::env::temp_dir().join(format!("quota-gate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    // wrk and redis-benchmark: required for a full run, skipped in a smoke
    // run on a machine without them.
    let external = match external::available() {
        Ok(()) => true,
        Err(e) if settings.quick => {
            println!("external generators skipped: {e}");
            false
        }
        Err(e) => return Err(e),
    };
    runtime.block_on(in_process(
        &url,
        &valkey_pid,
        plan,
        &mut rows,
        &mut failures,
        &mut valkey_time,
    ))?;
    if external {
        // 1r: redis-benchmark's INCR, about as many as line 1's duration allows.
        let n = if settings.quick {
            2_000
        } else {
            (150_000.0 * plan.measure.as_secs_f64()) as u64
        };
        let (stats, cpu) = external::redis_benchmark(
            server.port,
            plan.concurrency,
            n,
            std::slice::from_ref(&valkey_pid),
        )?;
        // No server process of its own: valkey-server, -, redis-benchmark.
        let measured = (stats, vec![cpu[0], f64::NAN, cpu[1]]);
        rows.insert(
            1,
            Row::new("redis-benchmark -t incr", Kind::RedisBenchmark, measured),
        );
    }
    // wrk: whole seconds, at least one, no warm-up run in a smoke run.
    let wrk_secs = if settings.quick {
        1.0
    } else {
        plan.measure.as_secs_f64()
    };
    let wrk_warmup = !settings.quick;
    let wrk = |addr, path, pids: &[String]| {
        external::wrk(
            addr,
            path,
            plan.concurrency,
            wrk_secs,
            wrk_warmup,
            &scratch,
            pids,
        )
    };
    let ip_request = client::scan_request(None).into_bytes();

    // 4f, 5f: the HTTP floor under both generators.
    let mut http_rows = Vec::new();
    let floor = floor::Floor::spawn()?;
    let floor_pid = floor.pid().to_string();
    let pids = [valkey_pid.clone(), floor_pid.clone(), "self".into()];
    let measured = http_line(floor.addr, ip_request.clone(), plan, pids)?;
    http_rows.push(Row::new(
        "HTTP floor (hyper, fixed 202)",
        Kind::Floor,
        measured,
    ));
    let mut wrk_rows = Vec::new();
    if external {
        let pids = [valkey_pid.clone(), floor_pid];
        let measured = wrk(floor.addr, WrkPath::Scan, &pids)?;
        wrk_rows.push(Row::new(
            "HTTP floor, wrk (fixed 202)",
            Kind::WrkFloor,
            measured,
        ));
    }
    drop(floor);

    // 4, 5: the release `quota-gate serve` under both generators.
    let serve = process::Serve::spawn(&url).map_err(|e| format!("spawn serve: {e}"))?;
    serve.first_request(Instant::now())?;
    let pid = serve.pid().to_string();
    let idle_rss = process::proc_status_kib(&pid, "VmRSS:").unwrap_or(0);
    let ed = token(Algorithm::EdDSA, "http-0");
    for (name, request) in [
        ("HTTP serve, IP", ip_request.clone()),
        (
            "HTTP serve, JWT EdDSA",
            client::scan_request(Some(&ed)).into_bytes(),
        ),
    ] {
        runtime.block_on(clear_stream(&url));
        let pids = [valkey_pid.clone(), pid.clone(), "self".into()];
        let measured = http_line(serve.addr, request, plan, pids)?;
        http_rows.push(Row::new(name, Kind::Http, measured));
    }
    if external {
        runtime.block_on(clear_stream(&url));
        let pids = [valkey_pid.clone(), pid.clone()];
        let measured = wrk(serve.addr, WrkPath::Scan, &pids)?;
        wrk_rows.push(Row::new("HTTP serve, IP, wrk", Kind::WrkHttp, measured));
        let measured = wrk(serve.addr, WrkPath::Healthz, &pids)?;
        wrk_rows.push(Row::new(
            "HTTP serve, GET /healthz, wrk",
            Kind::WrkHealthz,
            measured,
        ));
    }
    let peak_rss = process::proc_status_kib(&pid, "VmHWM:").unwrap_or(0);
    drop(serve);
    rows.extend(http_rows);
    rows.extend(wrk_rows);

    for r in &rows {
        if r.stats.errors > 0 || r.stats.ops == 0 {
            failures.push(format!(
                "{}: {} ops, {} errors (first: {})",
                r.name,
                r.stats.ops,
                r.stats.errors,
                r.stats.first_error.as_deref().unwrap_or("-")
            ));
        }
    }
    print_table(&rows);
    print_valkey_time(&valkey_time);
    match runtime.block_on(paths::figures(&url, common::loopback(server.port))) {
        Ok(figures) => paths::print(&figures),
        Err(e) => failures.push(format!("per-path figures: {e}")),
    }

    // The targets, each a ratio of two figures of this run.
    let mut targets = Targets::default();
    println!();
    // The CPU and throughput ratios of the last rounds: figures now, not
    // targets (issue 32 withdrew them; redis-rs stays on the request path).
    let find = |k: Kind| rows.iter().find(|r| r.kind == k);
    println!("figures (no target):");
    for (scan_kind, base_kind, what) in [
        (
            Kind::Http,
            Kind::Floor,
            "serve CPU per decision through HTTP / the HTTP floor's",
        ),
        (
            Kind::WrkHttp,
            Kind::WrkHealthz,
            "serve CPU per POST /scan / per GET /healthz, wrk",
        ),
    ] {
        if let (Some(scan), Some(base)) = (find(scan_kind), find(base_kind)) {
            println!(
                "  {what}: {:.2} × (line {} {:.1} µs / line {} {:.1} µs)",
                scan.cpu[1] / base.cpu[1],
                scan_kind.id(),
                scan.cpu[1],
                base_kind.id(),
                base.cpu[1]
            );
        }
    }
    if let (Some(gate), Some(rb)) = (find(Kind::WrkHttp), find(Kind::RedisBenchmark)) {
        println!(
            "  serve, stream queue, wrk / redis-benchmark INCR: {:.2} (line 5 {:.0}/s over line 1r {:.0}/s)",
            gate.stats.per_sec / rb.stats.per_sec,
            gate.stats.per_sec,
            rb.stats.per_sec
        );
    }
    match runtime.block_on(interleaved_rounds(&url, plan)) {
        Ok(rounds) => {
            let (gate, low, high) = Rounds::ratio(&rounds.levels, &rounds.incr);
            println!(
                "gate in process, IP, default levels / redis-rs INCR ceiling: {gate:.2} \
                 (rounds {low:.2}–{high:.2}; gate {:.0}/s, INCR {:.0}/s, medians)",
                median(&rounds.levels),
                median(&rounds.incr)
            );
            let (ratio, low, high) = Rounds::ratio(&rounds.levels, &rounds.off);
            targets.check_min(
                "gate in process, IP: default QUOTA_NETWORKS / QUOTA_NETWORKS=off",
                ratio,
                0.85,
                &format!(
                    "≥ 0.85; median of 3 interleaved rounds ({low:.2}–{high:.2}), {:.0}/s with \
                     levels, {:.0}/s without",
                    median(&rounds.levels),
                    median(&rounds.off)
                ),
            );
            let (ratio, low, high) = Rounds::ratio(&rounds.tokens, &rounds.tokens_off);
            targets.check_min(
                "gate in process, token: default QUOTA_TOKEN_NETWORKS / QUOTA_TOKEN_NETWORKS=off",
                ratio,
                0.85,
                &format!(
                    "≥ 0.85; median of 3 interleaved rounds ({low:.2}–{high:.2}), {:.0}/s with \
                     token levels, {:.0}/s without",
                    median(&rounds.tokens),
                    median(&rounds.tokens_off)
                ),
            );
            println!(
                "valkey commands per decision (INFO commandstats, XADD included), medians of \
                 the rounds: IP with the default levels {:.2}, token with the default token \
                 levels {:.2}; each is one round trip for the count and one for the XADD \
                 (tests/it/costs.rs holds the round trips)",
                median(&rounds.commands_ip),
                median(&rounds.commands_token)
            );
            if !rounds.counting.is_empty() {
                let (off, ..) = Rounds::ratio(&rounds.counting_off, &rounds.incr_usec);
                let (level, ..) = Rounds::ratio(
                    &rounds
                        .counting
                        .iter()
                        .zip(&rounds.counting_off)
                        .map(|(on, off)| on - off)
                        .collect::<Vec<_>>(),
                    &rounds.incr_usec,
                );
                println!(
                    "valkey command time per decision / one INCR's, medians of the rounds: \
                     QUOTA_NETWORKS=off (the subject's count: INCR, EXPIREAT NX, SET NX, \
                     EXPIRETIME, GET of its grant) {off:.2} ×; what the default levels add \
                     (IPv4: its /24) {level:.2} ×"
                );
                let (ratio, low, high) = Rounds::ratio(&rounds.counting, &rounds.incr_usec);
                targets.check(
                    "valkey command time per decision, default levels (XADD left out) / one INCR's",
                    ratio,
                    6.0,
                    "×",
                    &format!(
                        "INFO commandstats, median of the interleaved rounds ({low:.2}–{high:.2}); \
                         {:.3} µs / {:.3} µs",
                        median(&rounds.counting),
                        median(&rounds.incr_usec)
                    ),
                );
            }
        }
        Err(e) => failures.push(format!("interleaved rounds: {e}")),
    }
    match process::start_times(&url, settings.start_runs) {
        Ok(mut times) => {
            times.sort_by_key(|t| t.1);
            let (healthy, first) = times[times.len() / 2];
            let (min, max) = (times[0].1, times[times.len() - 1].1);
            targets.check(
                "start: spawn to first 202 (serve, valkey connect included)",
                first.as_secs_f64() * 1e3,
                50.0,
                "ms",
                &format!(
                    "median of {}, {:.1}–{:.1} ms; /healthz at {:.1} ms",
                    times.len(),
                    min.as_secs_f64() * 1e3,
                    max.as_secs_f64() * 1e3,
                    healthy.as_secs_f64() * 1e3
                ),
            );
        }
        Err(e) => failures.push(format!("start-up: {e}")),
    }
    targets.check(
        "peak RSS of serve during lines 4 and 5 (VmHWM)",
        peak_rss as f64 / MIB,
        32.0,
        "MiB",
        &format!("idle after start {:.1} MiB", idle_rss as f64 / MIB),
    );
    // Zipping a 200 MiB debug binary would be the slowest part of a smoke run.
    let sizes = if settings.quick {
        Err("skipped in a quick run (debug build)".to_string())
    } else {
        process::sizes(&process::bootstrap_bin(), &scratch)
    };
    match sizes {
        Err(e) if settings.quick => println!("bootstrap size: {e}"),
        Ok((raw, zipped)) => targets.check(
            "bootstrap zip (x86_64)",
            zipped as f64 / MIB,
            5.0,
            "MiB",
            &format!(
                "bootstrap {:.2} MiB unzipped, release profile",
                raw as f64 / MIB
            ),
        ),
        Err(e) => failures.push(format!("sizes: {e}")),
    }
    match process::memory_figures(settings.subjects) {
        Ok(m) => {
            let grown = m.peak_day1.saturating_sub(m.baseline);
            let per = grown as f64 / m.subjects as f64;
            // Bounded: yesterday's subjects are swept (only today's are
            // held), and the day's growth is not a second day's on top.
            let day2 = m.peak_day2.saturating_sub(m.baseline);
            let bounded = m.len_day2 == m.subjects && day2 < 2 * grown.max(1);
            println!(
                "memory store: {} subjects -> peak RSS +{:.1} MiB ({per:.0} B/subject); \
                 next day {} new subjects -> {} entries after sweep, peak RSS +{:.1} MiB \
                 ({})",
                m.subjects,
                grown as f64 / MIB,
                m.subjects,
                m.len_day2,
                day2 as f64 / MIB,
                if bounded {
                    "bounded: yesterday's entries swept, their memory reused"
                } else {
                    "NOT bounded"
                }
            );
            if !bounded {
                failures.push("the memory store kept yesterday's subjects".to_owned());
            }
            if m.len_day1 != m.subjects {
                failures.push(format!(
                    "memory store held {} of {}",
                    m.len_day1, m.subjects
                ));
            }
        }
        Err(e) => failures.push(format!("memory store: {e}")),
    }

    println!(
        "\ntargets: {} met, {} missed{}",
        targets.met,
        targets.missed,
        if settings.quick {
            " (quick run: not meaningful)"
        } else {
            ""
        }
    );
    let _ = std::fs::remove_dir_all(&scratch);
    drop(server);
    Ok(failures)
}

/// Lines 1–3, on this process's runtime.
async fn in_process(
    url: &str,
    valkey_pid: &str,
    plan: Plan,
    rows: &mut Vec<Row>,
    failures: &mut Vec<String>,
    valkey_time: &mut ValkeyTime,
) -> Result<(), String> {
    let timeout = Duration::from_millis(100);
    let hasher = Hasher::new(common::SECRET);
    let pids = [valkey_pid.to_string(), "self".into()];

    // 1: the ceiling. A fresh handle, so nothing is shared with the gate.
    let valkey = Valkey::new(url, false, timeout).map_err(|e| e.to_string())?;
    let keys: Arc<Vec<String>> = Arc::new(
        (0..plan.concurrency)
            .map(|t| format!("bench:incr:{t}"))
            .collect(),
    );
    let run = closed_loop(plan, move |task, _| {
        let valkey = valkey.clone();
        let keys = keys.clone();
        async move {
            let mut conn = valkey.connection().await.map_err(|e| e.to_string())?;
            redis::cmd("INCR")
                .arg(&keys[task])
                .query_async::<i64>(&mut conn)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        }
    });
    reset_commandstats(url).await;
    let measured = with_cpu(&pids, run).await;
    valkey_time.incr_per_call = incr_time(&commandstats(url).await);
    rows.push(Row::new(
        "ceiling: INCR (redis-rs, one multiplexed connection)",
        Kind::Ceiling,
        measured,
    ));

    // 2: the count alone (the plain-command pipeline), one subject per task.
    let store = ValkeyStore::new(Valkey::new(url, false, timeout).map_err(|e| e.to_string())?);
    let keys: Arc<Vec<QuotaKey>> = Arc::new(
        (0..plan.concurrency)
            .map(|t| QuotaKey::new(Scope::Ip, &hasher.digest(Scope::Ip, &format!("10.9.0.{t}"))))
            .collect(),
    );
    let run = closed_loop(plan, move |task, _| {
        let store = store.clone();
        let keys = keys.clone();
        async move {
            let now =
                quota_gate::rules::unix::UnixSecs(time::OffsetDateTime::now_utc().unix_timestamp());
            let args = CountArgs {
                key: &keys[task],
                levels: &[],
                period_end: period_end(ResetPolicy::UtcDay, now),
                now,
                reset: ResetPolicy::UtcDay,
            };
            store
                .count(args)
                .await
                .map(drop)
                .map_err(|e| e.error.to_string())
        }
    });
    let measured = with_cpu(&pids, run).await;
    rows.push(Row::new(
        "count: INCR + EXPIREAT NX + SET NX EXAT + EXPIRETIME + GET grant, one pipeline",
        Kind::Count,
        measured,
    ));

    // 0: the gate's own CPU, no I/O: the in-memory store and a queue that
    // serializes the job as the stream queue does but sends nothing.
    let bare = Arc::new(bare_gate()?);
    let requests = Arc::new(ip_requests(plan.concurrency));
    let run = closed_loop(plan, move |task, _| {
        let gate = bare.clone();
        let request = requests[task].clone();
        async move { accepted(gate.handle(request).await) }
    });
    let measured = with_cpu(&pids, run).await;
    rows.push(Row::new(
        "gate, no I/O (memory store)",
        Kind::NoIo,
        measured,
    ));

    // 3: the whole gate, one subject per task.
    let one = Arc::new(valkey_gate(url)?);
    let cases: [(&str, Option<Algorithm>, &Arc<ValkeyGate>); 4] = [
        ("gate in process, IP", None, &one),
        ("gate in process, JWT EdDSA", Some(Algorithm::EdDSA), &one),
        ("gate in process, JWT ES256", Some(Algorithm::ES256), &one),
        ("gate in process, JWT RS256", Some(Algorithm::RS256), &one),
    ];
    let mut first = true;
    for (name, alg, gate) in cases {
        clear_stream(url).await;
        let requests: Arc<Vec<GateRequest>> = Arc::new(
            (0..plan.concurrency)
                .map(|t| {
                    let ip = task_ip(t);
                    match alg {
                        None => common::scan_from(&ip),
                        Some(a) => common::scan_with_token(&ip, &token(a, &format!("t{t}"))),
                    }
                })
                .collect(),
        );
        // Each case must really take its path before it is timed.
        let probe = gate.handle(requests[0].clone()).await;
        let body: serde_json::Value = serde_json::from_slice(probe.body()).unwrap_or_default();
        let expected_scope = if alg.is_some() { "tid" } else { "ip" };
        if probe.status() != 202 || body["quota"]["scope"] != expected_scope {
            failures.push(format!("{name}: probe answered {} {body}", probe.status()));
            continue;
        }
        let g = gate.clone();
        let run = closed_loop(plan, move |task, _| {
            let gate = g.clone();
            let request = requests[task].clone();
            async move { accepted(gate.handle(request).await) }
        });
        // Valkey's own time per decision, over the IP case.
        if first {
            reset_commandstats(url).await;
        }
        let measured = with_cpu(&pids, run).await;
        if first {
            valkey_time.gate = commandstats(url).await;
            valkey_time.decisions = measured.0.all_ops;
            first = false;
        }
        rows.push(Row::new(name, Kind::InProcess, measured));
    }
    Ok(())
}

/// The wall-clock ratios, from interleaved rounds: the redis-rs `INCR`
/// ceiling, the gate in process with the default levels, and with
/// `QUOTA_NETWORKS=off`, three times in turn, so a slow phase of the machine
/// weighs on all three alike. Each line's throughput, round by round.
struct Rounds {
    incr: Vec<f64>,
    levels: Vec<f64>,
    off: Vec<f64>,
    /// Valkey's time for one INCR of the round's ceiling, and for the
    /// counting commands per decision of its gate with levels (µs, `INFO
    /// commandstats`); a round without both is left out of both.
    incr_usec: Vec<f64>,
    counting: Vec<f64>,
    /// The same for the gate with `QUOTA_NETWORKS=off`: the subject's own.
    counting_off: Vec<f64>,
    /// Token holders (one token per task, from its own address): the gate
    /// with the default `QUOTA_TOKEN_NETWORKS`, and with it `off`.
    tokens: Vec<f64>,
    tokens_off: Vec<f64>,
    /// Valkey commands per decision (`INFO commandstats` calls, `XADD`
    /// included), round by round: anonymous with the default levels, and a
    /// token holder with the default token levels.
    commands_ip: Vec<f64>,
    commands_token: Vec<f64>,
}

impl Rounds {
    /// The median of each round's `num / den`, and the range.
    fn ratio(num: &[f64], den: &[f64]) -> (f64, f64, f64) {
        let mut r: Vec<f64> = num.iter().zip(den).map(|(n, d)| n / d).collect();
        r.sort_by(f64::total_cmp);
        (r[r.len() / 2], r[0], r[r.len() - 1])
    }
}

async fn interleaved_rounds(url: &str, plan: Plan) -> Result<Rounds, String> {
    let on = Arc::new(valkey_gate(url)?);
    let off = Arc::new(valkey_gate_with(url, &[("QUOTA_NETWORKS", "off")])?);
    let tokens_off = Arc::new(valkey_gate_with(url, &[("QUOTA_TOKEN_NETWORKS", "off")])?);
    let requests = Arc::new(ip_requests(plan.concurrency));
    let token_requests: Arc<Vec<GateRequest>> = Arc::new(
        (0..plan.concurrency)
            .map(|t| {
                common::scan_with_token(&task_ip(t), &token(Algorithm::EdDSA, &format!("r{t}")))
            })
            .collect(),
    );
    let valkey = Valkey::new(url, false, Duration::from_millis(100)).map_err(|e| e.to_string())?;
    let mut rounds = Rounds {
        incr: Vec::new(),
        levels: Vec::new(),
        off: Vec::new(),
        incr_usec: Vec::new(),
        counting: Vec::new(),
        counting_off: Vec::new(),
        tokens: Vec::new(),
        tokens_off: Vec::new(),
        commands_ip: Vec::new(),
        commands_token: Vec::new(),
    };
    for _ in 0..3 {
        reset_commandstats(url).await;
        let v = valkey.clone();
        let incr = closed_loop(plan, move |task, _| {
            let v = v.clone();
            async move {
                let mut conn = v.connection().await.map_err(|e| e.to_string())?;
                redis::cmd("INCR")
                    .arg(format!("bench:incr:{task}"))
                    .query_async::<i64>(&mut conn)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        })
        .await;
        rounds.incr.push(incr.per_sec);
        let incr_usec = incr_time(&commandstats(url).await);
        let lines = [
            (
                &on,
                &requests,
                &mut rounds.levels,
                Some(&mut rounds.counting),
                Some(&mut rounds.commands_ip),
            ),
            (
                &off,
                &requests,
                &mut rounds.off,
                Some(&mut rounds.counting_off),
                None,
            ),
            (
                &on,
                &token_requests,
                &mut rounds.tokens,
                None,
                Some(&mut rounds.commands_token),
            ),
            (
                &tokens_off,
                &token_requests,
                &mut rounds.tokens_off,
                None,
                None,
            ),
        ];
        for (gate, requests, into, counting_into, commands_into) in lines {
            clear_stream(url).await;
            reset_commandstats(url).await;
            let (gate, requests) = (gate.clone(), requests.clone());
            let stats = closed_loop(plan, move |task, _| {
                let (gate, request) = (gate.clone(), requests[task].clone());
                async move { accepted(gate.handle(request).await) }
            })
            .await;
            if stats.errors > 0 {
                return Err(stats.first_error.unwrap_or_default());
            }
            into.push(stats.per_sec);
            let command_stats = commandstats(url).await;
            if let Some(commands) = commands_into {
                commands.push(commands_per_decision(&command_stats, stats.all_ops));
            }
            if let (Some(counting_into), Some(_)) = (counting_into, incr_usec) {
                let (counting, ..) = counting_time(&command_stats, stats.all_ops);
                counting_into.push(counting);
            }
        }
        rounds.incr_usec.extend(incr_usec);
    }
    Ok(rounds)
}

/// The median of `v`.
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Ok for a 202, else the status and body.
fn accepted(response: ::http::Response<bytes::Bytes>) -> Result<(), String> {
    match response.status().as_u16() {
        202 => Ok(()),
        s => Err(format!(
            "status {s}: {}",
            String::from_utf8_lossy(response.body())
        )),
    }
}

/// The address of task `t`: each task is a subject of its own.
fn task_ip(t: usize) -> String {
    format!("10.{}.{}.{}", 1 + (t >> 16) % 200, (t >> 8) & 255, t & 255)
}

/// One anonymous `POST /scan` per task, each from its own address.
fn ip_requests(n: usize) -> Vec<GateRequest> {
    (0..n).map(|t| common::scan_from(&task_ip(t))).collect()
}

/// A queue that does the stream queue's CPU work (the job's JSON) and no I/O.
struct SerializeOnly;

impl ScanQueue for SerializeOnly {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), SendError> {
        let json = serde_json::to_string(job).map_err(|e| SendError::Refused(e.to_string()))?;
        std::hint::black_box((json, job.scan_id.to_string()));
        Ok(())
    }
}

/// The gate over the in-memory store and [`SerializeOnly`], delays zero.
fn bare_gate() -> Result<Gate<MemoryStore, SerializeOnly>, String> {
    let config = common::config(&[("QUOTA_SOFT_DELAY_MS", "0"), ("QUOTA_HARD_DELAY_MS", "0")]);
    sink_gate(config, MemoryStore::default(), SerializeOnly)
}

/// A gate writing its EMF lines to `io::sink()`, so stdout is not what is measured.
fn sink_gate<S: QuotaStore, Q: ScanQueue>(
    config: quota_gate::Config,
    store: S,
    queue: Q,
) -> Result<Gate<S, Q>, String> {
    let meter = Meter::new(
        config.metrics_namespace.clone(),
        Some(Box::new(std::io::sink())),
    );
    Gate::new(config, store, queue, meter).map_err(|e| e.to_string())
}

/// Child mode for callgrind: `n` decisions of the no-I/O gate on one thread.
fn profile_child(n: u64) -> Result<(), String> {
    let gate = bare_gate()?;
    let requests = ip_requests(64);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        for i in 0..n {
            accepted(gate.handle(requests[(i % 64) as usize].clone()).await)?;
        }
        Ok(())
    })
}

/// The gate as `quota-gate serve` builds it for this server: Valkey store,
/// Valkey stream queue, delays zero, the test JWKS, EMF lines to a sink.
fn valkey_gate(url: &str) -> Result<ValkeyGate, String> {
    valkey_gate_with(url, &[])
}

/// The same with `extra` settings (later entries win).
fn valkey_gate_with(url: &str, extra: &[(&str, &str)]) -> Result<ValkeyGate, String> {
    let jwks = common::fixture("jwks.json");
    let base = [
        ("VALKEY_URL", url),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("QUOTA_SOFT_DELAY_MS", "0"),
        ("QUOTA_HARD_DELAY_MS", "0"),
        ("QUOTA_JWT_JWKS", &jwks),
    ];
    let config = common::config(&common::with_vars(&base, extra));
    let valkey = Valkey::new(url, false, config.store.timeout).map_err(|e| e.to_string())?;
    sink_gate(
        config,
        ValkeyStore::new(valkey.clone()),
        StreamQueue::new(valkey, "jobs"),
    )
}

/// A valid token for `tid`, signed with the test key for `alg`.
fn token(alg: Algorithm, tid: &str) -> String {
    let now = common::now();
    common::mint(
        alg,
        json!({"iss": "stella-ops.org", "tid": tid, "iat": now - 60, "nbf": now - 60, "exp": now + 86_400}),
    )
}

/// A fresh connection for the bench's own bookkeeping commands.
async fn admin(url: &str) -> Option<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).ok()?;
    client.get_multiplexed_async_connection().await.ok()
}

/// Zeroes `INFO commandstats`.
async fn reset_commandstats(url: &str) {
    if let Some(mut c) = admin(url).await {
        let _: Result<(), _> = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut c)
            .await;
    }
}

/// Valkey's own time per command since the last reset (`INFO commandstats`):
/// the server side of a line, without the client or the network.
async fn commandstats(url: &str) -> external::CommandStats {
    let Some(mut c) = admin(url).await else {
        return Default::default();
    };
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap_or_default();
    external::parse_commandstats(&info)
}

/// Valkey's time per decision over `decisions` for the counting commands
/// (the bench's own bookkeeping and the XADD left out): the total, each
/// command's part, and the XADD's.
fn counting_time(
    stats: &external::CommandStats,
    decisions: u64,
) -> (f64, Vec<String>, Option<f64>) {
    let per = |usec: u64| usec as f64 / decisions as f64;
    let mut counting = 0.0;
    let mut parts = Vec::new();
    let mut xadd = None;
    for (name, &(calls, usec)) in stats {
        match name.as_str() {
            // The bench's own bookkeeping.
            n if n.starts_with("config") || n.starts_with("client") => {}
            "info" | "del" => {}
            "xadd" => xadd = Some(per(usec)),
            _ => {
                counting += per(usec);
                parts.push(format!(
                    "{} {:.3} ({:.2} calls)",
                    name.to_uppercase(),
                    per(usec),
                    calls as f64 / decisions as f64
                ));
            }
        }
    }
    (counting, parts, xadd)
}

/// Valkey commands per decision: every call but the bench's own
/// bookkeeping, `XADD` included.
fn commands_per_decision(stats: &external::CommandStats, decisions: u64) -> f64 {
    let calls: u64 = stats
        .iter()
        .filter(|(name, _)| {
            !(name.starts_with("config")
                || name.starts_with("client")
                || matches!(name.as_str(), "info" | "del"))
        })
        .map(|(_, &(calls, _))| calls)
        .sum();
    calls as f64 / decisions.max(1) as f64
}

/// One INCR's time in Valkey (`usec_per_call`).
fn incr_time(stats: &external::CommandStats) -> Option<f64> {
    stats
        .get("incr")
        .filter(|(calls, _)| *calls > 0)
        .map(|&(calls, usec)| usec as f64 / calls as f64)
}

/// Prints Valkey's command time per decision over line 3 IP, against one
/// INCR of line 1.
fn print_valkey_time(t: &ValkeyTime) {
    if t.decisions == 0 {
        return;
    }
    let (counting, parts, xadd) = counting_time(&t.gate, t.decisions);
    println!(
        "\nValkey command time per decision (line 3 IP, {} decisions, INFO commandstats): \
         {} = {counting:.3} µs; XADD {} µs, reported separately",
        t.decisions,
        parts.join(" + "),
        xadd.map_or("-".into(), |u| format!("{u:.3}")),
    );
    if let Some(incr) = t.incr_per_call {
        println!(
            "one INCR (line 1): {incr:.3} µs per call; counting / INCR = {:.2}",
            counting / incr
        );
    }
}

/// Empties the bench's Valkey (its loaded scripts stay).
async fn flush_all(url: &str) {
    if let Some(mut c) = admin(url).await {
        let _: Result<(), _> = redis::cmd("FLUSHALL").query_async(&mut c).await;
    }
}

/// Drops the job stream between lines so it never grows large.
async fn clear_stream(url: &str) {
    if let Ok(client) = redis::Client::open(url)
        && let Ok(mut c) = client.get_multiplexed_async_connection().await
    {
        let _: Result<i64, _> = redis::cmd("DEL").arg("jobs").query_async(&mut c).await;
    }
}

/// Line 4: the generator on a current-thread runtime of its own, one
/// keep-alive connection per in-flight request.
fn http_line(
    addr: std::net::SocketAddr,
    request: Vec<u8>,
    plan: Plan,
    pids: [String; 3],
) -> Result<(Stats, Vec<f64>), String> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async move {
            let mut conns = Vec::with_capacity(plan.concurrency);
            for _ in 0..plan.concurrency {
                let c = client::Connection::open(addr)
                    .await
                    .map_err(|e| e.to_string())?;
                conns.push(tokio::sync::Mutex::new(c));
            }
            let conns = Arc::new(conns);
            let request: Arc<[u8]> = request.into();
            let run = closed_loop(plan, move |task, _| {
                let conns = conns.clone();
                let request = request.clone();
                async move {
                    // Each task owns its connection: the lock is never contended.
                    let mut c = conns[task].lock().await;
                    match c.send(&request).await? {
                        202 => Ok(()),
                        s => Err(format!("status {s}")),
                    }
                }
            });
            Ok(with_cpu(&pids, run).await)
        })
    })
    .join()
    .map_err(|_| "load generator panicked".to_string())?
}

/// The table, as Markdown so it pastes into the docs as printed.
fn print_table(rows: &[Row]) {
    let num = |v: f64, digits: usize| {
        if v.is_finite() {
            format!("{v:.digits$}")
        } else {
            "-".into()
        }
    };
    println!();
    println!(
        "| line | ops/s | ratio | of | p50 µs | p99 µs | +p50 µs | +p99 µs \
         | valkey CPU µs/op | server CPU µs/op | generator CPU µs/op |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in rows {
        let s = &r.stats;
        let reference = r
            .kind
            .reference()
            .and_then(|k| rows.iter().find(|x| x.kind == k));
        let (ratio, of, a50, a99) = match reference {
            Some(c) => (
                num(s.per_sec / c.stats.per_sec, 2),
                c.kind.id(),
                s.p50_us - c.stats.p50_us,
                s.p99_us - c.stats.p99_us,
            ),
            None => ("-".into(), "-", f64::NAN, f64::NAN),
        };
        println!(
            "| {} | {} | {ratio} | {of} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            num(s.per_sec, 0),
            num(s.p50_us, 0),
            num(s.p99_us, 0),
            num(a50, 0),
            num(a99, 0),
            num(r.cpu[0], 1),
            num(r.cpu[1], 1),
            num(r.cpu[2], 1),
        );
    }
    println!(
        "\nratio: ops/s over line `of`'s; +pXX: percentile minus line `of`'s. Round trips \
         per op: INCR 1, count 1, gate 2 (count pipeline, then XADD). CPU µs/op: each \
         process's user+system time over the line per operation; server is this process \
         for lines 1-3 (the gate and the load loop share it), the floor's or serve's \
         process for 4f-5; generator is this process for 4f and 4 (the built-in client), \
         wrk or redis-benchmark for 5f, 5, 5h and 1r."
    );
}

/// Prints figures next to their targets and tallies them.
#[derive(Default)]
struct Targets {
    met: u32,
    missed: u32,
}

impl Targets {
    /// A figure that must stay at or below `max`.
    fn check(&mut self, what: &str, value: f64, max: f64, unit: &str, note: &str) {
        self.report(
            what,
            value <= max,
            &format!("{value:.2} {unit} (target ≤ {max} {unit}); {note}"),
        );
    }

    /// A figure that must reach `min`.
    fn check_min(&mut self, what: &str, value: f64, min: f64, label: &str) {
        self.report(what, value >= min, &format!("{value:.2} (target {label})"));
    }

    fn report(&mut self, what: &str, ok: bool, text: &str) {
        if ok {
            self.met += 1;
        } else {
            self.missed += 1;
        }
        println!("{} {what}: {text}", if ok { "met   " } else { "MISSED" });
    }
}
