//! The connection cap, and which connection gives way past it. A connection is *waiting* for
//! complete headers or *busy*; only a waiting one costs nothing to close. Each state is one atomic
//! word ([`Presence`]); the list of open connections is locked only to open, close, or pick one.
//! The presence learns that its answer is out from the body ([`Answer`], dropped) and the socket
//! ([`Flushed`]), so closing it for another never cuts an answer off; and from the socket when
//! `serve` first reads it, where a new connection's grace starts.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, TryAcquireError};

use super::limits::ServeLimits;

/// How often a connection held at the cap looks again: graces end, and other workers take slots.
const LOOK_AGAIN: Duration = Duration::from_millis(50);

/// A request is being read, run or answered.
const BUSY: u64 = 0;
/// Its answer is all with hyper, not yet all written to the socket.
const SENDING: u64 = 1;
/// Closed to admit another: no request may start.
const CLOSED: u64 = u64::MAX;
/// Waiting, closable from `(state - WAITING)` ms after the epoch.
const WAITING: u64 = 2;

/// The waiting state closable `grace` from now, in milliseconds since `epoch` (shared by the states).
fn waiting_for(epoch: Instant, grace: Duration) -> u64 {
    let from = epoch.elapsed() + grace;
    WAITING.saturating_add(u64::try_from(from.as_millis()).unwrap_or(CLOSED - 1))
}

/// What the cap knows of one open connection: its state, and the signal to close it.
#[derive(Debug)]
pub(super) struct Presence {
    state: AtomicU64,
    closed: Notify,
    epoch: Instant,
    new_connection_grace: Duration,
    keep_alive_grace: Duration,
}

impl Presence {
    /// `serve` reads the socket for the first time: a new connection's grace runs from here, so
    /// time the connection spent waiting for a busy `serve` to get to it is not the client's.
    pub fn first_read(&self) {
        let from_now = |state| {
            (WAITING..CLOSED)
                .contains(&state)
                .then(|| waiting_for(self.epoch, self.new_connection_grace))
        };
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, from_now);
    }

    /// A request's headers have arrived: busy until its answer is sent. `false` if it was just
    /// closed for another: the request must not reach the gate.
    pub fn request_started(&self) -> bool {
        let busy = |state| (state != CLOSED).then_some(BUSY);
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, busy)
            .is_ok()
    }

    /// hyper holds the whole answer; it is sent once hyper's buffer is written ([`Self::flushed`]).
    pub fn answer_handed_over(&self) {
        let _ = self
            .state
            .compare_exchange(BUSY, SENDING, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Everything hyper had to write is written: the connection waits for its next request.
    pub fn flushed(&self) {
        let waiting =
            |state| (state == SENDING).then(|| waiting_for(self.epoch, self.keep_alive_grace));
        let _ = (self.state).fetch_update(Ordering::AcqRel, Ordering::Acquire, waiting);
    }

    /// Completes once the connection is closed to admit another.
    pub async fn closed(&self) {
        self.closed.notified().await;
    }

    /// Its waiting state, if it waits and may be closed by `now`.
    fn closable(&self, now: u64) -> Option<u64> {
        let state = self.state.load(Ordering::Acquire);
        (WAITING..=now).contains(&state).then_some(state)
    }

    /// Closes it if still in `state`; whether it did.
    fn close_if(&self, state: u64) -> bool {
        let closed = self
            .state
            .compare_exchange(state, CLOSED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if closed {
            // Kept for the task if it is not waiting on it yet.
            self.closed.notify_one();
        }
        closed
    }
}

/// The connection slots every worker shares, and the open connections.
#[derive(Debug)]
pub(super) struct Admission {
    slots: Arc<Semaphore>,
    open: Mutex<HashMap<u64, Arc<Presence>>>,
    next_id: AtomicU64,
    epoch: Instant,
    new_connection_grace: Duration,
    keep_alive_grace: Duration,
}

/// An admitted connection's place among the open ones, left when dropped.
#[derive(Debug)]
pub(super) struct Registration {
    admission: Arc<Admission>,
    id: u64,
    pub presence: Arc<Presence>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.admission.open_connections().remove(&self.id);
    }
}

impl Admission {
    /// [`ServeLimits::max_connections`] slots (at least one).
    pub fn new(limits: &ServeLimits) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            open: Mutex::default(),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
            new_connection_grace: limits.new_connection_grace,
            keep_alive_grace: limits.keep_alive_grace,
        })
    }

    /// A slot for a connection just accepted, registered as waiting: a free slot, else that of the
    /// longest waiting connection (closed for it), else the next to free. `None` once closed.
    pub async fn admit(self: &Arc<Self>) -> Option<(OwnedSemaphorePermit, Registration)> {
        let permit = self.slot().await?;
        let presence = Arc::new(Presence {
            state: AtomicU64::new(waiting_for(self.epoch, self.new_connection_grace)),
            closed: Notify::new(),
            epoch: self.epoch,
            new_connection_grace: self.new_connection_grace,
            keep_alive_grace: self.keep_alive_grace,
        });
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.open_connections().insert(id, presence.clone());
        Some((
            permit,
            Registration {
                admission: self.clone(),
                id,
                presence,
            },
        ))
    }

    /// A free slot, making one if none is. A closed connection's slot frees only once its task has
    /// run, and another worker may take it first.
    async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        loop {
            match self.slots.clone().try_acquire_owned() {
                Ok(permit) => return Some(permit),
                Err(TryAcquireError::Closed) => return None,
                Err(TryAcquireError::NoPermits) => {}
            }
            if self.close_longest_waiting() {
                tracing::debug!("at the connection cap: closed the longest waiting connection");
            }
            let freed = tokio::time::timeout(LOOK_AGAIN, self.slots.clone().acquire_owned());
            if let Ok(permit) = freed.await {
                return permit.ok();
            }
        }
    }

    /// Closes the connection waiting longest past its grace; whether there was one.
    fn close_longest_waiting(&self) -> bool {
        // The latest waiting state closable now.
        let now = waiting_for(self.epoch, Duration::ZERO);
        let open = self.open_connections();
        loop {
            let longest = open
                .values()
                .filter_map(|p| Some((p.closable(now)?, p)))
                .min_by_key(|(state, _)| *state);
            let Some((state, presence)) = longest else {
                return false;
            };
            if presence.close_if(state) {
                return true;
            }
            // A request started on it meanwhile: look again.
        }
    }

    fn open_connections(&self) -> MutexGuard<'_, HashMap<u64, Arc<Presence>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A response body that tells its [`Presence`] when hyper drops it.
pub(super) struct Answer {
    pub body: Full<Bytes>,
    pub presence: Arc<Presence>,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.presence.answer_handed_over();
    }
}

/// A socket that tells its [`Presence`] of its first read and of every completed flush.
pub(super) struct Flushed<T> {
    io: T,
    presence: Arc<Presence>,
    read: bool,
}

impl<T> Flushed<T> {
    pub fn new(io: T, presence: Arc<Presence>) -> Self {
        Self {
            io,
            presence,
            read: false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Flushed<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.read {
            self.read = true;
            self.presence.first_read();
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Flushed<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        ready!(Pin::new(&mut self.io).poll_flush(cx))?;
        self.presence.flushed();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Admitted = (OwnedSemaphorePermit, Registration);

    /// Slots for `cap` connections, with the graces given in ms.
    fn admission(cap: usize, new_ms: u64, keep_alive_ms: u64) -> Arc<Admission> {
        Admission::new(&ServeLimits {
            max_connections: cap,
            new_connection_grace: Duration::from_millis(new_ms),
            keep_alive_grace: Duration::from_millis(keep_alive_ms),
            ..ServeLimits::default()
        })
    }

    async fn admitted(admission: &Arc<Admission>) -> Admitted {
        admission.admit().await.expect("open slots")
    }

    /// Whether `connection` is closed within `within`.
    async fn closed_within(connection: &Admitted, within: u64) -> bool {
        let closed = connection.1.presence.closed();
        tokio::time::timeout(Duration::from_millis(within), closed)
            .await
            .is_ok()
    }

    /// Admits a connection at the cap once `victim` has given way (its task
    /// ends when it is closed), within `within` ms.
    async fn admitted_for(admission: &Arc<Admission>, victim: Admitted, within: u64) -> Admitted {
        let admitting = tokio::spawn({
            let admission = admission.clone();
            async move { admitted(&admission).await }
        });
        assert!(closed_within(&victim, within).await, "not closed");
        drop(victim);
        admitting.await.unwrap()
    }

    /// At the cap, the connection waiting longest for a request gives way
    /// to a new one; a busy one never does, and a request can no longer
    /// start on the one closed.
    #[tokio::test]
    async fn the_longest_waiting_connection_gives_way() {
        let admission = admission(3, 0, 0);
        let busy = admitted(&admission).await;
        let oldest = admitted(&admission).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        let newer = admitted(&admission).await;
        assert!(busy.1.presence.request_started());
        let presence = oldest.1.presence.clone();
        let _new = admitted_for(&admission, oldest, 500).await;
        assert!(!presence.request_started(), "closed for another");
        assert!(!closed_within(&busy, 10).await);
        assert!(!closed_within(&newer, 10).await);
    }

    /// A connection within its grace keeps its slot: a new one waits until
    /// the grace is over, or for a slot to free.
    #[tokio::test]
    async fn a_connection_within_its_grace_keeps_its_slot() {
        let admission = admission(1, 200, 0);
        let young = admitted(&admission).await;
        let started = Instant::now();
        let _new = admitted_for(&admission, young, 1_000).await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
    }

    /// A new connection's grace runs from `serve`'s first read of it, not from its admission.
    #[tokio::test]
    async fn a_new_connections_grace_runs_from_the_first_read() {
        let admission = admission(1, 200, 0);
        let young = admitted(&admission).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        young.1.presence.first_read();
        let read = Instant::now();
        let _new = admitted_for(&admission, young, 1_000).await;
        let waited = read.elapsed();
        assert!(waited >= Duration::from_millis(200), "{waited:?}");
    }

    /// A busy connection gives way only once its answer is sent and it has
    /// then waited its keep-alive grace for the next request.
    #[tokio::test]
    async fn a_keep_alive_connection_gives_way_after_its_grace() {
        let admission = admission(1, 0, 200);
        let client = admitted(&admission).await;
        let presence = client.1.presence.clone();
        assert!(presence.request_started());
        let admitting = tokio::spawn({
            let admission = admission.clone();
            async move { admitted(&admission).await }
        });
        assert!(!closed_within(&client, 300).await, "busy");
        presence.answer_handed_over();
        assert!(!closed_within(&client, 100).await, "its answer is not sent");
        presence.flushed();
        let sent = Instant::now();
        assert!(closed_within(&client, 1_000).await, "idle past its grace");
        assert!(sent.elapsed() >= Duration::from_millis(150));
        drop(client);
        let _new = admitting.await.unwrap();
    }
}
