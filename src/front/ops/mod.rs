//! The operator tools behind `quota-gate inspect | reset | purge | stats`.
//!
//! | command | module | what it does |
//! |---|---|---|
//! | `inspect` | [`subject`] | one client's counter, TTL, first-seen, reset, paced backlog and next tier |
//! | `reset` | [`subject`] | removes all of one client's keys: counter, first-seen, pacing slot, grant, idempotency records |
//! | `grant` | [`subject`] | N extra scans for one client's current period (a key beside its counter, expiring with it), or `--revoke` |
//! | `inspect/grant/reset --network` | [`network`] | one network level (a configured length of `QUOTA_NETWORKS`); `inspect --ip` also shows each level of the address |
//! | `purge` | [`purge`] | the seed's mass expiry: every `quota:*` key, in batches |
//! | `stats` | [`stats`] | soft and hard hits, reminders and p95 delay from CloudWatch |
//!
//! A client is found exactly as the handler finds it: the same
//! [`Identifier`](crate::gate::identity::Identifier) normalises the address and hashes under the same secret,
//! so an operator never has to know a digest. Nothing here prints an IP or a
//! token; subjects are named by their key.
//!
//! The commands talk to the Valkey named by `VALKEY_URL`. The in-memory
//! store exists only inside one `quota-gate serve` process, so without
//! `VALKEY_URL` there is nothing to inspect and they say so.

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

/// The bound on each Valkey call from an operator command. The request
/// path's `QUOTA_STORE_TIMEOUT_MS` (100 ms by default) protects clients; an
/// operator unlinking 500 keys on a busy primary can wait longer.
pub const OPS_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an operator command failed. The CLI prints it and exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// A bad or missing setting, naming its variable.
    #[error("configuration error: {0}")]
    Config(#[from] ConfigError),
    /// Operator input that cannot name a client, or a refused action.
    #[error("{0}")]
    Usage(String),
    /// Operator input that names nothing configured (a `--network` of a
    /// length `QUOTA_NETWORKS` does not list): a usage error, exit status 2.
    #[error("{0}")]
    BadInput(String),
    #[error(transparent)]
    Store(#[from] SendError),
    #[error("CloudWatch: {0}")]
    CloudWatch(String),
}

/// The Valkey store `VALKEY_URL` names (cluster mode and TLS CA as the
/// handler would use them), with the operator timeout.
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
