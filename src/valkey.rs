//! The connection to the quota Valkey, standalone or cluster, plain or TLS.
//!
//! Built once per cold start and shared by the quota store and the stream
//! queue. Nothing connects at construction: a Lambda whose Valkey is down
//! still starts (and fails open or closed per request) instead of
//! crash-looping, and reconnects by itself once Valkey is back.
//!
//! TLS (`rediss://`, as ElastiCache Serverless always requires) is rustls
//! with the aws-lc-rs provider, installed here as the process default so no
//! rustls user in the process panics for want of one. Servers are verified
//! against the platform's roots (ElastiCache certificates chain to Amazon's
//! public roots), or only against `VALKEY_TLS_CA` when set. There is no
//! switch to skip verification.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionInfo, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, TlsCertificates, Value,
};
use tokio::sync::OnceCell;

use crate::config::{Config, ConfigError};

/// A cheap, cloneable handle on the quota Valkey.
#[derive(Clone)]
pub struct Valkey {
    inner: Arc<Inner>,
}

struct Inner {
    kind: Kind,
    /// The URL's connection settings (credentials, TLS, database), reused
    /// for the per-primary connections a cluster purge opens (`ops::nodes`).
    info: ConnectionInfo,
    tls: Option<TlsCertificates>,
    timeout: Duration,
}

enum Kind {
    /// One multiplexed connection, shared by every request (several used in
    /// turn measured worse: fewer commands share each socket read and write,
    /// see docs/benchmarks.md).
    Standalone(ConnectionManager),
    Cluster {
        client: Arc<ClusterClient>,
        connection: Arc<OnceCell<ClusterConnection>>,
    },
}

/// One connection, standalone or cluster, usable with any redis command.
#[derive(Clone)]
pub enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Makes aws-lc-rs the process-wide rustls provider, once. rustls refuses to
/// pick one itself when more than one is compiled in (the AWS SDK brings its
/// own rustls), and would panic at the first TLS handshake.
pub fn install_crypto_provider() {
    // Err means a provider is installed already, which is all we need.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

impl Valkey {
    /// Prepares a connection to `url` without connecting, trusting the
    /// platform's roots for `rediss://`. `timeout` bounds each connection
    /// attempt and each response.
    pub fn new(url: &str, cluster: bool, timeout: Duration) -> Result<Self, ConfigError> {
        Self::with_tls_ca(url, cluster, timeout, None)
    }

    /// The Valkey named by `config` (`VALKEY_URL`, `VALKEY_CLUSTER`,
    /// `VALKEY_TLS_CA`, `QUOTA_STORE_TIMEOUT_MS`); `None` when no URL is set.
    pub fn from_config(config: &Config) -> Result<Option<Self>, ConfigError> {
        config
            .store
            .valkey
            .as_ref()
            .map(|v| {
                Self::with_tls_ca(
                    &v.url,
                    v.cluster,
                    config.store.timeout,
                    v.tls_ca.as_ref().map(|ca| ca.pem.as_slice()),
                )
            })
            .transpose()
    }

    /// Like [`new`](Self::new), but a `rediss://` server must chain to one of
    /// the PEM certificates in `ca` (and only to those).
    pub fn with_tls_ca(
        url: &str,
        cluster: bool,
        timeout: Duration,
        ca: Option<&[u8]>,
    ) -> Result<Self, ConfigError> {
        let bad = |e: RedisError| ConfigError::new("VALKEY_URL", e.to_string());
        if crate::config::is_tls_url(url) {
            install_crypto_provider();
        }
        let tls = ca.map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        });
        let bad_ca = |e: RedisError| ConfigError::new("VALKEY_TLS_CA", e.to_string());
        let info = url.into_connection_info().map_err(bad)?;
        let kind = if cluster {
            let mut builder = ClusterClient::builder([info.clone()])
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .retries(1);
            if let Some(certs) = &tls {
                builder = builder.certs(certs.clone());
            }
            let client = builder
                .build()
                .map_err(if tls.is_some() { bad_ca } else { bad })?;
            Kind::Cluster {
                client: Arc::new(client),
                connection: Arc::new(OnceCell::new()),
            }
        } else {
            let client = client_for(info.clone(), tls.as_ref()).map_err(if tls.is_some() {
                bad_ca
            } else {
                bad
            })?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(1);
            Kind::Standalone(ConnectionManager::new_lazy_with_config(client, config).map_err(bad)?)
        };
        Ok(Self {
            inner: Arc::new(Inner {
                kind,
                info,
                tls,
                timeout,
            }),
        })
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.kind, Kind::Cluster { .. })
    }

    /// A connection, established on first use. A failed attempt is retried
    /// on the next call.
    pub async fn connection(&self) -> RedisResult<Connection> {
        match &self.inner.kind {
            Kind::Standalone(manager) => Ok(Connection::Standalone(manager.clone())),
            Kind::Cluster { client, connection } => {
                if let Some(c) = connection.get() {
                    return Ok(Connection::Cluster(c.clone()));
                }
                // Connecting to a cluster (topology, then every node, each
                // with a TLS handshake) can outlast one request's timeout. In
                // a task of its own it survives the caller giving up, so the
                // next request finds it connected instead of starting over.
                let (client, cell) = (client.clone(), connection.clone());
                let connect = tokio::spawn(async move {
                    cell.get_or_try_init(|| client.get_async_connection())
                        .await
                        .cloned()
                });
                let c = connect.await.map_err(|e| {
                    RedisError::from((ErrorKind::Client, "cluster connect task", e.to_string()))
                })??;
                Ok(Connection::Cluster(c))
            }
        }
    }

    /// The URL's connection settings (credentials, TLS, database).
    pub(crate) fn info(&self) -> &ConnectionInfo {
        &self.inner.info
    }

    /// Extra TLS trust (`VALKEY_TLS_CA`), if any.
    pub(crate) fn tls(&self) -> Option<&TlsCertificates> {
        self.inner.tls.as_ref()
    }

    /// The bound on each connection attempt and response.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

pub(crate) fn client_for(
    info: ConnectionInfo,
    tls: Option<&TlsCertificates>,
) -> RedisResult<redis::Client> {
    match tls {
        Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
        None => redis::Client::open(info),
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
