//! The operator tools behind `quota-gate inspect | grant | reset | purge | stats`. A client is
//! found as the handler finds it ([`Identifier`](crate::gate::identity::Identifier)); nothing here
//! prints an IP or a token. They need `VALKEY_URL`: the in-memory store lives only inside `serve`.

pub mod change;
pub mod command;
pub mod level_report;
pub mod network;
pub mod nodes;
pub mod progress;
pub mod purge;
pub mod stats;
pub mod subject;
pub mod valkey_admin;

use std::time::Duration;

use crate::config::{Config, ConfigError};
use crate::io::connection::Valkey;
use crate::io::store::SendError;
use crate::io::store::valkey::ValkeyStore;
use crate::rules::unix::UnixSecs;

/// Each operator Valkey call's bound: an operator unlinking a batch on a busy primary can wait.
pub const OPS_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an operator command failed.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// A bad or missing setting.
    #[error("configuration error: {0}")]
    Config(#[from] ConfigError),
    /// Operator input that cannot name a client, or a refused action.
    #[error("{0}")]
    Usage(String),
    /// Operator input that names nothing configured: exit status 2.
    #[error("{0}")]
    BadInput(String),
    #[error(transparent)]
    Store(#[from] SendError),
    #[error("CloudWatch: {0}")]
    CloudWatch(String),
}

/// The Valkey store `VALKEY_URL` names, as the handler would use it, with the operator timeout.
pub fn valkey_store(config: &Config) -> Result<ValkeyStore, OpsError> {
    let mut config = config.clone();
    config.store.timeout = config.store.timeout.max(OPS_TIMEOUT);
    let valkey = Valkey::from_config(&config)?.ok_or_else(|| {
        ConfigError::new(
            "VALKEY_URL",
            "not set: the in-memory store lives only inside `quota-gate serve`; \
             point VALKEY_URL at the quota Valkey (and set VALKEY_CLUSTER=true for a cluster)",
        )
    })?;
    Ok(ValkeyStore::new(valkey))
}

/// One aligned `label  value` line per row.
fn aligned<'a>(rows: impl IntoIterator<Item = (&'a str, String)>) -> String {
    rows.into_iter()
        .map(|(label, value)| format!("{label:<11} {value}\n"))
        .collect()
}

/// A `grant` line: the extra scans and until when (`unknown`: what is said with no expiry).
fn grant_row(grant: u64, expires_at: Option<&str>, unknown: &str) -> String {
    match (grant, expires_at) {
        (0, _) => "-".to_owned(),
        (n, Some(at)) => format!("+{n} scans this period, until {at}"),
        (n, None) => format!("+{n} scans{unknown}"),
    }
}

/// A `limit` line: the ceiling, and with a grant what it is made of.
pub fn limit_row(limit: u32, base: u32, grant: u64) -> String {
    match grant {
        0 => limit.to_string(),
        n => format!("{limit} ({base} + {n} granted)"),
    }
}

/// The wall clock, to the second.
fn now() -> UnixSecs {
    crate::io::clock::Clock::System.now().secs()
}

/// An instant as reports give it: RFC 3339, UTC.
fn rfc3339(at: UnixSecs) -> String {
    crate::gate::respond::rfc3339(at.get())
}
