//! The local front end: `quota-gate serve`, an HTTP/1.1 server on the same
//! [`Gate::handle`] as Lambda.
//!
//! Routes: `POST /scan` (the gate), `GET`/`HEAD /healthz`, and `GET /metrics`
//! (Prometheus text, when a recorder handle is given). The source address is
//! the socket peer.
//!
//! # Layout
//!
//! | file | what it does |
//! |---|---|
//! | `server.rs` | [`Server`]: one single-threaded worker per core on one listening socket, run until a shutdown future |
//! | `connection.rs` | a worker's accept loop: a connection slot, then hyper over a socket whose stalled writes time out; the drain |
//! | `route.rs` | one request: `/healthz`, `/metrics`, or the gate in a task of its own |
//! | `limits.rs` | [`ServeLimits`]: the timeouts, the connection cap and the drain, shared by the three above |
//!
//! # Clients that hold the server up
//!
//! A server on a network must let go of clients that hold it up:
//! - a connection that has not sent a request's complete headers within
//!   [`HEADER_READ_TIMEOUT`] (10 s) of opening, or of its previous response,
//!   is closed: this is both the slow-header (slowloris) bound and the idle
//!   keep-alive timeout;
//! - a body must arrive within [`BODY_READ_TIMEOUT`], else 408; bodies are
//!   read at most 64 KiB + 1 bytes, and a `Content-Length` above 64 KiB is
//!   answered 413 before any of the body is read (so an
//!   `Expect: 100-continue` client never gets `100 Continue` and never sends it);
//! - a connection whose answer cannot be written for [`WRITE_TIMEOUT`] (5 s:
//!   a client that pipelines requests and never reads them fills its receive
//!   window and the server's send buffer) is closed, and its slot freed. So
//!   that the write waits soon, at most [`MAX_UNSENT`] (16 KiB) of answers
//!   not yet sent may queue in the kernel (`TCP_NOTSENT_LOWAT`, Linux):
//!   without it, the kernel grows a loopback socket's send buffer to
//!   megabytes, and 1 024 such clients kept `serve` busy writing `/metrics`
//!   they never read, their slots never freed;
//! - pipelining is bounded by hyper's buffers ([`MAX_BUF_SIZE`], 64 KiB
//!   instead of hyper's ~400 KB): at most that much of what a client
//!   pipelines is read ahead, a request head may be no larger (else 431), and
//!   no further request is answered while an answer waits unsent in hyper's
//!   buffer, so a client that does not read gets a few answers written (about
//!   20 KiB: its receive window and [`MAX_UNSENT`]), then the write timeout.
//!   There is no cap on requests per keep-alive connection: one that reads
//!   its answers costs nothing more than a new connection would;
//! - at most [`ServeLimits::max_connections`] connections are open at once
//!   (`QUOTA_MAX_CONNECTIONS`); past it new connections wait in the listen
//!   backlog (4096 deep, as far as `net.core.somaxconn` allows) until one
//!   closes, and the open ones are not disturbed.
//!
//! With 1 024 such never-reading connections (each pipelining 1 500
//! `GET /metrics` with a 4 KiB receive buffer) held open and reopened as
//! they are closed, at the default cap, a fresh client's `/healthz` and
//! `POST /scan` are answered within the write timeout plus the time to
//! reach the head of the backlog: the slowest in 25 s took 4.1 s (4.4 s
//! with 8 at `QUOTA_MAX_CONNECTIONS=8`), on a busy 2-core machine, while
//! `serve` closed about 4 100 flood connections (`tests/serve.rs`).
//!
//! # The request outlives its connection
//!
//! The gate's handling of a request runs in a task of its own, which the
//! connection awaits: a client that goes away (an HTTP timeout shorter than
//! its delay) does not cancel it, so a counted scan still ends as its job
//! and, with an `Idempotency-Key`, its saved answer, as in Lambda. The task
//! holds its connection's slot until it ends: a client that sends scans and
//! leaves cannot have more in flight than [`ServeLimits::max_connections`].
//!
//! # Shutdown
//!
//! When the shutdown future completes (`SIGTERM` or Ctrl-C for
//! `quota-gate serve`), the workers stop accepting, idle connections are
//! closed, and the requests in flight, and the tasks of clients that left,
//! run to their end: for at most [`drain_timeout`], the longest a request
//! may take under the settings (its sleep, at most
//! `QUOTA_GATEWAY_TIMEOUT_MS − QUOTA_DELAY_MARGIN_MS`, its enqueue and its
//! store calls). So a scan asleep at `SIGTERM` still gets its 202 and its
//! job; a counted scan is never left without its job (or its refund) unless
//! the drain itself times out, which the store and queue timeouts prevent.
//! A supervisor's grace period (Kubernetes' `terminationGracePeriodSeconds`,
//! Docker's `stop --time`) should be at least [`drain_timeout`].
//!
//! `/healthz` and `/metrics` touch neither the store, the queue nor stdout.

mod connection;
mod detach;
mod limits;
mod route;
mod server;

use std::future::Future;
use std::sync::Arc;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::gate::Gate;
use crate::io::queue::ScanQueue;
use crate::io::store::QuotaStore;

pub use detach::{Detached, detach};
pub use limits::{
    BODY_READ_TIMEOUT, HEADER_READ_TIMEOUT, MAX_BUF_SIZE, MAX_UNSENT, ServeLimits, WRITE_TIMEOUT,
    drain_timeout,
};
pub use server::Server;

use limits::connection_slots;

/// Serves `gate` on `listener` with the default [`ServeLimits`] until
/// `shutdown` completes (see [`serve_with`]).
pub async fn serve<S: QuotaStore, Q: ScanQueue>(
    listener: TcpListener,
    gate: Arc<Gate<S, Q>>,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, gate, metrics, ServeLimits::default(), shutdown).await
}

/// Serves `gate` on `listener` (on the calling runtime) until `shutdown`
/// completes, then stops accepting and lets the requests in flight finish
/// (at most [`ServeLimits::drain_timeout`]), so a restart never drops a
/// counted scan's answer. [`Server`] runs one of these per worker.
pub async fn serve_with<S: QuotaStore, Q: ScanQueue>(
    listener: TcpListener,
    gate: Arc<Gate<S, Q>>,
    metrics: Option<PrometheusHandle>,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let worker = connection::Worker {
        gate,
        metrics,
        limits,
        slots: connection_slots(limits),
    };
    worker.run(listener, shutdown).await
}
