//! The connection to the quota Valkey, standalone or cluster, plain or TLS.
//!
//! Built once per cold start (or per `serve` worker) and shared by the quota
//! store and the stream queue. Construction connects nothing, so a Lambda
//! whose Valkey is down still starts (and fails open or closed per request)
//! instead of crash-looping. A connector task, started at start-up by
//! [`Valkey::warm_up`] (or by the first command), connects in the background
//! and reconnects whenever the connection breaks.
//!
//! **Know what was sent.** [`Valkey::send`] says how a command failed
//! ([`SendError`]): never sent (no live connection within the caller's
//! timeout, a failed connect: it did not happen), sent and unanswered (it
//! may still run), or refused by the server. A command never waits on an
//! old connection attempt's error: a caller that finds no live connection
//! waits for the connector's next attempt, within its own timeout, and
//! wakes it from its backoff. A caller that times out does not cancel what
//! it sent: the command stays in flight in a task of its own. Nor does
//! the cluster client re-send one (no retries): a command is sent once or
//! not at all, so "unanswered" is the only case in which it may land.
//!
//! Scripts go as one `EVAL` each ([`eval`]).
//!
//! TLS (`rediss://`, as ElastiCache Serverless always requires) is rustls
//! with the aws-lc-rs provider, installed here as the process default so no
//! rustls user in the process panics for want of one. Servers are verified
//! against the platform's roots (ElastiCache certificates chain to Amazon's
//! public roots), or only against `VALKEY_TLS_CA` when set. There is no
//! switch to skip verification.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionInfo, FromRedisValue, IntoConnectionInfo, Pipeline,
    RedisError, RedisFuture, RedisResult, TlsCertificates, Value,
};
use tokio::runtime::RuntimeFlavor;
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, timeout, timeout_at};

use crate::config::{Config, ConfigError};

/// The least time a connection attempt is given, whatever the store
/// timeout: a TLS handshake to a cluster can outlast 100 ms, and an attempt
/// runs in the background, not on a request's clock.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Waits between failed connection attempts: doubling from the first to the
/// second, and cut short whenever a request needs the connection.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(2);

/// The cluster client re-sends nothing. Its retries would re-send a command
/// whose connection broke after it was written (an `INCR` counted twice, a
/// refund taken twice), which [`Valkey::send`] reports as unanswered instead.
/// The price: a command refused with `MOVED`/`ASK`, `TRYAGAIN` or
/// `CLUSTERDOWN` (during a slot migration or a failover; it did not run) is
/// not redirected but refused, and the client refreshes its slot map for
/// the next command.
const CLUSTER_RETRIES: u32 = 0;

/// How long a command the caller stopped waiting for is still awaited in the
/// background (see [`Valkey::send`]); after that its answer is dropped.
const DETACHED_WAIT: Duration = Duration::from_secs(300);

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
    link: Arc<Link>,
    /// Held so the connector sees a reader until the last handle is gone.
    _watching: watch::Receiver<Option<Live>>,
    /// Whether the connector task runs (it starts on first use, in the
    /// runtime of the caller, so each `serve` worker's connection is driven
    /// by that worker's own runtime).
    started: AtomicBool,
}

#[derive(Clone)]
enum Kind {
    /// One multiplexed connection, shared by every request of the process or
    /// worker (several used in turn measured worse: fewer commands share
    /// each socket read and write, see docs/benchmarks.md).
    Standalone(Box<redis::Client>),
    Cluster(Arc<ClusterClient>),
}

/// The live connection, as the connector task keeps it.
struct Link {
    current: watch::Sender<Option<Live>>,
    /// Wakes the connector: the connection broke, or a request is waiting
    /// for one (so a retry is not held back by the backoff).
    wake: Notify,
    /// Why the last connection attempt failed, for the errors callers see.
    last_error: std::sync::Mutex<Option<String>>,
}

/// One established connection and its generation (so a failure reported
/// on an old connection does not drop its replacement).
#[derive(Clone)]
struct Live {
    generation: u64,
    connection: Connection,
    /// The thread that drives a standalone connection's task, when that is
    /// a single-threaded runtime's (every `serve` worker, Lambda): see
    /// [`refused_unsent`].
    driver: Option<ThreadId>,
}

/// One connection, standalone or cluster, usable with any redis command.
#[derive(Clone)]
pub enum Connection {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// Why a command got no answer: the distinction every recovery rule rests
/// on. Only a command that left the process can still run.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SendError {
    /// Never written: no connection within the timeout, or a connection
    /// attempt failed. The command did not happen and never will.
    #[error("not sent: {0}")]
    NotSent(String),
    /// Written, then no answer in time (or the connection broke before the
    /// answer): the command may still run when the server wakes up.
    #[error("sent, no answer in time")]
    Unanswered,
    /// The server answered with an error (or an answer of the wrong shape):
    /// the command ran, or was refused, and that is final.
    #[error("{0}")]
    Refused(String),
}

/// `<name>` as a command with room for `args` arguments of `bytes` bytes in
/// all (the name included), so building it grows no buffer: a command made
/// with [`redis::cmd`] starts empty and doubles its way up (a key of some 80
/// bytes took five allocations, a job ten).
pub fn sized_cmd(name: &str, args: usize, bytes: usize) -> redis::Cmd {
    let mut cmd = redis::Cmd::with_capacity(args, bytes);
    cmd.arg(name);
    cmd
}

/// `EVAL <script> <keys>`: the whole script in one command, which Valkey
/// compiles once and caches. Not `EVALSHA` with a fallback to `EVAL` on
/// `NOSCRIPT`: that is two commands, and a caller that times out after the
/// first never sends the second. A late claim would then never land while
/// the refund sent after it would, taking back a count that was never made.
/// One command each keeps "sent" meaning "will run, in order".
pub fn eval(script: &str, keys: &[&str]) -> redis::Cmd {
    // Room for the keys and for some 200 bytes of arguments after them.
    let bytes = script.len() + keys.iter().map(|k| k.len()).sum::<usize>() + 256;
    let mut cmd = sized_cmd("EVAL", keys.len() + 10, bytes);
    cmd.arg(script).arg(keys.len()).arg(keys);
    cmd
}

/// The quoted words of a Lua script (`'job'`, `'SET'`), comments skipped:
/// what the tests compare with the names Rust defines once.
#[cfg(test)]
pub(crate) fn quoted_words(script: &str) -> Vec<&str> {
    script
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .flat_map(|l| l.split('\'').skip(1).step_by(2))
        .collect()
}

/// What a command that found no connection gets: it was never written, so
/// it did not happen. The simulator's store reports its own failed connects
/// through this one definition.
pub fn not_connected(why: String) -> SendError {
    if crate::bugs::on(crate::bugs::Bug::ConnectErrorAsUnanswered) {
        return SendError::Unanswered;
    }
    SendError::NotSent(why)
}

/// Whether `e` says the connection itself failed (not the command).
fn is_connection_error(e: &RedisError) -> bool {
    e.is_unrecoverable_error() || e.is_io_error() || e.is_timeout()
}

/// This thread, when it runs a single-threaded runtime.
fn single_thread() -> Option<ThreadId> {
    let flavor = tokio::runtime::Handle::try_current().ok()?.runtime_flavor();
    (flavor == RuntimeFlavor::CurrentThread).then(|| std::thread::current().id())
}

/// Whether a connection error at the first poll of a command proves that it
/// was never written. redis-rs hands a command to the connection's task
/// through a channel, and refuses it there once that task has ended. On the
/// one thread that also drives that task, nothing else runs between the
/// hand-over and the poll, so the refusal is the only way to fail at once.
/// Elsewhere (a multi-threaded runtime, the cluster client's own tasks) the
/// task could write the command and fail meanwhile: it may have run.
fn refused_unsent(driver: Option<ThreadId>) -> bool {
    driver.is_some() && driver == single_thread()
}

/// `request` sent on `connection`, boxed so that a caller who stops waiting
/// can leave it to finish in a task of its own. It yields the answer, the
/// request back, and whether the answer came at the first poll (the
/// connection's task had ended and never took it: [`Valkey::send`]).
fn handed_over(
    request: Request,
    mut connection: Connection,
) -> Pin<Box<impl Future<Output = (RedisResult<Value>, Request, bool)> + Send>> {
    Box::pin(async move {
        let (answer, first_poll) = {
            let mut send = std::pin::pin!(request.send(&mut connection));
            let mut polls = 0u32;
            let answer = std::future::poll_fn(|cx| {
                polls += 1;
                send.as_mut().poll(cx)
            })
            .await;
            (answer, polls == 1)
        };
        (answer, request, first_poll)
    })
}

/// A command or a pipeline, owned, so that it can outlive its caller.
pub enum Request {
    Cmd(Cmd),
    Pipe(Pipeline),
}

impl From<Cmd> for Request {
    fn from(c: Cmd) -> Self {
        Self::Cmd(c)
    }
}

impl From<Pipeline> for Request {
    fn from(p: Pipeline) -> Self {
        Self::Pipe(p)
    }
}

impl Request {
    async fn send(&self, conn: &mut Connection) -> RedisResult<Value> {
        // `query_async` leaves out the answers of `ignore()`d commands.
        match self {
            Self::Cmd(c) => c.query_async(conn).await,
            Self::Pipe(p) => p.query_async(conn).await,
        }
    }
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
    /// platform's roots for `rediss://`. `timeout` bounds each command the
    /// request path sends.
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
        if crate::config::is_tls_url(url) {
            install_crypto_provider();
        }
        let tls = ca.map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        });
        let (var, info) = match url.into_connection_info() {
            Ok(info) => ("VALKEY_TLS_CA", info),
            Err(e) => return Err(ConfigError::new("VALKEY_URL", e.to_string())),
        };
        // A bad CA surfaces when the client is built; name the right variable.
        let bad = |e: RedisError| {
            ConfigError::new(
                if tls.is_some() { var } else { "VALKEY_URL" },
                e.to_string(),
            )
        };
        let connect_timeout = timeout.max(MIN_CONNECT_TIMEOUT);
        let kind = if cluster {
            let mut builder = ClusterClient::builder([info.clone()])
                .connection_timeout(connect_timeout)
                .response_timeout(DETACHED_WAIT)
                .retries(CLUSTER_RETRIES);
            if let Some(certs) = &tls {
                builder = builder.certs(certs.clone());
            }
            Kind::Cluster(Arc::new(builder.build().map_err(bad)?))
        } else {
            Kind::Standalone(Box::new(
                client_for(info.clone(), tls.as_ref()).map_err(bad)?,
            ))
        };
        let (current, watching) = watch::channel(None);
        Ok(Self {
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
        })
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

    /// The live connection, waiting for one at most until `deadline`.
    async fn live(&self, deadline: Instant) -> Result<Live, SendError> {
        self.warm_up();
        let link = &self.inner.link;
        // The usual case, a connection is up: no subscription, no timer.
        if let Some(live) = link.current.borrow().as_ref() {
            return Ok(live.clone());
        }
        let mut current = link.current.subscribe();
        if current.borrow().is_none() {
            // Cut the connector's backoff short: someone is waiting.
            link.wake.notify_one();
        }
        match timeout_at(deadline, current.wait_for(Option::is_some)).await {
            Ok(Ok(live)) => live
                .as_ref()
                .cloned()
                .ok_or_else(|| SendError::NotSent("no connection".into())),
            _ => Err(not_connected(match link.last_error() {
                Some(e) => format!("no connection to Valkey within the timeout ({e})"),
                None => "no connection to Valkey within the timeout".into(),
            })),
        }
    }

    /// Waits at most `within` for a live connection, so that a command sent
    /// right after has its whole timeout for its answer. (A blocking read
    /// whose wait for a reconnect ate its time would be given up while it
    /// may still hand out entries.)
    pub async fn connected(&self, within: Duration) -> Result<(), SendError> {
        self.live(Instant::now() + within).await.map(|_| ())
    }

    /// A connection for commands outside the request path (operator tools,
    /// tests), waiting for it at most the store timeout.
    pub async fn connection(&self) -> RedisResult<Connection> {
        let wait = self.inner.timeout.max(MIN_CONNECT_TIMEOUT);
        self.live(Instant::now() + wait)
            .await
            .map(|live| live.connection)
            .map_err(|e| RedisError::from((redis::ErrorKind::Io, "Valkey", e.to_string())))
    }

    /// Sends `request` and waits for its answer at most `within`, saying
    /// which of the three ways it failed ([`SendError`]).
    ///
    /// A caller that stops waiting does not cancel a command it sent: the
    /// command stays in flight, awaited in a task of its own, so it is
    /// written even if the socket was busy, and commands sent after it on
    /// this connection (a refund after a count) run after it.
    ///
    /// A connection the server closed while it was idle (a restart, a
    /// failover, an idle timeout) is found out by the first command given to
    /// it, which it refuses before writing a byte ([`refused_unsent`]). That
    /// command is sent again on the next connection, within the same
    /// deadline; were that one closed too, it was never sent.
    pub async fn send<T: FromRedisValue>(
        &self,
        request: impl Into<Request>,
        within: Duration,
    ) -> Result<T, SendError> {
        let deadline = Instant::now() + within;
        let mut request = request.into();
        let mut resent = false;
        loop {
            let Live {
                generation,
                connection,
                driver,
            } = self.live(deadline).await?;
            let mut call = handed_over(request, connection);
            let answer = match timeout_at(deadline, &mut call).await {
                // The connection's task had ended (it saw the server close
                // the socket) and refused the command: not sent.
                Ok((Err(e), back, true)) if is_connection_error(&e) && refused_unsent(driver) => {
                    self.inner.link.broken(generation);
                    if resent {
                        return Err(not_connected(format!(
                            "the connection to Valkey had closed ({e})"
                        )));
                    }
                    (request, resent) = (back, true);
                    continue;
                }
                Ok((answer, _, _)) => answer,
                Err(_) => {
                    tokio::spawn(async move {
                        let _ = timeout(DETACHED_WAIT, call).await;
                    });
                    return Err(SendError::Unanswered);
                }
            };
            return match answer {
                Ok(value) => {
                    T::from_redis_value(value).map_err(|e| SendError::Refused(e.to_string()))
                }
                Err(e) if is_connection_error(&e) => {
                    // The connection broke with the command on it: it may
                    // have run. The next command waits for a fresh connection.
                    self.inner.link.broken(generation);
                    tracing::debug!(error = %e, "Valkey connection lost");
                    Err(SendError::Unanswered)
                }
                Err(e) => Err(SendError::Refused(e.to_string())),
            };
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

    /// The bound on each command of the request path.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

impl Link {
    fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    fn set_last_error(&self, error: Option<String>) {
        if let Ok(mut last) = self.last_error.lock() {
            *last = error;
        }
    }

    /// Drops the connection of `generation`, if it is still the current one,
    /// and wakes the connector.
    fn broken(&self, generation: u64) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal at the first poll proves a command unsent only on the one
    /// thread that drives the connection's task in a single-threaded runtime.
    #[test]
    fn first_poll_proof_needs_the_driving_thread() {
        let one = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let here = one.block_on(async { single_thread() });
        assert_eq!(here, Some(std::thread::current().id()));
        one.block_on(async {
            assert!(refused_unsent(here));
            assert!(!refused_unsent(None), "a cluster or multi-threaded driver");
            let other = std::thread::spawn(|| std::thread::current().id())
                .join()
                .unwrap();
            assert!(!refused_unsent(Some(other)), "driven by another thread");
        });
        let many = tokio::runtime::Builder::new_multi_thread().build().unwrap();
        assert_eq!(many.block_on(async { single_thread() }), None);
        assert!(!many.block_on(async { refused_unsent(here) }));
    }
}
