//! External load generators (Debian's `wrk` and `redis-benchmark`, installed
//! by `scripts/test`) and Valkey's own accounting (`INFO commandstats`).
//!
//! Each generator runs under `bash -c '…; times'`, so its own CPU time
//! (user + system, from the shell's `times`) is exact even though the
//! process is gone when it is read.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::load::{Stats, cpu_time};

/// What one external run measured: its stats, and the CPU µs per op of
/// each of `pids` and of the generator itself (last).
pub type Measured = (Stats, Vec<f64>);

/// What a `wrk` line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrkPath {
    /// `POST /scan` with the bench's body.
    Scan,
    /// `GET /healthz`: the same server's HTTP alone.
    Healthz,
}

/// `wrk -t 1 -c <concurrency> --latency` asking `path` of `http://addr`
/// for `secs` seconds, after a 1 s warm-up run (unless `warmup` is false).
pub fn wrk(
    addr: SocketAddr,
    path: WrkPath,
    concurrency: usize,
    secs: f64,
    warmup: bool,
    scratch: &Path,
    pids: &[String],
) -> Result<Measured, String> {
    let script = scratch.join("post.lua");
    std::fs::write(
        &script,
        "wrk.method = \"POST\"\n\
         wrk.body = '{\"image\":\"registry.example.com/team/app:1.4.2\"}'\n\
         wrk.headers[\"Content-Type\"] = \"application/json\"\n",
    )
    .map_err(|e| e.to_string())?;
    let (url, script) = match path {
        WrkPath::Scan => (
            format!("http://{addr}/scan"),
            format!("-s '{}'", script.display()),
        ),
        WrkPath::Healthz => (format!("http://{addr}/healthz"), String::new()),
    };
    let run = |d: &str| format!("wrk -t 1 -c {concurrency} -d {d} --latency {script} {url}; times");
    if warmup {
        shell(&run("1s"))?;
    }
    let before = cpus(pids);
    // wrk takes whole seconds.
    let out = shell(&run(&format!("{}s", secs.ceil().max(1.0) as u64)))?;
    let after = cpus(pids);
    let requests = out
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse::<u64>().ok())
        .ok_or_else(|| format!("no request count in wrk's output:\n{out}"))?;
    let per_sec = field(&out, "Requests/sec:")
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or_else(|| format!("no Requests/sec in wrk's output:\n{out}"))?;
    let mut errors = 0;
    let mut first_error = None;
    for marker in ["Non-2xx or 3xx responses:", "Socket errors:"] {
        if let Some(l) = out.lines().find(|l| l.trim().starts_with(marker)) {
            errors += 1;
            first_error.get_or_insert(l.trim().to_string());
        }
    }
    let stats = Stats {
        ops: requests,
        all_ops: requests,
        errors,
        first_error,
        per_sec,
        p50_us: wrk_latency(&out, "50%").unwrap_or(f64::NAN),
        p99_us: wrk_latency(&out, "99%").unwrap_or(f64::NAN),
    };
    Ok((stats.clone(), per_op(&before, &after, &out, requests)))
}

/// `redis-benchmark -c <concurrency> -t incr -n <n>` against `port`.
pub fn redis_benchmark(
    port: u16,
    concurrency: usize,
    n: u64,
    pids: &[String],
) -> Result<Measured, String> {
    let before = cpus(pids);
    let out = shell(&format!(
        "redis-benchmark -h 127.0.0.1 -p {port} -c {concurrency} -t incr -n {n} --csv; times"
    ))?;
    let after = cpus(pids);
    // "INCR","rps","avg","min","p50","p95","p99","max" (latencies in ms).
    let row: Vec<f64> = out
        .lines()
        .find(|l| l.starts_with("\"INCR\""))
        .ok_or_else(|| format!("no INCR row in redis-benchmark's output:\n{out}"))?
        .split(',')
        .skip(1)
        .filter_map(|v| v.trim_matches('"').parse().ok())
        .collect();
    if row.len() < 6 {
        return Err(format!("unexpected redis-benchmark CSV:\n{out}"));
    }
    let stats = Stats {
        ops: n,
        all_ops: n,
        errors: 0,
        first_error: None,
        per_sec: row[0],
        p50_us: row[3] * 1e3,
        p99_us: row[5] * 1e3,
    };
    Ok((stats, per_op(&before, &after, &out, n)))
}

/// Whether both generators are on the PATH.
pub fn available() -> Result<(), String> {
    for tool in ["wrk", "redis-benchmark"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!(
                "{tool} not found (Debian's wrk and redis-tools; scripts/test installs them)"
            ));
        }
    }
    Ok(())
}

fn shell(script: &str) -> Result<String, String> {
    let out = Command::new("bash")
        .args(["-c", script])
        .output()
        .map_err(|e| format!("bash: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "`{script}` failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

fn cpus(pids: &[String]) -> Vec<Option<Duration>> {
    pids.iter().map(|p| cpu_time(p)).collect()
}

/// CPU µs per op of each pid, then of the generator (from `times`).
fn per_op(
    before: &[Option<Duration>],
    after: &[Option<Duration>],
    out: &str,
    ops: u64,
) -> Vec<f64> {
    let ops = ops.max(1) as f64;
    let mut v: Vec<f64> = before
        .iter()
        .zip(after)
        .map(|(b, a)| match (b, a) {
            (Some(b), Some(a)) => a.saturating_sub(*b).as_secs_f64() * 1e6 / ops,
            _ => f64::NAN,
        })
        .collect();
    v.push(children_cpu(out).map_or(f64::NAN, |d| d.as_secs_f64() * 1e6 / ops));
    v
}

/// The children's user + system time from bash's `times` (its last line).
fn children_cpu(out: &str) -> Option<Duration> {
    let line = out.lines().rev().find(|l| !l.trim().is_empty())?;
    let mut total = 0.0;
    for t in line.split_whitespace() {
        let (m, s) = t.strip_suffix('s')?.split_once('m')?;
        total += m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?;
    }
    Some(Duration::from_secs_f64(total))
}

fn field<'a>(out: &'a str, name: &str) -> Option<&'a str> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(name))
        .map(str::trim)
}

/// A percentile from wrk's "Latency Distribution", in µs.
fn wrk_latency(out: &str, pct: &str) -> Option<f64> {
    let v = field(out, pct)?;
    let split = v.find(|c: char| c.is_ascii_alphabetic())?;
    let (n, unit) = v.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "us" => n,
        "ms" => n * 1e3,
        "s" => n * 1e6,
        _ => return None,
    })
}

/// Per command: (calls, usec) from `INFO commandstats`.
pub type CommandStats = BTreeMap<String, (u64, u64)>;

pub fn parse_commandstats(info: &str) -> CommandStats {
    info.lines()
        .filter_map(|l| {
            let (name, fields) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let get = |k: &str| {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(k)?.strip_prefix('='))
                    .and_then(|v| v.parse::<u64>().ok())
            };
            Some((name.to_string(), (get("calls")?, get("usec")?)))
        })
        .collect()
}
