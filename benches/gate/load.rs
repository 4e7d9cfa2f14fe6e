//! Closed-loop load: `concurrency` tasks, each awaiting one operation at a
//! time, for a warm-up and then a measured window. Throughput counts only
//! operations that finished inside the window; latency is each operation's
//! own wall time (at this concurrency it includes queueing behind the others,
//! which is what a caller sees).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long to run one line.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub concurrency: usize,
    pub warmup: Duration,
    pub measure: Duration,
}

/// What one line measured.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Successful operations inside the measured window.
    pub ops: u64,
    /// Successful operations in the whole run, warm-up included.
    pub all_ops: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub per_sec: f64,
    /// Latency percentiles, in microseconds.
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Runs `op(task, i)` from `plan.concurrency` tasks on the current runtime.
pub async fn closed_loop<F, Fut>(plan: Plan, op: F) -> Stats
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let op = Arc::new(op);
    let start = Instant::now() + Duration::from_millis(5);
    let from = start + plan.warmup;
    let until = from + plan.measure;
    let mut handles = Vec::with_capacity(plan.concurrency);
    for task in 0..plan.concurrency {
        let op = op.clone();
        handles.push(tokio::spawn(async move {
            let mut latencies: Vec<u32> = Vec::with_capacity(1 << 16);
            let mut all_ops = 0u64;
            let mut errors = 0u64;
            let mut first_error = None;
            // Bounded by the deadline and, as a backstop, by a hard op cap.
            for i in 0..50_000_000u64 {
                let t0 = Instant::now();
                if t0 >= until {
                    break;
                }
                let result = op(task, i).await;
                let t1 = Instant::now();
                all_ops += u64::from(result.is_ok());
                if t0 >= from && t1 <= until {
                    match result {
                        Ok(()) => latencies.push((t1 - t0).as_nanos().min(u32::MAX as u128) as u32),
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                } else if let Err(e) = result {
                    errors += 1;
                    first_error.get_or_insert(e);
                }
            }
            (latencies, all_ops, errors, first_error)
        }));
    }
    let mut all: Vec<u32> = Vec::new();
    let mut stats = Stats::default();
    for h in handles {
        match h.await {
            Ok((lat, all_ops, errors, first_error)) => {
                all.extend_from_slice(&lat);
                stats.all_ops += all_ops;
                stats.errors += errors;
                if stats.first_error.is_none() {
                    stats.first_error = first_error;
                }
            }
            Err(e) => {
                stats.errors += 1;
                stats
                    .first_error
                    .get_or_insert(format!("task panicked: {e}"));
            }
        }
    }
    all.sort_unstable();
    stats.ops = all.len() as u64;
    stats.per_sec = stats.ops as f64 / plan.measure.as_secs_f64();
    stats.p50_us = percentile(&all, 0.50);
    stats.p99_us = percentile(&all, 0.99);
    stats
}

/// Nearest-rank percentile of sorted nanosecond samples, in microseconds.
fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    f64::from(sorted[rank - 1]) / 1000.0
}

/// CPU time (user + system) a process has used so far, from /proc/<pid>/stat.
pub fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name, which may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux this runs on.
    Some(Duration::from_millis(ticks * 10))
}

/// Runs `run` and returns its stats with the CPU microseconds per operation
/// that each of `pids` spent meanwhile (warm-up included, like `all_ops`).
pub async fn with_cpu<Fut>(pids: &[String], run: Fut) -> (Stats, Vec<f64>)
where
    Fut: Future<Output = Stats>,
{
    let before: Vec<_> = pids.iter().map(|p| cpu_time(p)).collect();
    let stats = run.await;
    let per_op = pids
        .iter()
        .zip(before)
        .map(|(p, b)| match (b, cpu_time(p)) {
            (Some(b), Some(a)) if stats.all_ops > 0 => {
                a.saturating_sub(b).as_secs_f64() * 1e6 / stats.all_ops as f64
            }
            _ => f64::NAN,
        })
        .collect();
    (stats, per_op)
}
