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
    AsyncConnectionConfig, Cmd, ConnectionInfo, Pipeline, RedisFuture, RedisResult,
    TlsCertificates, Value,
};
use tokio::runtime::RuntimeFlavor;
use tokio::sync::{Notify, watch};
use tokio::time::timeout;

/// The least time a connection attempt is given, whatever the store
/// timeout: a TLS handshake to a cluster can outlast 100 ms, and an attempt
/// runs in the background, not on a request's clock.
pub(super) const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits between failed connection attempts: doubling from the first to the
/// second, and cut short whenever a request needs the connection.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(2);

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
        timeout: Duration,
    ) -> Self {
        let (current, watching) = watch::channel(None);
        Self {
            inner: Arc::new(Inner {
                kind,
                info,
                tls,
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
        tokio::spawn(keep_connected(kind, link, connect_timeout));
    }

    /// The URL's connection settings (credentials, TLS, database).
    pub(crate) fn info(&self) -> &ConnectionInfo {
        &self.inner.info
    }

    /// Extra TLS trust (`VALKEY_TLS_CA`), if any.
    pub(crate) fn tls(&self) -> Option<&TlsCertificates> {
        self.inner.tls.as_ref()
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
    async fn connect(&self, connect_timeout: Duration) -> RedisResult<Connection> {
        match self {
            Self::Standalone(client) => {
                // No response timeout on the connection itself: callers bound
                // their own wait, and a command they gave up on is still
                // awaited (`Valkey::send`), never cut off.
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(None);
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
async fn keep_connected(kind: Kind, link: Arc<Link>, connect_timeout: Duration) {
    let mut generation = 0;
    let mut backoff = RETRY_FIRST;
    loop {
        if link.current.is_closed() {
            return;
        }
        if link.current.borrow().is_none() {
            match timeout(connect_timeout, kind.connect(connect_timeout)).await {
                Ok(Ok(connection)) => {
                    generation += 1;
                    let driver = matches!(connection, Connection::Standalone(_))
                        .then(single_thread)
                        .flatten();
                    link.current.send_replace(Some(Live {
                        generation,
                        connection,
                        driver,
                    }));
                    backoff = RETRY_FIRST;
                    link.set_last_error(None);
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
