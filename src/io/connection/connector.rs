//! The connector: one live connection per handle, kept up in the background.
//!
//! [`Valkey`] is the handle; its connector task ([`keep_connected`]),
//! started by [`Valkey::warm_up`] (or by the first command), connects,
//! publishes the connection with its generation, and reconnects whenever a
//! sender reports it broken ([`Link::broken`]) or a caller waits for one.
//! Waiting for the connection and sending on it is `send.rs`; building a
//! handle from a URL or the configuration is `setup.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionInfo, ErrorKind, Pipeline, RedisError, RedisFuture,
    RedisResult, TlsCertificates, Value,
};
use tokio::runtime::RuntimeFlavor;
use tokio::sync::{Notify, watch};
use tokio::time::timeout;

use super::iam::IamSigner;
use crate::config::IamConfig;

/// The least time a connection attempt is given, whatever the store
/// timeout: a TLS handshake to a cluster can outlast 100 ms, and an attempt
/// runs in the background, not on a request's clock.
pub(super) const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits between failed connection attempts: doubling from the first to the
/// second, and cut short whenever a request needs the connection.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(2);

/// Waits after a sign-in that failed (a token refused, or none signed),
/// doubling, and not cut short by a waiting request: a retry at once would
/// be refused again until the credentials, the user or its permission
/// change, and every request of a flood would send one.
const AUTH_RETRY_FIRST: Duration = Duration::from_secs(1);
const AUTH_RETRY_MOST: Duration = Duration::from_secs(30);

/// A cheap, cloneable handle on the quota Valkey.
#[derive(Clone)]
pub struct Valkey {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    kind: Kind,
    /// The URL's connection settings (credentials, TLS, database), reused
    /// for the per-primary connections a cluster purge opens (`ops::nodes`).
    info: ConnectionInfo,
    tls: Option<TlsCertificates>,
    /// ElastiCache IAM authentication, when `VALKEY_AUTH=iam`.
    iam: Option<IamSigner>,
    pub(super) timeout: Duration,
    pub(super) link: Arc<Link>,
    /// Held so the connector sees a reader until the last handle is gone.
    _watching: watch::Receiver<Option<Live>>,
    /// Whether the connector task runs (it starts on first use, in the
    /// runtime of the caller, so each `serve` worker's connection is driven
    /// by that worker's own runtime).
    started: AtomicBool,
}

#[derive(Clone)]
pub(super) enum Kind {
    /// One multiplexed connection, shared by every request of the process or
    /// worker (several used in turn measured worse: fewer commands share
    /// each socket read and write, see docs/benchmarks.md).
    Standalone(Box<redis::Client>),
    Cluster(Arc<ClusterClient>),
}

/// The live connection, as the connector task keeps it.
pub(super) struct Link {
    pub(super) current: watch::Sender<Option<Live>>,
    /// Wakes the connector: the connection broke, or a request is waiting
    /// for one (so a retry is not held back by the backoff).
    pub(super) wake: Notify,
    /// Why the last connection attempt failed, for the errors callers see.
    last_error: std::sync::Mutex<Option<String>>,
}

/// One established connection and its generation (so a failure reported
/// on an old connection does not drop its replacement).
#[derive(Clone)]
pub(super) struct Live {
    pub(super) generation: u64,
    pub(super) connection: Connection,
    /// The thread that drives a standalone connection's task, when that is
    /// a single-threaded runtime's (every `serve` worker, Lambda): see
    /// `send.rs`.
    pub(super) driver: Option<ThreadId>,
}

/// One connection, standalone or cluster, usable with any redis command.
#[derive(Clone)]
pub enum Connection {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// This thread, when it runs a single-threaded runtime.
pub(super) fn single_thread() -> Option<ThreadId> {
    let flavor = tokio::runtime::Handle::try_current().ok()?.runtime_flavor();
    (flavor == RuntimeFlavor::CurrentThread).then(|| std::thread::current().id())
}

impl Valkey {
    /// A handle on `kind`, not connected yet: its connector starts on
    /// first use.
    pub(super) fn assemble(
        kind: Kind,
        info: ConnectionInfo,
        tls: Option<TlsCertificates>,
        iam: Option<IamSigner>,
        timeout: Duration,
    ) -> Self {
        let (current, watching) = watch::channel(None);
        Self {
            inner: Arc::new(Inner {
                kind,
                info,
                tls,
                iam,
                timeout,
                link: Arc::new(Link {
                    current,
                    wake: Notify::new(),
                    last_error: std::sync::Mutex::new(None),
                }),
                _watching: watching,
                started: AtomicBool::new(false),
            }),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.kind, Kind::Cluster(_))
    }

    /// Starts connecting in the background now, on the current Tokio
    /// runtime, and keeps the connection up from then on (reconnecting with
    /// a short backoff whenever it breaks). Called at start, so the first
    /// request finds a connection; otherwise the first use starts it.
    pub fn warm_up(&self) {
        // A load first: every command calls this, and a swap would write
        // the shared flag each time.
        if self.inner.started.load(Ordering::Acquire)
            || self.inner.started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let (kind, link) = (self.inner.kind.clone(), self.inner.link.clone());
        let connect_timeout = self.inner.timeout.max(MIN_CONNECT_TIMEOUT);
        let iam = self.inner.iam.clone();
        tokio::spawn(keep_connected(kind, link, connect_timeout, iam));
    }

    /// The URL's connection settings (credentials, TLS, database).
    pub(crate) fn info(&self) -> &ConnectionInfo {
        &self.inner.info
    }

    /// Extra TLS trust (`VALKEY_TLS_CA`), if any.
    pub(crate) fn tls(&self) -> Option<&TlsCertificates> {
        self.inner.tls.as_ref()
    }

    /// `config` signing in as this handle's connections do: with a fresh
    /// IAM token (and renewing it) when `VALKEY_AUTH=iam`, else unchanged
    /// (the URL's credentials are in [`Self::info`]).
    pub(crate) fn signed_in(&self, config: AsyncConnectionConfig) -> AsyncConnectionConfig {
        match &self.inner.iam {
            Some(signer) => config.set_credentials_provider(signer.clone()),
            None => config,
        }
    }

    /// The bound on each command of the request path.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

impl Link {
    pub(super) fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    fn set_last_error(&self, error: Option<String>) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = error;
        }
    }

    /// Drops the connection of `generation`, if it is still the current one,
    /// and wakes the connector.
    pub(super) fn broken(&self, generation: u64) {
        self.current.send_if_modified(|current| {
            let stale = current.as_ref().is_some_and(|l| l.generation == generation);
            if stale {
                *current = None;
            }
            stale
        });
        self.wake.notify_one();
    }
}

impl Kind {
    async fn connect(
        &self,
        connect_timeout: Duration,
        iam: Option<&IamSigner>,
    ) -> RedisResult<Connection> {
        match self {
            Self::Standalone(client) => {
                // No response timeout on the connection itself: callers bound
                // their own wait, and a command they gave up on is still
                // awaited (`Valkey::send`), never cut off.
                let mut config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(None);
                if let Some(signer) = iam {
                    config = config.set_credentials_provider(signer.clone());
                }
                let c = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Connection::Standalone(c))
            }
            Self::Cluster(client) => Ok(Connection::Cluster(client.get_async_connection().await?)),
        }
    }
}

/// The connector: connects, and reconnects whenever the connection breaks,
/// until every handle on the Valkey is gone.
async fn keep_connected(
    kind: Kind,
    link: Arc<Link>,
    connect_timeout: Duration,
    iam: Option<IamSigner>,
) {
    let mut generation = 0;
    let mut backoff = RETRY_FIRST;
    loop {
        if link.current.is_closed() {
            return;
        }
        if link.current.borrow().is_none() {
            let attempt = kind.connect(connect_timeout, iam.as_ref());
            match timeout(connect_timeout, attempt).await {
                Ok(Ok(connection)) => {
                    generation += 1;
                    link.publish(generation, connection);
                    backoff = RETRY_FIRST;
                }
                Ok(Err(e)) if iam.is_some() && e.kind() == ErrorKind::AuthenticationFailed => {
                    link.sign_in_failed(&e, iam.as_ref().map(IamSigner::iam));
                    backoff = backoff.max(AUTH_RETRY_FIRST);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(AUTH_RETRY_MOST);
                    continue;
                }
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_owned(),
                    };
                    tracing::debug!(error = %why, "cannot connect to Valkey; retrying");
                    link.set_last_error(Some(why));
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = link.wake.notified() => {}
                    }
                    backoff = (backoff * 2).min(RETRY_MOST);
                    continue;
                }
            }
        }
        tokio::select! {
            () = link.wake.notified() => {}
            () = link.current.closed() => return,
        }
    }
}

impl Link {
    /// Makes `connection` the live one.
    fn publish(&self, generation: u64, connection: Connection) {
        let driver = matches!(connection, Connection::Standalone(_))
            .then(single_thread)
            .flatten();
        self.current.send_replace(Some(Live {
            generation,
            connection,
            driver,
        }));
        self.set_last_error(None);
    }

    /// An IAM sign-in failed: the reason, naming the user and the cache,
    /// becomes what waiting callers see, and is one error line (again only
    /// when the reason changes).
    fn sign_in_failed(&self, e: &RedisError, iam: Option<&IamConfig>) {
        let (user, cache) = iam.map_or(("", ""), |i| (i.user.as_str(), i.cache.as_str()));
        let reason = match e.detail() {
            // A token that could not be signed: the AWS side's reason.
            Some(_) => e.to_string(),
            None => format!(
                "the server refused the token (WRONGPASS: a token signed wrong or too long ago, a user \
                 that is not IAM-enabled or not in the cache's user group, or a role without \
                 elasticache:Connect on the cache and the user; {e})"
            ),
        };
        let why = format!("ElastiCache IAM sign-in as {user} to {cache} failed: {reason}");
        if self.last_error().as_deref() != Some(why.as_str()) {
            tracing::error!(user, cache, error = %reason, "ElastiCache IAM sign-in failed; the quota store is unreachable");
        }
        self.set_last_error(Some(why));
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
