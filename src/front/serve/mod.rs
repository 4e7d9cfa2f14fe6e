//! The local front end: `quota-gate serve`, an HTTP/1.1 server on the same [`Gate::handle`] as
//! Lambda, plus `GET`/`HEAD /healthz` and `/readyz` and `GET /metrics`; the source address is the
//! socket peer. `/healthz` and `/metrics` touch neither the store, the queue nor stdout.
//!
//! Clients that hold the server up are let go:
//! - headers must be complete within [`HEADER_READ_TIMEOUT`] of opening or of the previous answer,
//!   a body within [`BODY_READ_TIMEOUT`]; a `Content-Length` above 64 KiB gets 413 unread;
//! - a write stalled for [`WRITE_TIMEOUT`] closes the connection; [`MAX_UNSENT`] and
//!   [`MAX_BUF_SIZE`] bound what waits unsent and what is read ahead, so a non-reader stalls soon;
//! - at most [`ServeLimits::max_connections`] are open. At the cap a new connection takes the slot
//!   of the one waiting longest for headers past its grace ([`NEW_CONNECTION_GRACE`],
//!   [`KEEP_ALIVE_GRACE`]), which loses nothing; else it waits in the listen backlog;
//! - after a TCP half-close, a complete request still gets its answer.
//!
//! The gate runs in a task of its own, so a client that leaves cancels neither a counted scan's
//! job nor its saved answer; the task holds its connection's slot until it ends.
//!
//! On shutdown the workers stop accepting and scans asleep in their delay are woken
//! ([`Gate::wake_sleepers`]): their jobs keep their `notBefore` and the clients get their 202
//! early, so the requests in flight need only [`drain_timeout`] whatever the delays.

mod admission;
mod connection;
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

pub use limits::{
    BODY_READ_TIMEOUT, HEADER_READ_TIMEOUT, KEEP_ALIVE_GRACE, MAX_BUF_SIZE, MAX_UNSENT,
    NEW_CONNECTION_GRACE, ServeLimits, WRITE_TIMEOUT, drain_timeout,
};
pub use route::detach;
pub use server::Server;

use admission::Admission;

/// Serves `gate` on `listener` (on the calling runtime) with the default [`ServeLimits`] until
/// `shutdown` completes, then lets the requests in flight finish (at most
/// [`ServeLimits::drain_timeout`]). [`Server`] runs one per worker.
pub async fn serve<S: QuotaStore, Q: ScanQueue>(
    listener: TcpListener,
    gate: Arc<Gate<S, Q>>,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let limits = ServeLimits::default();
    let admission = Admission::new(&limits);
    let worker = connection::Worker {
        gate,
        metrics,
        limits,
        admission,
    };
    worker.run(listener, shutdown).await
}
