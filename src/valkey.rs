//! The connection to the quota Valkey, standalone or cluster.
//!
//! Built once per cold start and shared by the quota store and the stream
//! queue. Nothing connects at construction: a Lambda whose Valkey is down
//! still starts (and fails open or closed per request) instead of
//! crash-looping, and reconnects by itself once Valkey is back.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::sync::OnceCell;

use crate::config::ConfigError;

/// A cheap, cloneable handle on the quota Valkey.
#[derive(Clone)]
pub struct Valkey {
    inner: std::sync::Arc<Inner>,
}

enum Inner {
    Standalone(ConnectionManager),
    Cluster {
        client: Box<ClusterClient>,
        connection: OnceCell<ClusterConnection>,
    },
}

/// One connection, standalone or cluster, usable with any redis command.
#[derive(Clone)]
pub enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Valkey {
    /// Prepares a connection to `url` without connecting. `timeout` bounds
    /// each connection attempt and each response.
    pub fn new(url: &str, cluster: bool, timeout: Duration) -> Result<Self, ConfigError> {
        let bad = |e: redis::RedisError| ConfigError::new("VALKEY_URL", e.to_string());
        let inner = if cluster {
            let client = ClusterClient::builder([url])
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(1)
                .build()
                .map_err(bad)?;
            Inner::Cluster {
                client: Box::new(client),
                connection: OnceCell::new(),
            }
        } else {
            let client = redis::Client::open(url).map_err(bad)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1);
            Inner::Standalone(ConnectionManager::new_lazy_with_config(client, config).map_err(bad)?)
        };
        Ok(Self {
            inner: std::sync::Arc::new(inner),
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(*self.inner, Inner::Cluster { .. })
    }

    /// A connection, established on first use. A failed attempt is retried
    /// on the next call.
    pub async fn connection(&self) -> RedisResult<Connection> {
        match &*self.inner {
            Inner::Standalone(manager) => Ok(Connection::Standalone(manager.clone())),
            Inner::Cluster { client, connection } => {
                let c = connection
                    .get_or_try_init(|| client.get_async_connection())
                    .await?;
                Ok(Connection::Cluster(c.clone()))
            }
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Standalone(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Standalone(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Standalone(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
