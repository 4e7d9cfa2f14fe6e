//! The `quota-gate` command: the local server and the operator tools.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use crate::config::{Config, DEV_HASH_SECRET};
use crate::gate::Gate;
use crate::meter::{DELAY_MS, Meter};

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
    crate::init_tracing();
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
            Command::Inspect(args) => {
                let secret = local_secret(&config);
                crate::ops::command::inspect(args, &config, &secret)
                    .await
                    .map_err(|e| e.to_string())
            }
            Command::Reset(args) => {
                let secret = local_secret(&config);
                crate::ops::command::reset(args, &config, &secret)
                    .await
                    .map_err(|e| e.to_string())
            }
            Command::Purge(args) => crate::ops::command::purge(args, &config)
                .await
                .map_err(|e| e.to_string()),
            Command::Stats(args) => crate::ops::command::stats(args, &config)
                .await
                .map_err(|e| e.to_string()),
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

/// The hash secret, or the built-in development one, said out loud.
fn local_secret(config: &Config) -> Vec<u8> {
    match &config.hash_secret {
        Some(s) => s.as_bytes().to_vec(),
        None => {
            tracing::warn!(
                "QUOTA_HASH_SECRET is unset: using the built-in development secret; \
                 digests are not private. Set it for anything but local testing."
            );
            DEV_HASH_SECRET.as_bytes().to_vec()
        }
    }
}

async fn serve(config: Config) -> Result<(), String> {
    let metrics = install_prometheus()?;
    let secret = local_secret(&config);
    let listen = config.listen;
    let store = if config.valkey_url.is_some() {
        "valkey"
    } else {
        "in-memory"
    };
    // The same EMF line per request as in Lambda (a CloudWatch agent or any
    // log shipper can pick it up), besides the Prometheus text at /metrics.
    let meter = Meter::stdout(config.metrics_namespace.clone());
    let gate = Gate::from_config(config, &secret, meter)
        .await
        .map_err(|e| format!("configuration error: {e}"))?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%addr, store, "quota-gate serving POST /scan");
    let shutdown = async {
        shutdown_signal().await;
        tracing::info!("shutting down: finishing requests in flight");
    };
    crate::serve::serve(listener, Arc::new(gate), Some(metrics), shutdown)
        .await
        .map_err(|e| e.to_string())
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
