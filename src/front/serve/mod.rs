//! The local front end: `quota-gate serve`, an HTTP/1.1 server on the same
//! [`Gate::handle`] as Lambda.
//!
//! Routes: `POST /scan` (the gate), `GET`/`HEAD /healthz`, `/readyz`, and `GET /metrics`
//! (Prometheus text, when a recorder handle is given). The source address is
//! the socket peer.
//!
//! # Layout
//!
//! | file | what it does |
//! |---|---|
//! | `server.rs` | [`Server`]: one single-threaded worker per core on one listening socket, run until a shutdown future |
//! | `connection.rs` | a worker's accept loop: a connection, a slot for it, then hyper over a socket whose stalled writes time out; the drain |
//! | `admission.rs` | the connection cap, shared by the workers, and which open connection gives its slot up to a new one |
//! | `answer.rs` | the response body and socket wrappers that tell the cap when a connection's answer is sent |
//! | `route.rs` | one request: `/healthz`, `/readyz`, `/metrics`, or the gate in a task of its own |
//! | `limits.rs` | [`ServeLimits`]: the timeouts, the connection cap, its graces and the drain, shared by the others |
//!
//! # Clients that hold the server up
//!
//! A server on a network must let go of clients that hold it up:
//! - a connection that has not sent a request's complete headers within
//!   [`HEADER_READ_TIMEOUT`] (10 s) of opening, or of its previous response,
//!   is closed: this is both the slow-header bound and the idle keep-alive
//!   timeout (at the connection cap such a connection goes sooner, below);
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
//!   (`QUOTA_MAX_CONNECTIONS`). At the cap, a new connection takes the slot
//!   of the open one that has waited longest for a request's complete
//!   headers, which is closed: one that has sent no complete request in the
//!   [`NEW_CONNECTION_GRACE`] (250 ms) or more since it opened, or a
//!   keep-alive one idle for [`KEEP_ALIVE_GRACE`] (2 s) or more since its
//!   last answer was sent. None of its requests has reached the gate and
//!   its answers are all sent, so closing it loses nothing; a connection
//!   reading, running or answering a request is never closed for another.
//!   Only when every open connection is busy or within its grace does a new
//!   one wait, in the listen backlog (4096 deep, as far as
//!   `net.core.somaxconn` allows), for a slot to free. So connections that
//!   dribble their headers a byte at a time and never finish them
//!   (slowloris) hold their slots only until newer clients need them, not
//!   for the header timeout, and a client between two requests keeps its
//!   connection. The graces are what a flood costs: a client gets at least
//!   250 ms to send its request, and the cap lets go of at most
//!   `QUOTA_MAX_CONNECTIONS` flood connections per 250 ms;
//! - a client that shuts its side of the connection (a TCP half-close) once
//!   its request is sent still gets its whole answer; one that does so
//!   before its headers are complete is let go at once.
//!
//! With 1 024 such never-reading connections (each pipelining 1 500
//! `GET /metrics` with a 4 KiB receive buffer) held open and reopened as
//! they are closed, at the default cap, a fresh client's `/healthz` and
//! `POST /scan` are answered within the write timeout plus the time to
//! reach the head of the backlog: the slowest in 25 s took 4.1 s (4.4 s
//! with 8 at `QUOTA_MAX_CONNECTIONS=8`), on a busy 2-core machine, while
//! `serve` closed about 4 100 flood connections (`tests/it/serve.rs`).
//!
//! With 1 100 connections each dribbling a header byte a second at the
//! default cap, reopened as they were closed (about 900 a second), a fresh
//! client's `/healthz` and `POST /scan` were answered within 13 ms
//! throughout 30 s on a busy 2-core machine; when dribblers held their
//! slots until the header timeout, such answers took up to 8.6 s, and a
//! slow one was in flight nearly the whole 30 s (`tests/it/serve.rs` holds the
//! answers to 1 s with 96 dribblers at `QUOTA_MAX_CONNECTIONS=64`).
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
//! closed, and every scan asleep in its delay is woken
//! ([`Gate::wake_sleepers`]): it goes on at once, its job held back by the
//! rest of its delay (its `notBefore` is unchanged, so it still starts no
//! sooner than its delay after the request), and the client gets its 202
//! early. The requests in flight, and the tasks of clients that left, then
//! need only their enqueue and store calls, and get [`drain_timeout`]:
//! `QUOTA_DRAIN_TIMEOUT_MS` (8 s, below Docker's 10 s stop timeout) less
//! the second kept for the last EMF and log lines. So the process exits
//! within `QUOTA_DRAIN_TIMEOUT_MS` of the signal, and a counted scan is
//! never left without its job (or its refund) unless its enqueue or store
//! calls outlast the drain (the start warns when the setting leaves less
//! than they may take). Waking the sleepers rather than letting short ones
//! finish keeps the bound whatever the delays: a 28 s sleep could never
//! finish within it, and one rule serves both.
//!
//! `/healthz` and `/metrics` touch neither the store, the queue nor stdout;
//! `/readyz` sends the store one `PING`, waiting at most a second.

mod admission;
mod answer;
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
    BODY_READ_TIMEOUT, HEADER_READ_TIMEOUT, KEEP_ALIVE_GRACE, MAX_BUF_SIZE, MAX_UNSENT,
    NEW_CONNECTION_GRACE, ServeLimits, WRITE_TIMEOUT, drain_timeout,
};
pub use server::Server;

use admission::Admission;

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
        admission: Admission::new(&limits),
    };
    worker.run(listener, shutdown).await
}
