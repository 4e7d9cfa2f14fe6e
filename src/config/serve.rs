//! The local server's settings (`quota-gate serve`).

use std::net::SocketAddr;

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
}

impl ServeConfig {
    /// `quota-gate serve`'s address, connection cap and workers.
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
        })
    }
}
