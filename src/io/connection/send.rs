//! Sending a command, and knowing whether it was sent ([`SendError`]).

use std::future::Future;
use std::pin::Pin;
use std::thread::ThreadId;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisResult, Value};
use tokio::time::{Instant, timeout, timeout_at};

use super::connector::{Connection, Live, MIN_CONNECT_TIMEOUT, Valkey, single_thread};

/// How long a command its caller stopped waiting for is still awaited; then its answer is dropped.
pub(super) const DETACHED_WAIT: Duration = Duration::from_secs(300);

/// Why a command got no answer: every recovery rule rests on it. Only a command sent can still run.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SendError {
    /// Never written (no connection in time, or a failed connect): it did not and will not happen.
    #[error("not sent: {0}")]
    NotSent(String),
    /// Never written: skipped by the gate's open circuit breaker.
    #[error("not sent: skipped after repeated failures")]
    Skipped,
    /// Written, then no answer in time (or the connection broke): it may still run.
    #[error("sent, no answer in time: it may still run")]
    Unanswered,
    /// The server answered an error (or an answer of the wrong shape): final.
    #[error("refused: {0}")]
    Refused(String),
}

impl SendError {
    /// Whether the command may still run later.
    pub fn may_land(&self) -> bool {
        matches!(self, Self::Unanswered)
    }

    /// Whether the command was never sent: nothing of it happened, and it may be sent again.
    pub fn never_sent(&self) -> bool {
        matches!(self, Self::NotSent(_) | Self::Skipped)
    }
}

/// A server's refusal with its error code (`NOGROUP`, …): callers match the code, never the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The code, for an error the server sent.
    pub code: Option<String>,
    /// The whole error, for logs.
    pub message: String,
}

impl Refusal {
    /// Whether the server refused with `code`.
    pub fn is(&self, code: &str) -> bool {
        self.code.as_deref() == Some(code)
    }
}

/// What a command that found no connection gets: it was never written, so it did not happen.
pub fn not_connected(why: String) -> SendError {
    if crate::bug!(ConnectErrorAsUnanswered) {
        return SendError::Unanswered;
    }
    SendError::NotSent(why)
}

/// Whether `e` says the connection itself failed (not the command).
fn is_connection_error(e: &RedisError) -> bool {
    e.is_unrecoverable_error() || e.is_io_error() || e.is_timeout()
}

/// Whether a connection error at a command's first poll proves it unwritten: redis-rs refuses a
/// command once the connection's task has ended, and on the thread driving that task nothing runs
/// between hand-over and poll. Elsewhere the task could write it and fail meanwhile.
fn refused_unsent(driver: Option<ThreadId>) -> bool {
    driver.is_some() && driver == single_thread()
}

/// `request` sent on `connection`, boxed so a caller who stops waiting can leave it in a task of
/// its own. Yields the answer, the request back, and whether the answer came at the first poll.
fn handed_over(
    request: Request,
    mut connection: Connection,
) -> Pin<Box<impl Future<Output = (RedisResult<Value>, Request, bool)> + Send>> {
    Box::pin(async move {
        let mut polls = 0u32;
        let answer = {
            let mut send = std::pin::pin!(request.send(&mut connection));
            std::future::poll_fn(|cx| {
                polls += 1;
                send.as_mut().poll(cx)
            })
            .await
        };
        (answer, request, polls == 1)
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

impl Valkey {
    /// The live connection, waiting for one at most until `deadline`.
    async fn live(&self, deadline: Instant) -> Result<Live, SendError> {
        self.warm_up();
        let link = &self.inner.link;
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

    /// Waits at most `within` for a live connection, so a command sent right after has its whole
    /// timeout for its answer.
    pub async fn connected(&self, within: Duration) -> Result<(), SendError> {
        self.live(Instant::now() + within).await.map(|_| ())
    }

    /// `PING` within `within`, a wait for a connection included: for a readiness probe.
    pub async fn ping(&self, within: Duration) -> Result<(), SendError> {
        self.send(redis::cmd("PING"), within).await
    }

    /// A connection for commands outside the request path (operator tools, tests).
    pub async fn connection(&self) -> RedisResult<Connection> {
        let wait = self.inner.timeout.max(MIN_CONNECT_TIMEOUT);
        self.live(Instant::now() + wait)
            .await
            .map(|live| live.connection)
            .map_err(|e| RedisError::from((redis::ErrorKind::Io, "Valkey", e.to_string())))
    }

    /// Sends `request` and waits at most `within` for its answer, saying how it failed.
    ///
    /// A caller that stops waiting does not cancel the command: it stays in flight in a task of
    /// its own, so later commands on the connection (a refund after a count) still run after it.
    /// A command refused unwritten by a connection the server closed while idle
    /// (`refused_unsent`) is sent once more on the next connection, within the same deadline.
    pub async fn send<T: FromRedisValue>(
        &self,
        request: impl Into<Request>,
        within: Duration,
    ) -> Result<T, SendError> {
        let answer = self.send_coded(request, within).await?;
        answer.map_err(|refused| SendError::Refused(refused.message))
    }

    /// [`Valkey::send`], keeping a refusal's error code ([`Refusal`]); the outer error is never
    /// [`SendError::Refused`].
    pub async fn send_coded<T: FromRedisValue>(
        &self,
        request: impl Into<Request>,
        within: Duration,
    ) -> Result<Result<T, Refusal>, SendError> {
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
                // The connection's task had ended and refused the command: not sent.
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
                Ok(value) => Ok(T::from_redis_value(value).map_err(|e| Refusal {
                    code: None,
                    message: e.to_string(),
                })),
                Err(e) if is_connection_error(&e) => {
                    // The connection broke with the command on it: it may have run.
                    self.inner.link.broken(generation);
                    tracing::debug!(error = %e, "Valkey connection lost");
                    Err(SendError::Unanswered)
                }
                Err(e) => Ok(Err(Refusal {
                    code: e.code().map(str::to_owned),
                    message: e.to_string(),
                })),
            };
        }
    }

    /// Sends the write `cmd` and, when `replicas` > 0, a [`wait`](super::wait) behind it in one
    /// pipeline: its answer, and whether the replicas acknowledged it (else a failover may lose
    /// it). A refused `WAIT` (a replica refuses it) means a write that ran short of its replicas,
    /// never a refused write: a keyed scan whose job landed must not be refunded.
    pub async fn send_replicated<T: FromRedisValue>(
        &self,
        cmd: Cmd,
        replicas: u32,
        within: Duration,
    ) -> Result<(T, bool), SendError> {
        if replicas == 0 {
            return Ok((self.send(cmd, within).await?, true));
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd)
            .add_command(super::command::wait(replicas, self.timeout()))
            .ignore_errors();
        let (answer, reached): (redis::RedisResult<T>, redis::RedisResult<u32>) =
            self.send(pipe, within).await?;
        let answer = answer.map_err(|e| SendError::Refused(e.to_string()))?;
        Ok((answer, reached.is_ok_and(|n| n >= replicas)))
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
