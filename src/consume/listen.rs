//! What `quota-gate consume` serves, each on its own listener when asked: `--metrics-listen`
//! (Prometheus `GET /metrics` on the exporter's listener) and `--health-listen` (`/healthz`;
//! `/readyz`: its Valkey answers `PING`, or it has none). Health has its own listener because the
//! exporter's takes no routes, and a probe never waits behind a scrape.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::task::AbortOnDropHandle;

use super::meter::{self, ConsumeMeter};
use crate::io::connection::Valkey;
use crate::io::health::{ALIVE, READY_TIMEOUT, readiness};

/// A probe's request head must arrive within this long.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `GET /metrics` as Prometheus text on `addr`, by the exporter's own HTTP listener.
pub async fn serve_metrics(addr: SocketAddr) -> Result<(), String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Full(meter::LATENESS_MS.into()),
            &meter::LATENESS_BUCKETS_MS,
        )
        .and_then(PrometheusBuilder::install)
        .map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
    ConsumeMeter::describe();
    crate::io::meter::describe_store();
    Ok(())
}

/// `/healthz` and `/readyz` on `addr` (ready: `valkey` answers `PING`) until the handle is dropped.
pub async fn serve_health(
    addr: SocketAddr,
    valkey: Option<Valkey>,
) -> Result<AbortOnDropHandle<()>, String> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--health-listen {addr}: {e}"))?;
    let accepting = async move {
        // Owned by the accepting task: its end (the handle dropped) ends them.
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let valkey = valkey.clone();
            let service = hyper::service::service_fn(move |request| {
                let valkey = valkey.clone();
                async move { Ok::<_, Infallible>(answer(&request, valkey.as_ref()).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            connections.spawn(connection);
        }
    };
    Ok(AbortOnDropHandle::new(tokio::spawn(accepting)))
}

/// One probe's answer: 404 but for a `GET` or `HEAD` of the two paths.
async fn answer(request: &Request<Incoming>, valkey: Option<&Valkey>) -> Response<Full<Bytes>> {
    let probe = request.method() == Method::GET || request.method() == Method::HEAD;
    let (status, kind, body) = match (probe, request.uri().path()) {
        (true, "/healthz") => (StatusCode::OK, "text/plain", ALIVE),
        (true, "/readyz") => {
            let store = match valkey {
                Some(valkey) => valkey.ping(READY_TIMEOUT).await,
                None => Ok(()),
            };
            let (status, body) = readiness(&store);
            (status, "application/json", body)
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    };
    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static(kind));
    response
}
