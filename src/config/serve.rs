//! The local server's settings (`quota-gate serve`).

use std::net::SocketAddr;
use std::time::Duration;

use super::error::ConfigError;
use super::lookup::Lookup;
use super::vars;

/// The local server (`quota-gate serve`).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// Connections kept open at once.
    pub max_connections: u32,
    /// Single-threaded workers; 0: one per CPU.
    pub workers: u16,
    /// EMF lines on stdout (`QUOTA_EMF`).
    pub emf: bool,
    /// From `SIGTERM` to the exit, at most (`QUOTA_DRAIN_TIMEOUT_MS`).
    pub drain_timeout: Duration,
}

impl ServeConfig {
    /// Whether clients may reach the listener from other hosts: anything
    /// but a loopback address (a wildcard `0.0.0.0` or `::` included).
    pub fn listens_beyond_loopback(&self) -> bool {
        !self.listen.ip().is_loopback()
    }

    /// `quota-gate serve`'s address, connection cap, workers, EMF and drain.
    pub(super) fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
        let listen = env.text(&vars::QUOTA_LISTEN);
        let listen = listen.parse().map_err(|_| {
            ConfigError::new(
                vars::QUOTA_LISTEN.name(),
                format!("expected host:port, got {listen:?}"),
            )
        })?;
        Ok(Self {
            listen,
            max_connections: env.number(&vars::QUOTA_MAX_CONNECTIONS)? as u32,
            workers: env.number(&vars::QUOTA_SERVE_WORKERS)? as u16,
            emf: env.flag(&vars::QUOTA_EMF)?,
            drain_timeout: env.millis(&vars::QUOTA_DRAIN_TIMEOUT_MS)?,
        })
    }
}
