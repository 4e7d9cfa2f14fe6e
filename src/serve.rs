//! The local front end: `quota-gate serve`, an HTTP/1.1 server on the same
//! [`Gate::handle`] as Lambda.
//!
//! Routes: `POST /scan` (the gate), `GET`/`HEAD /healthz`, and `GET /metrics`
//! (Prometheus text, when a recorder handle is given). The source address is
//! the socket peer.
//!
//! A server on a network must let go of clients that hold it up:
//! - a connection that has not sent a request's complete headers within
//!   [`HEADER_READ_TIMEOUT`] (10 s) of opening, or of its previous response,
//!   is closed: this is both the slow-header (slowloris) bound and the idle
//!   keep-alive timeout;
//! - a body must arrive within [`BODY_READ_TIMEOUT`], else 408; bodies are
//!   read at most 64 KiB + 1 bytes, and a `Content-Length` above 64 KiB is
//!   answered 413 before any of the body is read (so an
//!   `Expect: 100-continue` client never gets `100 Continue` and never sends it);
//! - at most [`ServeLimits::max_connections`] connections are open at once
//!   (`QUOTA_MAX_CONNECTIONS`); past it new connections wait in the listen
//!   backlog until one closes, and the open ones are not disturbed.
//!
//! `/healthz` and `/metrics` touch neither the store, the queue nor stdout.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::error::GateError;
use crate::gate::{Gate, GateRequest};
use crate::queue::ScanQueue;
use crate::store::QuotaStore;
use crate::validate::MAX_BODY_BYTES;

/// How long shutdown waits for requests in flight: a hard-tier scan may be
/// asleep for up to the gateway budget (28 s by default).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection must deliver a request's complete headers within this long
/// of opening or of its previous response (so it is also the idle timeout).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A request body must arrive completely within this long of its headers.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Connection limits of the local server.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections open at once; the next waits in the backlog.
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            // `QUOTA_MAX_CONNECTIONS`'s default, from the one table.
            max_connections: crate::Config::default().serve.max_connections as usize,
            header_read_timeout: HEADER_READ_TIMEOUT,
            body_read_timeout: BODY_READ_TIMEOUT,
        }
    }
}

/// Serves `gate` on `listener` with the default [`ServeLimits`] until
/// `shutdown` completes (see [`serve_with`]).
pub async fn serve<S: QuotaStore, Q: ScanQueue>(
    listener: TcpListener,
    gate: Arc<Gate<S, Q>>,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, gate, metrics, ServeLimits::default(), shutdown).await
}

/// Serves `gate` on `listener` until `shutdown` completes, then stops
/// accepting and lets the requests in flight finish (at most
/// [`DRAIN_TIMEOUT`]), so a restart never drops a counted scan's answer.
pub async fn serve_with<S: QuotaStore, Q: ScanQueue>(
    listener: TcpListener,
    gate: Arc<Gate<S, Q>>,
    metrics: Option<PrometheusHandle>,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = connection_slots(limits);
    serve_sharing(listener, gate, metrics, limits, slots, shutdown).await
}

/// The semaphore that holds open connections to [`ServeLimits::max_connections`].
pub fn connection_slots(limits: ServeLimits) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(limits.max_connections.max(1)))
}

/// [`serve_with`], taking connection slots from `slots`, which several
/// servers on one listening socket (`quota-gate serve`'s workers, one per
/// core) share, so the cap holds for the process.
pub async fn serve_sharing<S: QuotaStore, Q: ScanQueue>(
    listener: TcpListener,
    gate: Arc<Gate<S, Q>>,
    metrics: Option<PrometheusHandle>,
    limits: ServeLimits,
    slots: Arc<Semaphore>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    // This worker's store connection, driven by its own runtime, from now.
    gate.warm_up();
    let connections = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true);
    loop {
        // A free slot first: past the cap, new connections wait in the
        // listen backlog (and cost no file descriptor here) until one closes.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: keep serving the
                    // others, without spinning on the error.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let gate = gate.clone();
        let metrics = metrics.clone();
        let service =
            service_fn(move |request| route(gate.clone(), metrics.clone(), peer, limits, request));
        let connection = connections.watch(builder.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, connections.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still in flight after {DRAIN_TIMEOUT:?}; closing them");
    }
    Ok(())
}

async fn route<S: QuotaStore, Q: ScanQueue>(
    gate: Arc<Gate<S, Q>>,
    metrics: Option<PrometheusHandle>,
    peer: SocketAddr,
    limits: ServeLimits,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path();
    if request.method() == Method::GET || request.method() == Method::HEAD {
        // HEAD gets the same status and headers; hyper leaves out the body.
        match (path, &metrics) {
            ("/healthz", _) => return Ok(text(StatusCode::OK, "text/plain", "ok\n".into())),
            ("/metrics", Some(handle)) => {
                crate::meter::sample_process();
                return Ok(text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    handle.render(),
                ));
            }
            _ => {}
        }
    }
    if let Some(refusal) = refuse_before_body(&request) {
        return Ok(refusal);
    }
    let (parts, body) = request.into_parts();
    let limited = Limited::new(body, MAX_BODY_BYTES + 1).collect();
    let body = match tokio::time::timeout(limits.body_read_timeout, limited).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) => return Ok(closing(GateError::PayloadTooLarge.to_response())),
        Err(_) => return Ok(request_timeout(limits.body_read_timeout)),
    };
    let request = GateRequest {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        headers: parts.headers,
        body,
        peer: Some(peer.ip().to_canonical()),
        gateway_claims: None,
        remaining: None,
    };
    Ok(gate.handle(request).await.map(Full::new))
}

/// A request whose `Content-Length` already says it is too large is answered
/// without reading the body (hyper sends `100 Continue` only when the body is
/// polled, so an `Expect: 100-continue` client gets the 413 instead). The
/// route, method and media type are checked first, in the gate's order, so
/// the status is the one the whole body would have got.
fn refuse_before_body(request: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
    let length = content_length(request.headers())?;
    if length <= MAX_BODY_BYTES as u64 {
        return None;
    }
    let error = match crate::validate::validate(
        request.method(),
        request.uri().path(),
        request.headers(),
        b"",
    ) {
        Err(
            e @ (GateError::NotFound
            | GateError::MethodNotAllowed
            | GateError::UnsupportedMediaType),
        ) => e,
        _ => GateError::PayloadTooLarge,
    };
    Some(closing(error.to_response()))
}

/// The declared body length; an unparsable one is left to hyper.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The gate's response, with `Connection: close`: the body was not read, so
/// the connection cannot carry another request.
fn closing(response: Response<Bytes>) -> Response<Full<Bytes>> {
    let mut response = response.map(Full::new);
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn request_timeout(after: Duration) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "error": "request_timeout",
        "detail": format!("the body did not arrive within {} s", after.as_secs()),
    });
    let mut response = text(
        StatusCode::REQUEST_TIMEOUT,
        "application/json",
        body.to_string(),
    );
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
