//! One worker's accept loop: a connection, a slot for it ([`Admission`]), then hyper over a socket
//! whose stalled writes time out.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_io_timeout::TimeoutStream;
use tokio_util::task::TaskTracker;

use super::admission::{Admission, Answer, Flushed, Registration};
use super::limits::{HEADER_READ_TIMEOUT, MAX_BUF_SIZE, MAX_UNSENT, ServeLimits, WRITE_TIMEOUT};
use super::route::Routes;
use crate::gate::Gate;
use crate::io::queue::ScanQueue;
use crate::io::store::QuotaStore;

/// What one worker serves; `admission` is shared with the other workers.
pub(super) struct Worker<S, Q> {
    pub gate: Arc<Gate<S, Q>>,
    pub metrics: Option<PrometheusHandle>,
    pub limits: ServeLimits,
    pub admission: Arc<Admission>,
}

/// A connection just accepted, and its slot.
type Accepted = (
    (TcpStream, SocketAddr),
    (OwnedSemaphorePermit, Registration),
);

impl<S: QuotaStore, Q: ScanQueue> Worker<S, Q> {
    /// Accepts on `listener` until `shutdown` completes, then drains.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        tokio::pin!(shutdown);
        // The store connection must be driven by this worker's runtime.
        self.gate.warm_up();
        let routes = Arc::new(Routes {
            gate: self.gate,
            metrics: self.metrics,
            scans: TaskTracker::new(),
        });
        let connections = GracefulShutdown::new();
        let builder = http1_builder();
        loop {
            let accepted = tokio::select! {
                accepted = accept(&listener, &self.admission) => accepted,
                () = &mut shutdown => None,
            };
            let Some(accepted) = accepted else { break };
            spawn_connection(&routes, &builder, &connections, accepted);
        }
        drop(listener);
        // No sleep outlasts the drain: the sleepers go on to their jobs now.
        routes.gate.wake_sleepers();
        drain(connections, &routes.scans, self.limits.drain_timeout).await;
        Ok(())
    }
}

/// Serves `accepted` in its own task until it ends, gives way to another, or the drain ends.
fn spawn_connection<S: QuotaStore, Q: ScanQueue>(
    routes: &Arc<Routes<S, Q>>,
    builder: &http1::Builder,
    watcher: &GracefulShutdown,
    ((stream, peer), (permit, registration)): Accepted,
) {
    let _ = stream.set_nodelay(true);
    limit_unsent(&stream);
    // Shared with the gate tasks, so the cap also bounds scans whose client left.
    let permit = Arc::new(permit);
    let presence = registration.presence.clone();
    let routes = routes.clone();
    let slot = permit.clone();
    let service = service_fn(move |request| {
        // Synchronously: a connection just closed for another must not let the request in.
        let started = presence.request_started();
        let routed = started.then(|| routes.clone().route(peer, slot.clone(), request));
        let presence = presence.clone();
        async move {
            let response = match routed {
                Some(routed) => routed.await,
                None => super::route::gave_way(),
            };
            Ok::<_, Infallible>(response.map(|body| Answer { body, presence }))
        }
    });
    let mut socket = TimeoutStream::new(stream);
    socket.set_write_timeout(Some(WRITE_TIMEOUT));
    let io = TokioIo::new(Flushed::new(
        Box::pin(socket),
        registration.presence.clone(),
    ));
    let connection = watcher.watch(builder.serve_connection(io, service));
    tokio::spawn(async move {
        tokio::select! {
            ended = connection => if let Err(e) = ended {
                tracing::debug!(error = %e, "connection closed with an error");
            },
            () = registration.presence.closed() => {
                tracing::debug!("closed while waiting for a request, to admit another");
            }
        }
        drop((permit, registration));
    });
}

/// The next connection, once admitted. While it waits for a slot the rest wait in the listen
/// backlog, costing no file descriptor. `None` once the slots are closed.
async fn accept(listener: &TcpListener, admission: &Arc<Admission>) -> Option<Accepted> {
    let (stream, peer) = loop {
        match listener.accept().await {
            Ok(accepted) => break accepted,
            Err(e) => {
                // Out of file descriptors and the like: keep serving, without spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    Some(((stream, peer), admission.admit().await?))
}

/// hyper's HTTP/1.1 settings. The buffer bounds a request head and pipelined read-ahead, and no
/// pipelined request is read while an answer waits unsent.
fn http1_builder() -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        // Else hyper drops the answer to a half-closed request whose scan is counted and queued.
        .half_close(true)
        .keep_alive(true)
        .max_buf_size(MAX_BUF_SIZE);
    builder
}

/// At most [`MAX_UNSENT`] bytes may wait unsent in the kernel, so a write to a client that does not read soon
/// waits and times out; bytes in flight are not counted, so a reader's throughput is not limited.
fn limit_unsent(stream: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(stream).set_tcp_notsent_lowat(MAX_UNSENT) {
        tracing::debug!(error = %e, "cannot set TCP_NOTSENT_LOWAT");
    }
}

/// Lets open connections finish their requests and waits for every gate task, those of clients
/// that left included, for at most `within`; past it they are dropped.
async fn drain(connections: GracefulShutdown, scans: &TaskTracker, within: Duration) {
    scans.close();
    let drained = tokio::time::timeout(within, async {
        connections.shutdown().await;
        scans.wait().await;
    });
    if drained.await.is_err() {
        tracing::warn!(
            scans = scans.len(),
            "requests still in flight after {within:?}; closing them"
        );
    }
}
