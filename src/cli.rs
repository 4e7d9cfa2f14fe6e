//! The `quota-gate` command: the local server and the operator tools.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::config::Config;
use crate::gate::{Gate, Shared};
use crate::meter::{DELAY_MS, Meter};
use crate::serve::ServeLimits;
use crate::stdout::{LINE_QUEUE, LineWriter};

/// Daily free-tier quota gate for the Scanner API.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve POST /scan, GET /healthz and GET /metrics on QUOTA_LISTEN (default 127.0.0.1:9000).
    Serve,
    /// Show one client's counter, TTL, first-seen, next tier and reset (needs VALKEY_URL).
    Inspect(crate::ops::command::InspectArgs),
    /// Remove one client's counter and first-seen key (needs VALKEY_URL).
    Reset(crate::ops::command::ResetArgs),
    /// Remove every quota:* key, the seed's mass expiry (needs VALKEY_URL and --yes).
    Purge(crate::ops::command::PurgeArgs),
    /// Soft hits, hard hits, reminders and p95 delay per scope, from CloudWatch.
    Stats(crate::ops::command::StatsArgs),
}

/// Bucket bounds (ms) for `stella_quota_delay_ms`: dense around the 1 s
/// alert threshold and the soft and hard delays, so
/// `histogram_quantile(0.95, …)` is meaningful.
pub const DELAY_BUCKETS_MS: [f64; 12] = [
    0.0, 1.0, 10.0, 100.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 30000.0, 60000.0, 120000.0,
];

/// Installs the Prometheus recorder behind `GET /metrics`.
pub fn install_prometheus() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(DELAY_MS.into()), &DELAY_BUCKETS_MS)
        .and_then(|b| b.install_recorder())
        .map_err(|e| e.to_string())?;
    crate::meter::describe();
    Ok(handle)
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(&cli.command);
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quota-gate: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("quota-gate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve => serve(config).await,
            Command::Inspect(args) => crate::ops::command::inspect(args, &config)
                .await
                .map_err(|e| e.to_string()),
            Command::Reset(args) => crate::ops::command::reset(args, &config)
                .await
                .map_err(|e| e.to_string()),
            Command::Purge(args) => crate::ops::command::purge(args, &config)
                .await
                .map_err(|e| e.to_string()),
            Command::Stats(args) => {
                crate::ops::stats::preflight()
                    .await
                    .map_err(|e| e.to_string())?;
                crate::ops::command::stats(args, &config)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("quota-gate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `quota-gate serve`: one single-threaded Tokio runtime per worker
/// (`QUOTA_SERVE_WORKERS`, one per CPU by default), all accepting on one
/// listening socket. Each worker has its own gate and Valkey connection, so
/// a request, its connection's tasks and its Valkey replies stay on one
/// thread: no cross-thread wake-ups, which under load cost a multi-thread
/// runtime about a fifth of `serve`'s CPU (docs/benchmarks.md). The workers
/// share the connection cap, the in-memory store (without Valkey), the
/// stdout writer, the Prometheus recorder and the AWS configuration; each
/// has its own breaker, as each has its own connection.
async fn serve(config: Config) -> Result<(), String> {
    let metrics = install_prometheus()?;
    let listen = config.serve.listen;
    let store = if config.store.valkey.is_some() {
        "valkey"
    } else {
        "in-memory"
    };
    let workers = match config.serve.workers {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => usize::from(n),
    };
    // The same EMF line per request as in Lambda (a CloudWatch agent or any
    // log shipper can pick it up), besides the Prometheus text at /metrics;
    // through the non-blocking writer, so a stdout nobody reads costs lines
    // (counted), never requests.
    let meter = Meter::background_stdout(config.metrics_namespace.clone());
    let limits = ServeLimits {
        max_connections: connection_cap(config.serve.max_connections as usize),
        ..ServeLimits::default()
    };
    let slots = crate::serve::connection_slots(limits);
    let shared = Shared::default();
    // Every gate first, so a configuration error stops the start before
    // anything listens.
    let mut gates = Vec::with_capacity(workers);
    for _ in 0..workers {
        let gate = Gate::from_config_sharing(config.clone(), meter.clone(), &shared)
            .await
            .map_err(|e| format!("configuration error: {e}"))?;
        gates.push(gate);
    }
    let listener = std::net::TcpListener::bind(listen)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (stop, stopping) = tokio::sync::watch::channel(false);
    // A worker that ends before the shutdown (it could not start) stops all.
    let (ended, mut worker_ended) = tokio::sync::mpsc::channel::<()>(workers);
    let mut threads = Vec::with_capacity(workers);
    for (i, gate) in gates.into_iter().enumerate() {
        let listener = listener.try_clone().map_err(|e| e.to_string())?;
        let (metrics, slots, mut stopping) = (metrics.clone(), slots.clone(), stopping.clone());
        let ended = ended.clone();
        let worker = move || -> std::io::Result<()> {
            let _ended = DropSends(ended);
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener)?;
                let shutdown = async move {
                    let _ = stopping.wait_for(|stop| *stop).await;
                };
                let gate = Arc::new(gate);
                crate::serve::serve_sharing(listener, gate, Some(metrics), limits, slots, shutdown)
                    .await
            })
        };
        let thread = std::thread::Builder::new()
            .name(format!("serve-{i}"))
            .spawn(worker)
            .map_err(|e| format!("cannot start a serve worker: {e}"))?;
        threads.push(thread);
    }
    drop((listener, ended));
    tracing::info!(%addr, store, workers, "quota-gate serving POST /scan");
    tokio::select! {
        () = shutdown_signal() => tracing::info!("shutting down: finishing requests in flight"),
        _ = worker_ended.recv() => tracing::error!("a serve worker stopped; shutting down"),
    }
    let _ = stop.send(true);
    let served = tokio::task::spawn_blocking(move || {
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("worker panicked")))
            })
            .collect::<std::io::Result<Vec<()>>>()
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map(drop).map_err(|e| e.to_string()));
    // The last EMF lines and log lines out, unless nobody is reading.
    LineWriter::stdout().drain(EXIT_DRAIN).await;
    if let Some(stderr) = STDERR.get() {
        stderr.drain(EXIT_DRAIN).await;
    }
    served
}

/// Says so on its channel when dropped: a worker thread's end, however it ends.
struct DropSends(tokio::sync::mpsc::Sender<()>);

impl Drop for DropSends {
    fn drop(&mut self) {
        let _ = self.0.try_send(());
    }
}

/// How long a stopping `serve` waits for its stdout and stderr readers.
const EXIT_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// `serve`'s non-blocking stderr, for the logs.
static STDERR: std::sync::OnceLock<LineWriter> = std::sync::OnceLock::new();

/// File descriptors kept for everything but client connections: the
/// listener, Valkey and queue connections, stdio, the runtime's own.
const RESERVED_FDS: usize = 64;

/// `QUOTA_MAX_CONNECTIONS`, lowered (with a warning) to fit the process's
/// open-file limit: past that limit `accept` fails, and so would /healthz.
fn connection_cap(configured: usize) -> usize {
    let Some(limit) = open_file_limit() else {
        return configured;
    };
    let fits = limit.saturating_sub(RESERVED_FDS).max(1);
    if configured > fits {
        tracing::warn!(
            configured,
            open_file_limit = limit,
            "QUOTA_MAX_CONNECTIONS is above what the open-file limit allows; using {fits}"
        );
        fits
    } else {
        configured
    }
}

/// The soft `RLIMIT_NOFILE`, from `/proc/self/limits` (Linux; `None` elsewhere).
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Logs to stderr, filtered by [`crate::log_filter`]. `serve` logs through
/// a non-blocking writer, like its stdout: a stderr nobody reads loses log
/// lines, never requests.
fn init_tracing(command: &Command) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(crate::log_filter())
        .with_ansi(false);
    let _ = match command {
        Command::Serve => {
            let stderr = STDERR
                .get_or_init(|| {
                    LineWriter::spawn("stderr", Box::new(std::io::stderr()), LINE_QUEUE)
                })
                .clone();
            builder
                .with_writer(move || LogLine(stderr.clone()))
                .try_init()
        }
        _ => builder.with_writer(std::io::stderr).try_init(),
    };
}

/// One formatted log event, handed to the stderr writer thread (dropped
/// when its queue is full).
struct LogLine(LineWriter);

impl std::io::Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = self.0.try_line(buf.to_vec());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Ctrl-C, or SIGTERM as container runtimes and systemd send it.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
