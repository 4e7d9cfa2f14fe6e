//! The local server's limits: timeouts, the connection cap and its graces, and the drain.

use std::time::Duration;

use crate::config::Config;

/// Headers must be complete this long after opening or the previous answer (also the idle timeout).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// At the cap, a connection without complete headers may be closed for a new one this long after
/// `serve` first reads it: ample for a real client, which sends its request at once.
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
pub(super) fn longest_woken_request(config: &Config) -> Duration {
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
