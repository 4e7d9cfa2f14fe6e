//! The `quota-gate serve` process as a user starts it: time to first
//! request, peak RSS, binary and zip sizes; and the in-memory store's bound,
//! measured in a child process of its own so its peak RSS is its alone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use quota_gate::config::ResetPolicy;
use quota_gate::io::store::memory::MemoryStore;
use quota_gate::io::store::{CountArgs, QuotaKey, QuotaStore, period_end};
use quota_gate::rules::digest::Hasher;
use quota_gate::rules::scope::Scope;

use quota_gate_testkit::{KillOnDrop, client, fixture, free_port, loopback};

/// The serve binary cargo built for this bench (release profile under `cargo bench`).
pub fn serve_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_quota-gate"))
}

/// The Lambda binary cargo built for this bench.
pub fn bootstrap_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_bootstrap"))
}

/// A running `quota-gate serve`, killed on drop.
pub struct Serve {
    pub addr: SocketAddr,
    child: KillOnDrop,
}

impl Serve {
    /// Spawns `quota-gate serve` on a free port against `valkey_url`, EMF
    /// lines going to /dev/null, delays zero.
    pub fn spawn(valkey_url: &str) -> std::io::Result<Self> {
        let addr = loopback(free_port());
        let child = Command::new(serve_bin())
            .arg("serve")
            .env("VALKEY_URL", valkey_url)
            .env("SCAN_QUEUE_URL", "valkey-stream:jobs")
            .env("QUOTA_LISTEN", addr.to_string())
            .env("QUOTA_HASH_SECRET", "bench-secret-0123456789abcdef0123")
            .env("QUOTA_SOFT_DELAY_MS", "0")
            .env("QUOTA_HARD_DELAY_MS", "0")
            .env("QUOTA_JWT_JWKS", fixture("jwks.json"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Self {
            addr,
            child: KillOnDrop::new(child),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls `/healthz` until it answers, then sends one `POST /scan`.
    /// Returns (time to healthy, time to the first 202) since `started`.
    pub fn first_request(&self, started: Instant) -> Result<(Duration, Duration), String> {
        let deadline = started + Duration::from_secs(10);
        let health = client::get_request("/healthz");
        let healthy = loop {
            if Instant::now() > deadline {
                return Err("serve did not answer /healthz within 10 s".into());
            }
            match client::once(self.addr, health.as_bytes(), Duration::from_secs(2)) {
                Ok(200) => break started.elapsed(),
                _ => std::thread::sleep(Duration::from_micros(500)),
            }
        };
        let scan = client::scan_request(None);
        match client::once(self.addr, scan.as_bytes(), Duration::from_secs(2))? {
            202 => Ok((healthy, started.elapsed())),
            s => Err(format!("first POST /scan answered {s}")),
        }
    }
}

/// A `VmXXX:` figure from /proc/<pid>/status, in bytes.
pub fn proc_status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Spawns and times `runs` cold starts; returns (healthy, first 202) per run.
pub fn start_times(valkey_url: &str, runs: usize) -> Result<Vec<(Duration, Duration)>, String> {
    let mut out = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let serve = Serve::spawn(valkey_url).map_err(|e| format!("spawn serve: {e}"))?;
        out.push(serve.first_request(started)?);
    }
    Ok(out)
}

/// The size of `binary` and of a zip holding it as `bootstrap` (deflate, as
/// the Lambda package is built), zipped with Python's zipfile.
pub fn sizes(binary: &Path, scratch: &Path) -> Result<(u64, u64), String> {
    let raw = std::fs::metadata(binary)
        .map_err(|e| format!("{}: {e}", binary.display()))?
        .len();
    let zip = scratch.join("bootstrap.zip");
    let status = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[2], 'w', zipfile.ZIP_DEFLATED) as z:\n\
             \x20   z.write(sys.argv[1], 'bootstrap')",
        ])
        .arg(binary)
        .arg(&zip)
        .status()
        .map_err(|e| format!("python3: {e}"))?;
    if !status.success() {
        return Err("zipping the bootstrap failed".into());
    }
    let zipped = std::fs::metadata(&zip).map_err(|e| e.to_string())?.len();
    let _ = std::fs::remove_file(&zip);
    Ok((raw, zipped))
}

/// The child-process mode that measures the in-memory store: day one fills
/// it with `n` distinct subjects; then the clock passes 00:00 UTC and day two
/// brings `n` new ones, so every day-one entry has expired. Prints one line:
/// `baseline peak_day1 peak_day2 len_day1 len_day2` (bytes, entries).
pub fn memory_child(n: u64) {
    let baseline = proc_status_kib("self", "VmRSS:").unwrap_or(0);
    // 2026-11-30T10:00:00Z, then one second past the next midnight.
    let t = AtomicI64::new(1_796_032_800);
    let store = MemoryStore::default();
    let hasher = Hasher::new(b"bench-secret-0123456789abcdef0123");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let fill = |from: u64| {
        runtime.block_on(async {
            for i in from..from + n {
                let ip = std::net::Ipv4Addr::from(i as u32).to_string();
                let key = QuotaKey::new(Scope::Ip, &hasher.digest(Scope::Ip, &ip));
                let now = quota_gate::rules::unix::UnixSecs(t.load(Ordering::Relaxed));
                let args = CountArgs {
                    key: &key,
                    levels: &[],
                    period_end: period_end(ResetPolicy::UtcDay, now),
                    now,
                    reset: ResetPolicy::UtcDay,
                };
                let _ = store.count(args).await;
            }
        })
    };
    fill(0);
    let day1 = proc_status_kib("self", "VmHWM:").unwrap_or(0);
    let len1 = store.len();
    t.store(1_796_083_201, Ordering::Relaxed);
    fill(n);
    let day2 = proc_status_kib("self", "VmHWM:").unwrap_or(0);
    let len2 = store.len();
    println!("{baseline} {day1} {day2} {len1} {len2}");
}

/// The store's figures, from a child process running [`memory_child`].
pub struct MemoryFigures {
    pub subjects: u64,
    pub baseline: u64,
    pub peak_day1: u64,
    pub peak_day2: u64,
    pub len_day1: u64,
    pub len_day2: u64,
}

pub fn memory_figures(n: u64) -> Result<MemoryFigures, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .env(super::CHILD_ENV, format!("memory:{n}"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text
        .lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect();
    if !out.status.success() || v.len() != 5 {
        return Err(format!("memory child failed: {text}"));
    }
    Ok(MemoryFigures {
        subjects: n,
        baseline: v[0],
        peak_day1: v[1],
        peak_day2: v[2],
        len_day1: v[3],
        len_day2: v[4],
    })
}
