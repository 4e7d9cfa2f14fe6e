//! The local front end: `quota-gate serve`, an HTTP/1.1 server on the same
//! [`Gate::handle`] as Lambda.
//!
//! Routes: `POST /scan` (the gate), `GET /healthz`, and `GET /metrics`
//! (Prometheus text, when a recorder handle is given). The source address is
//! the socket peer. Bodies are read at most 64 KiB + 1 bytes, so a 10 MiB
//! upload costs nothing but a 413.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::error::GateError;
use crate::gate::{Gate, GateRequest};
use crate::queue::ScanQueue;
use crate::store::QuotaStore;
use crate::validate::MAX_BODY_BYTES;

/// How long shutdown waits for requests in flight: a hard-tier scan may be
/// asleep for up to the gateway budget (28 s by default).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `gate` on `listener` until `shutdown` completes, then stops
/// accepting and lets the requests in flight finish (at most
/// [`DRAIN_TIMEOUT`]), so a restart never drops a counted scan's answer.
pub async fn serve<S: QuotaStore, Q: ScanQueue>(
    listener: TcpListener,
    gate: Arc<Gate<S, Q>>,
    metrics: Option<PrometheusHandle>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let connections = GracefulShutdown::new();
    loop {
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
            service_fn(move |request| route(gate.clone(), metrics.clone(), peer, request));
        let connection = connections
            .watch(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
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
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path();
    if request.method() == Method::GET {
        match (path, &metrics) {
            ("/healthz", _) => return Ok(text(StatusCode::OK, "text/plain", "ok\n".into())),
            ("/metrics", Some(handle)) => {
                return Ok(text(
                    StatusCode::OK,
                    "text/plain; version=0.0.4",
                    handle.render(),
                ));
            }
            _ => {}
        }
    }
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, MAX_BODY_BYTES + 1).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(GateError::PayloadTooLarge.to_response().map(Full::new)),
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

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
