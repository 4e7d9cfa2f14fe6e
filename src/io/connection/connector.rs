//! The [`Valkey`] handle and its connector task ([`keep_connected`]): it connects, publishes the
//! connection with its generation, and reconnects whenever a sender reports it broken
//! ([`Link::broken`]) or a caller waits for one.

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

/// The least time a connection attempt gets: a TLS handshake can outlast the store timeout, and
/// an attempt runs in the background, not on a request's clock.
pub(super) const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Backoff between failed connection attempts, doubling; cut short when a request waits.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(2);

/// Backoff after a failed sign-in, not cut short by waiting requests: a retry would be refused
/// until the credentials, user or permission change, and every request of a flood would send one.
const AUTH_RETRY_FIRST: Duration = Duration::from_secs(1);
const AUTH_RETRY_MOST: Duration = Duration::from_secs(30);

/// A cheap, cloneable handle on the quota Valkey.
#[derive(Clone)]
pub struct Valkey {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    kind: Kind,
    /// The URL's settings, reused for the per-primary connections of a cluster purge.
    info: ConnectionInfo,
    tls: Option<TlsCertificates>,
    iam: Option<IamSigner>,
    pub(super) timeout: Duration,
    pub(super) link: Arc<Link>,
    /// Held so the connector sees a reader until the last handle is gone.
    _watching: watch::Receiver<Option<Live>>,
    /// Whether the connector runs; started in the caller's runtime, as each `serve` worker's own.
    started: AtomicBool,
}

#[derive(Clone)]
pub(super) enum Kind {
    /// One multiplexed connection for the process or worker, so commands share socket I/O.
    Standalone(Box<redis::Client>),
    Cluster(Arc<ClusterClient>),
}

/// The live connection, as the connector task keeps it.
#[derive(Default)]
pub(super) struct Link {
    pub(super) current: watch::Sender<Option<Live>>,
    /// Wakes the connector: the connection broke, or a request waits (skipping the backoff).
    pub(super) wake: Notify,
    /// Why the last connection attempt failed, for the errors callers see.
    last_error: std::sync::Mutex<Option<String>>,
}

/// An established connection; its generation keeps a stale failure from dropping a replacement.
#[derive(Clone)]
pub(super) struct Live {
    pub(super) generation: u64,
    pub(super) connection: Connection,
    /// The thread driving a standalone connection's task on a single-threaded runtime (`send.rs`).
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
    /// A handle on `kind`, not connected yet: its connector starts on first use.
    pub(super) fn assemble(
        kind: Kind,
        info: ConnectionInfo,
        tls: Option<TlsCertificates>,
        iam: Option<IamSigner>,
        timeout: Duration,
    ) -> Self {
        let link = Arc::new(Link::default());
        Self {
            inner: Arc::new(Inner {
                kind,
                info,
                tls,
                iam,
                timeout,
                _watching: link.current.subscribe(),
                link,
                started: AtomicBool::default(),
            }),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.kind, Kind::Cluster(_))
    }

    /// Starts the connector on the current runtime, so the first request finds a connection.
    pub fn warm_up(&self) {
        // A load first: every command calls this, and a swap would write the shared flag.
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

    /// `config` signing in as this handle's connections do: with renewed IAM tokens when
    /// `VALKEY_AUTH=iam`, else unchanged (the URL's credentials are in [`Self::info`]).
    pub(crate) fn signed_in(&self, config: AsyncConnectionConfig) -> AsyncConnectionConfig {
        signed_in(config, self.inner.iam.as_ref())
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

    /// Drops the connection of `generation` if it is still current, and wakes the connector.
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

    /// An IAM sign-in failed: waiting callers see why; logged once per distinct reason.
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

/// `config` signing in with `iam`'s renewed tokens, if any.
fn signed_in(config: AsyncConnectionConfig, iam: Option<&IamSigner>) -> AsyncConnectionConfig {
    match iam {
        Some(signer) => config.set_credentials_provider(signer.clone()),
        None => config,
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
                // No response timeout: callers bound their own wait, and a command they gave
                // up on is still awaited, never cut off.
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(None);
                let config = signed_in(config, iam);
                let c = client.get_multiplexed_async_connection_with_config(&config);
                Ok(Connection::Standalone(c.await?))
            }
            Self::Cluster(client) => Ok(Connection::Cluster(client.get_async_connection().await?)),
        }
    }
}

/// The connector: connects, and reconnects whenever the connection breaks, until every handle
/// is gone.
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
