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
