//! The local server's settings (`quota-gate serve`).

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};

use super::env::{flag, millis};

/// The local server (`quota-gate serve`).
#[derive(Debug, Clone, Deserialize)]
pub struct ServeConfig {
    #[serde(rename = "QUOTA_LISTEN", deserialize_with = "host_port")]
    pub listen: SocketAddr,
    #[serde(rename = "QUOTA_MAX_CONNECTIONS")]
    pub max_connections: u32,
    #[serde(rename = "QUOTA_SERVE_WORKERS")]
    pub workers: u16,
    #[serde(rename = "QUOTA_EMF", deserialize_with = "flag")]
    pub emf: bool,
    #[serde(rename = "QUOTA_DRAIN_TIMEOUT_MS", deserialize_with = "millis")]
    pub drain_timeout: Duration,
}

fn host_port<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let listen = String::deserialize(d)?;
    listen
        .parse()
        .map_err(|_| D::Error::custom(format!("expected host:port, got {listen:?}")))
}
