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
mod route;
mod server;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::gate::Gate;
use crate::io::queue::ScanQueue;
use crate::io::store::QuotaStore;

pub use route::{Detached, detach};
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

/// Headers must be complete this long after opening or the previous answer (also the idle timeout).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// At the cap, a connection without complete headers may be closed for a new one once open this
/// long: ample for a real client, which sends its request at once.
pub const NEW_CONNECTION_GRACE: Duration = Duration::from_millis(250);

/// At the cap, a keep-alive connection may be closed for a new one once idle this long.
pub const KEEP_ALIVE_GRACE: Duration = Duration::from_secs(2);

/// A request body must arrive completely within this long of its headers.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A write that makes no progress for this long closes the connection (the client is not reading).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// hyper's buffer per connection: the largest request head, and how much pipelining is read ahead.
pub const MAX_BUF_SIZE: usize = 64 * 1024;

/// Unsent bytes per connection the kernel may hold before a write waits (`TCP_NOTSENT_LOWAT`).
pub const MAX_UNSENT: u32 = 16 * 1024;

/// Of `QUOTA_DRAIN_TIMEOUT_MS`, what is kept for the last EMF and log lines (at most a quarter).
pub const EXIT_OUTPUT: Duration = Duration::from_secs(1);

/// Store calls a request may make besides its enqueue, with room to spare.
const STORE_CALLS_PER_REQUEST: u32 = 8;

/// Connection limits of the local server; the other limits are the constants above.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections open at once.
    pub max_connections: usize,
    /// See [`NEW_CONNECTION_GRACE`].
    pub new_connection_grace: Duration,
    /// See [`KEEP_ALIVE_GRACE`].
    pub keep_alive_grace: Duration,
    /// How long shutdown waits for requests in flight.
    pub drain_timeout: Duration,
}

impl ServeLimits {
    pub fn from_config(config: &Config) -> Self {
        Self {
            max_connections: config.serve.max_connections as usize,
            new_connection_grace: NEW_CONNECTION_GRACE,
            keep_alive_grace: KEEP_ALIVE_GRACE,
            drain_timeout: drain_timeout(config),
        }
    }
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self::from_config(&Config::default())
    }
}

/// How long shutdown waits for the requests in flight: `QUOTA_DRAIN_TIMEOUT_MS` less
/// `EXIT_OUTPUT`. Sleeps are woken, so a request needs only its enqueue and store calls.
pub fn drain_timeout(config: &Config) -> Duration {
    let total = config.serve.drain_timeout;
    total - EXIT_OUTPUT.min(total / 4)
}

/// A woken request's worst remaining time; a shorter drain may leave it counted without its job.
fn longest_woken_request(config: &Config) -> Duration {
    crate::gate::ENQUEUE_TIMEOUT + config.store.timeout * STORE_CALLS_PER_REQUEST
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The requests get the configured drain less the output's share, and
    /// by default that covers what a woken request may still take.
    #[test]
    fn drain_is_the_configured_bound() {
        let config = Config::default();
        assert_eq!(drain_timeout(&config), Duration::from_millis(7_000));
        assert!(drain_timeout(&config) >= longest_woken_request(&config));
        let mut short = Config::default();
        short.serve.drain_timeout = Duration::from_millis(1_000);
        assert_eq!(drain_timeout(&short), Duration::from_millis(750));
        assert_eq!(
            ServeLimits::default().drain_timeout,
            Duration::from_millis(7_000)
        );
    }
}
