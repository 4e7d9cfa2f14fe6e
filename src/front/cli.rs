//! The `quota-gate` command: the local server and the operator tools.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::config::Config;
use crate::front::serve::Server;
use crate::io::eviction_watch;
use crate::io::meter::emf::Sink;
use crate::io::meter::store::{Process, StoreMeter};
use crate::io::meter::{DELAY_MS, EMF_DROPPED};
use crate::io::stdout::{LINE_QUEUE, LineWriter};

/// Daily free-tier quota gate for the Scanner API.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve POST /scan, GET /quota, GET /healthz, GET /readyz and GET /metrics on QUOTA_LISTEN (default 127.0.0.1:9000).
    Serve,
    /// Show one client's counter, TTL, first-seen, reset, paced backlog and next tier (needs VALKEY_URL).
    Inspect(crate::front::ops::command::ClientArgs),
    /// Remove one client's keys: counter, first-seen, pacing slot, grant, idempotency records (needs VALKEY_URL).
    Reset(crate::front::ops::command::ClientArgs),
    /// Give one client N extra scans for the current period, or --revoke them (needs VALKEY_URL).
    Grant(crate::front::ops::command::GrantArgs),
    /// Remove every quota:* key, the seed's mass expiry (needs VALKEY_URL and --yes).
    Purge(crate::front::ops::command::PurgeArgs),
    /// Soft hits, hard hits, reminders and p95 delay per scope, from CloudWatch.
    Stats(crate::front::ops::command::StatsArgs),
    /// Run queued scans: each no sooner than its notBefore, each scanId once.
    Consume(Box<crate::consume::ConsumeArgs>),
    /// GET an http:// URL: exit 0 on 2xx within 2 s, else 1 (a container HEALTHCHECK).
    Probe(crate::front::probe::ProbeArgs),
    /// The guard `consume` runs each --exec scanner under (not for people).
    #[command(name = "scan-guard", hide = true)]
    ScanGuard(crate::consume::guard::GuardArgs),
}

/// Bucket bounds (ms) for `stella_quota_delay_ms`, dense around the alert threshold and the soft
/// and hard delays so that `histogram_quantile(0.95, …)` is meaningful.
pub const DELAY_BUCKETS_MS: [f64; 12] = [
    0.0, 1.0, 10.0, 100.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 30000.0, 60000.0, 120000.0,
];

/// The Prometheus exporter behind `GET /metrics`, its delay buckets set.
pub fn prometheus_builder() -> Result<PrometheusBuilder, String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(DELAY_MS.into()), &DELAY_BUCKETS_MS)
        .map_err(|e| e.to_string())
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::ScanGuard(args) => return crate::consume::guard::run(args),
        // No configuration, secret or logger: a probe runs every few seconds.
        Command::Probe(args) => return crate::front::probe::run(args),
        _ => {}
    }
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(message, status)) => {
            eprintln!("quota-gate: {message}");
            status
        }
    }
}

/// Why a command failed, and the exit status that says so: 2 for a usage error, else 1.
struct Failure(String, ExitCode);

impl Failure {
    /// A bad environment: a usage error.
    fn config(e: impl std::fmt::Display) -> Self {
        Self(format!("configuration error: {e}"), ExitCode::from(2))
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self(message, ExitCode::FAILURE)
    }
}

/// An operator command's failure: input that names nothing configured is a usage error.
impl From<crate::front::ops::OpsError> for Failure {
    fn from(e: crate::front::ops::OpsError) -> Self {
        let usage = matches!(e, crate::front::ops::OpsError::BadInput(_));
        Self(e.to_string(), ExitCode::from(if usage { 2 } else { 1 }))
    }
}

/// Runs `command` with its logger, runtime and configuration (`scan-guard` and `probe` are run
/// before any of these).
fn run(command: Command) -> Result<(), Failure> {
    use crate::front::ops::command as ops;
    let format = crate::LogFormat::from_env().map_err(Failure::config)?;
    init_tracing(&command, format);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        // Secret references are read once, before anything starts.
        let config = crate::io::secrets::config_from_env()
            .await
            .map_err(Failure::config)?;
        match command {
            Command::Serve => Ok(serve(config).await?),
            Command::Inspect(args) => Ok(ops::inspect(args, &config).await?),
            Command::Reset(args) => Ok(ops::reset(args, &config).await?),
            Command::Grant(args) => Ok(ops::grant(args, &config).await?),
            Command::Purge(args) => Ok(ops::purge(args, &config).await?),
            Command::Stats(args) => Ok(ops::stats(args, &config).await?),
            Command::Consume(args) => {
                Ok(crate::consume::run(*args, config, shutdown_signal()).await?)
            }
            Command::ScanGuard(_) | Command::Probe(_) => Ok(()),
        }
    })
}

/// `quota-gate serve`: a [`Server`] until `SIGTERM` or Ctrl-C, then the last output lines out.
async fn serve(config: Config) -> Result<(), String> {
    let metrics = prometheus_builder()?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    crate::io::meter::describe();
    // A bad URL is reported by the gates' own wiring, below.
    let valkey = crate::io::connection::Valkey::from_config(&config)
        .ok()
        .flatten();
    let watch = match &valkey {
        Some(valkey) => {
            // The store's own metrics, through the non-blocking stdout.
            let sink = (config.serve.emf).then(|| {
                Sink::Background(LineWriter::stdout(), Some(metrics::counter!(EMF_DROPPED)))
            });
            let meter = StoreMeter::new(&config.metrics_namespace, Process::Serve, sink);
            Some(eviction_watch::start(valkey, &config.store, meter).await?)
        }
        None => None,
    };
    let (shutdown, refusal) = eviction_watch::until_refused(watch, shutdown_signal());
    if let (crate::config::QueueTarget::ValkeyStream(key), Some(valkey)) = (&config.queue, valkey) {
        let key = key.clone();
        tokio::spawn(async move {
            crate::io::queue::stream::warn_without_persistence(&valkey, &key).await;
        });
    }
    let output = config.serve.drain_timeout - crate::front::serve::drain_timeout(&config);
    let served = Server::bind(config, Some(metrics))
        .await?
        .run(shutdown)
        .await;
    let by = tokio::time::Instant::now() + output;
    LineWriter::stdout().drain(output).await;
    if let Some(stderr) = STDERR.get() {
        stderr
            .drain(by.saturating_duration_since(tokio::time::Instant::now()))
            .await;
    }
    refusal.or(served)
}

static STDERR: std::sync::OnceLock<LineWriter> = std::sync::OnceLock::new();

/// Logs to stderr in `format`. `serve` logs through a non-blocking writer: a stderr nobody reads
/// loses log lines, never requests.
fn init_tracing(command: &Command, format: crate::LogFormat) {
    match command {
        Command::Serve => {
            let stderr = STDERR.get_or_init(|| {
                LineWriter::spawn("stderr", Box::new(std::io::stderr()), LINE_QUEUE)
            });
            crate::init_tracing_with(format, move || LogLine(stderr.clone()));
        }
        _ => crate::init_tracing(format),
    }
}

/// One formatted log event for the stderr writer thread (dropped when its queue is full).
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
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
