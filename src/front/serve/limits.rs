//! The local server's limits: how long a client may hold a connection up,
//! how many connections are open at once and which give way past that, and
//! how long shutdown drains.
//! Shared by the server, its workers and its routes; imports none of them.

use std::time::Duration;

use crate::config::Config;

/// A connection must deliver a request's complete headers within this long
/// of opening or of its previous response (so it is also the idle timeout).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// At the connection cap, a connection that has not sent a request's
/// complete headers may be closed to admit a new one once it has been open
/// this long: a client sends its request as soon as it has connected, so
/// this is ample for a real one, and a flood of connections that never
/// finish their headers is let go at up to
/// [`ServeLimits::max_connections`] per this long.
pub const NEW_CONNECTION_GRACE: Duration = Duration::from_millis(250);

/// At the connection cap, a keep-alive connection may be closed to admit a
/// new one once it has waited this long for its next request: a client
/// between two requests keeps its connection.
pub const KEEP_ALIVE_GRACE: Duration = Duration::from_secs(2);

/// A request body must arrive completely within this long of its headers.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A write to a client that has made no progress for this long closes the
/// connection: the client is not reading its answers.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// hyper's read and write buffer per connection: the largest request head,
/// and how much of a client's pipelined requests is read ahead.
pub const MAX_BUF_SIZE: usize = 64 * 1024;

/// Bytes written but not yet sent that may wait in the kernel per
/// connection before a write waits (`TCP_NOTSENT_LOWAT`, Linux).
pub const MAX_UNSENT: u32 = 16 * 1024;

/// Of `QUOTA_DRAIN_TIMEOUT_MS`, what is kept for the last EMF and log
/// lines to reach stdout and stderr once the requests are done (at most a
/// quarter of it).
pub const EXIT_OUTPUT: Duration = Duration::from_secs(1);

/// Store calls a request may make besides its enqueue (count, pacing,
/// claim before; refund, release, save after), each bounded by
/// `QUOTA_STORE_TIMEOUT_MS`, with room to spare.
const STORE_CALLS_PER_REQUEST: u32 = 8;

/// Connection limits of the local server.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections open at once; past it a new one takes the slot of one
    /// waiting for a request, or waits for a slot to free.
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    /// See [`NEW_CONNECTION_GRACE`].
    pub new_connection_grace: Duration,
    /// See [`KEEP_ALIVE_GRACE`].
    pub keep_alive_grace: Duration,
    pub body_read_timeout: Duration,
    /// See [`WRITE_TIMEOUT`].
    pub write_timeout: Duration,
    /// See [`MAX_BUF_SIZE`] (at least 8 KiB, hyper's minimum).
    pub max_buf_size: usize,
    /// See [`MAX_UNSENT`].
    pub max_unsent: u32,
    /// How long shutdown waits for requests in flight ([`drain_timeout`]).
    pub drain_timeout: Duration,
}

impl ServeLimits {
    /// The limits `config` sets: its connection cap and drain.
    pub fn from_config(config: &Config) -> Self {
        Self {
            max_connections: config.serve.max_connections as usize,
            header_read_timeout: HEADER_READ_TIMEOUT,
            new_connection_grace: NEW_CONNECTION_GRACE,
            keep_alive_grace: KEEP_ALIVE_GRACE,
            body_read_timeout: BODY_READ_TIMEOUT,
            write_timeout: WRITE_TIMEOUT,
            max_buf_size: MAX_BUF_SIZE,
            max_unsent: MAX_UNSENT,
            drain_timeout: drain_timeout(config),
        }
    }
}

impl Default for ServeLimits {
    /// The default configuration's limits, from the one table of variables.
    fn default() -> Self {
        Self::from_config(&Config::default())
    }
}

/// How long shutdown waits for the requests in flight:
/// `QUOTA_DRAIN_TIMEOUT_MS` less what the last output lines get
/// ([`EXIT_OUTPUT`]). Every sleep is woken at shutdown, so a request in
/// flight needs only its enqueue and its store calls; 7 s with the defaults.
pub fn drain_timeout(config: &Config) -> Duration {
    let total = config.serve.drain_timeout;
    total - EXIT_OUTPUT.min(total / 4)
}

/// What a woken request may still take at worst: its enqueue
/// ([`crate::gate::ENQUEUE_TIMEOUT`]) and its store calls. A drain shorter
/// than this may cut such a request off counted and without its job (the
/// start warns).
pub fn longest_woken_request(config: &Config) -> Duration {
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
