//! [`Server`]: `quota-gate serve`'s workers on one listening socket.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use super::admission::Admission;
use super::connection::Worker;
use super::limits::ServeLimits;
use crate::config::Config;
use crate::gate::{Gate, Shared};
use crate::io::meter::Meter;
use crate::io::queue::AnyQueue;
use crate::io::store::AnyStore;
use crate::rules::unix::duration_ms;

/// Connections waiting to be accepted at the cap (capped by `net.core.somaxconn`): deep enough
/// that a flood of reconnects does not make a fresh client's SYN wait for a retransmission.
const LISTEN_BACKLOG: i32 = 4096;

/// File descriptors kept for everything but client connections.
const RESERVED_FDS: usize = 64;

/// The local server: one single-threaded runtime per worker (`QUOTA_SERVE_WORKERS`) on one
/// listening socket. Each worker has its own gate and Valkey connection, so a request stays on one
/// thread; they share the connection cap, the in-memory store, stdout and the metrics recorder.
pub struct Server {
    listener: std::net::TcpListener,
    gates: Vec<Gate<AnyStore, AnyQueue>>,
    metrics: Option<PrometheusHandle>,
    /// Flushed once the workers have ended.
    meter: Meter,
    limits: ServeLimits,
    store: &'static str,
}

impl Server {
    /// Builds every worker's gate, so a configuration error stops the start, then listens on
    /// `QUOTA_LISTEN`. Install the Prometheus recorder before this.
    pub async fn bind(config: Config, metrics: Option<PrometheusHandle>) -> Result<Self, String> {
        let workers = match config.serve.workers {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => usize::from(n),
        };
        let meter = if config.serve.emf {
            Meter::background_stdout(config.metrics_namespace.clone())
        } else {
            Meter::new(config.metrics_namespace.clone(), None)
        };
        let meter = meter.with_levels(&config.policy.levels);
        warn_if_proxies_untrusted(&config);
        let mut limits = ServeLimits::from_config(&config);
        limits.max_connections = connection_cap(limits.max_connections);
        let woken = super::limits::longest_woken_request(&config);
        if limits.drain_timeout < woken {
            tracing::warn!(
                drain_ms = duration_ms(limits.drain_timeout),
                woken_ms = duration_ms(woken),
                "QUOTA_DRAIN_TIMEOUT_MS leaves the requests in flight at shutdown less than an \
                 enqueue and the store calls may take: one cut off is counted without its job"
            );
        }
        let store = config
            .store
            .valkey
            .as_ref()
            .map_or("in-memory", |_| "valkey");
        let shared = Shared::default();
        let mut gates = Vec::with_capacity(workers);
        for _ in 0..workers {
            let gate = Gate::from_config_sharing(config.clone(), meter.clone(), &shared)
                .await
                .map_err(|e| format!("configuration error: {e}"))?;
            gates.push(gate);
        }
        let listen = config.serve.listen;
        let listener = listen_on(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        Ok(Self {
            listener,
            gates,
            metrics,
            meter,
            limits,
            store,
        })
    }

    /// Serves until `shutdown` completes (or a worker stops), then drains and joins every worker.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), String> {
        let addr = self.listener.local_addr().map_err(|e| e.to_string())?;
        let workers = self.gates.len();
        let admission = Admission::new(&self.limits);
        // Cancelled to stop the workers, by any worker that ends (one that could not start stops
        // all), and however this returns.
        let stop = CancellationToken::new();
        let stop_all = stop.clone().drop_guard();
        let mut threads = Vec::with_capacity(workers);
        for (i, gate) in self.gates.into_iter().enumerate() {
            let worker = Worker {
                gate: Arc::new(gate),
                metrics: self.metrics.clone(),
                limits: self.limits,
                admission: admission.clone(),
            };
            let listener = self.listener.try_clone().map_err(|e| e.to_string())?;
            let thread = spawn_worker(i, worker, listener, stop.clone())
                .map_err(|e| format!("cannot start a serve worker: {e}"))?;
            threads.push(thread);
        }
        drop(self.listener);
        tracing::info!(%addr, store = self.store, workers, "quota-gate serving POST /scan");
        let drain_limit_ms = duration_ms(self.limits.drain_timeout);
        tokio::select! {
            () = shutdown => {
                tracing::info!(drain_limit_ms, "shutting down: finishing requests in flight, for at most the drain limit");
            }
            () = stop.cancelled() => tracing::error!("a serve worker stopped; shutting down"),
        }
        let draining = std::time::Instant::now();
        drop(stop_all);
        let joined = tokio::task::spawn_blocking(move || {
            let panicked = || std::io::Error::other("worker panicked");
            threads
                .into_iter()
                .try_for_each(|t| t.join().unwrap_or_else(|_| Err(panicked())))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string());
        let drained_ms = duration_ms(draining.elapsed());
        self.meter.flush(crate::io::clock::Clock::System.now());
        tracing::info!(drained_ms, "stopped: every request in flight answered");
        joined
    }
}

/// Starts worker `i` on a thread and runtime of its own, serving until `stop` is cancelled, which
/// it cancels when it ends, however it ends.
fn spawn_worker(
    i: usize,
    worker: Worker<AnyStore, AnyQueue>,
    listener: std::net::TcpListener,
    stop: CancellationToken,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    let run = move || -> std::io::Result<()> {
        let _ended = stop.clone().drop_guard();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            worker.run(listener, stop.cancelled_owned()).await
        })
    };
    std::thread::Builder::new()
        .name(format!("serve-{i}"))
        .spawn(run)
}

/// Warns when other hosts may connect and no proxy is trusted: behind a proxy every client shares
/// the proxy's one anonymous counter.
fn warn_if_proxies_untrusted(config: &Config) {
    // Other hosts may reach any non-loopback address, wildcards included.
    if !config.serve.listen.ip().is_loopback() && config.identity.trusted_proxies.is_empty() {
        tracing::warn!(
            listen = %config.serve.listen,
            "QUOTA_TRUSTED_PROXIES is empty: behind a proxy, load balancer or NAT every client \
             shares the proxy's one anonymous counter; set QUOTA_TRUSTED_PROXIES to the proxies' \
             CIDRs (e.g. 10.0.0.0/8) so their X-Forwarded-For names the client"
        );
    }
}

/// A non-blocking listening socket on `addr` with a [`LISTEN_BACKLOG`]-deep backlog.
fn listen_on(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // A restart may bind while old connections sit in TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// `QUOTA_MAX_CONNECTIONS`, lowered (with a warning) to fit the soft open-file limit
/// (`RLIMIT_NOFILE`), past which `accept` fails.
fn connection_cap(configured: usize) -> usize {
    use rustix::process::{Resource, getrlimit};
    let Some(limit) = getrlimit(Resource::Nofile).current else {
        return configured;
    };
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
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
