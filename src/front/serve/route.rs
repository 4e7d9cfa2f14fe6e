//! One request on a connection: `/healthz`, `/readyz`, `/metrics`, or the gate. The gate runs in a
//! tracked task that outlives the connection and holds its slot until it ends.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinError;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use super::limits::BODY_READ_TIMEOUT;
use crate::gate::error::{GateError, Queued};
use crate::gate::validate::{MAX_BODY_BYTES, validate};
use crate::gate::{Gate, GateRequest};
use crate::io::health::{ALIVE, READY_TIMEOUT, readiness};
use crate::io::queue::ScanQueue;
use crate::io::store::QuotaStore;

/// What every request of one worker needs.
pub(super) struct Routes<S, Q> {
    pub gate: Arc<Gate<S, Q>>,
    pub metrics: Option<PrometheusHandle>,
    /// The gate's tasks; shutdown waits for them.
    pub scans: TaskTracker,
}

impl<S: QuotaStore, Q: ScanQueue> Routes<S, Q> {
    /// Answers `request` from `peer`; `slot` is held until the gate's task ends.
    pub async fn route(
        self: Arc<Self>,
        peer: SocketAddr,
        slot: Arc<OwnedSemaphorePermit>,
        request: Request<Incoming>,
    ) -> Response<Full<Bytes>> {
        if let Some(answer) = self.probe(&request).await {
            return answer;
        }
        if let Some(refusal) = refuse_before_body(&request) {
            return refusal;
        }
        let (parts, body) = request.into_parts();
        let limited = Limited::new(body, MAX_BODY_BYTES + 1).collect();
        let body = match tokio::time::timeout(BODY_READ_TIMEOUT, limited).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) => return closing(unreadable_body(&*e).to_response()),
            Err(_) => {
                let after = BODY_READ_TIMEOUT;
                return closing(GateError::BodyTimeout { after }.to_response());
            }
        };
        let request = GateRequest {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            headers: parts.headers,
            body,
            peer: Some(peer.ip().to_canonical()),
            ..GateRequest::default()
        };
        let gate = self.gate.clone();
        let handled = detach(&self.scans, async move {
            let response = gate.handle(request).await;
            drop(slot);
            response
        });
        match handled.await {
            Ok(response) => response.map(Full::new),
            Err(e) => {
                tracing::error!(error = %e, "a scan's task ended before its answer");
                let queued = Queued::Unknown;
                GateError::QueueFailed { queued }
                    .to_response()
                    .map(Full::new)
            }
        }
    }

    /// The answer to a `GET` or `HEAD` (hyper leaves out a HEAD's body) of a probe or the metrics;
    /// `None` for everything else.
    async fn probe(&self, request: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
        if !matches!(*request.method(), Method::GET | Method::HEAD) {
            return None;
        }
        match (request.uri().path(), &self.metrics) {
            ("/healthz", _) => Some(text(StatusCode::OK, "text/plain", ALIVE.into())),
            ("/metrics", Some(handle)) => {
                let body = crate::io::meter::prometheus::render(handle);
                Some(text(StatusCode::OK, "text/plain; version=0.0.4", body))
            }
            ("/readyz", _) => {
                let store = self.gate.store().ready(READY_TIMEOUT).await;
                let (status, body) = readiness(&store);
                Some(text(status, "application/json", body.into()))
            }
            _ => None,
        }
    }
}

/// The answer to a request whose connection was just closed for another: nothing was counted.
pub(super) fn gave_way() -> Response<Full<Bytes>> {
    let mut answer = text(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain",
        "connection closed for another; send the request again\n".into(),
    );
    let headers = answer.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    answer
}

/// Why a body could not be read: past the limit (413), or cut short or badly framed (400).
fn unreadable_body(e: &(dyn std::error::Error + 'static)) -> GateError {
    if e.is::<http_body_util::LengthLimitError>() {
        return GateError::PayloadTooLarge;
    }
    GateError::bad_request(
        "incomplete_body",
        format!("the body could not be read to its end: {e}"),
    )
}

/// Answers a too large `Content-Length` without reading the body (so no `100 Continue` is sent).
/// Route, method and media type are checked first, in the gate's order, for the same status.
fn refuse_before_body(request: &Request<Incoming>) -> Option<Response<Full<Bytes>>> {
    let length = content_length(request.headers())?;
    if length <= MAX_BODY_BYTES as u64 {
        return None;
    }
    let (method, path, headers) = (request.method(), request.uri().path(), request.headers());
    let error = match validate(method, path, headers, b"") {
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

/// The gate's response with `Connection: close`: the body was not read to its end.
fn closing(response: Response<Bytes>) -> Response<Full<Bytes>> {
    let mut response = response.map(Full::new);
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

/// Runs `scan` in a task of `scans` and returns the wait on its answer; dropping the wait leaves
/// the scan running. `Err` only on a panic or runtime shutdown, when whether its job landed is not
/// known.
pub fn detach<T, F>(
    scans: &TaskTracker,
    scan: F,
) -> impl Future<Output = Result<T, JoinError>> + use<T, F>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let task = scans.spawn(scan);
    async move {
        if crate::bug!(DisconnectDropsScan) {
            return AbortOnDropHandle::new(task).await;
        }
        task.await
    }
}
