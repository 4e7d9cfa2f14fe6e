//! One request on a connection: `/healthz`, `/readyz` (the store answers a
//! `PING` within a second, [`crate::io::health`]), `/metrics`, or the gate.
//!
//! The gate's handling of a request runs in a task of its own, which the
//! connection only awaits: when the client goes away, hyper drops the
//! connection's future and with it the wait, but not the task, so a scan
//! once counted runs to its end (job queued, keyed answer saved) as it does
//! in Lambda. The tasks are tracked so that shutdown waits for them, and
//! each holds its connection's slot until it ends, so a client that sends a
//! scan and leaves, again and again, cannot pile up more scans in flight than
//! `QUOTA_MAX_CONNECTIONS`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::task::TaskTracker;

use super::limits::ServeLimits;
use crate::gate::error::{GateError, Queued};
use crate::gate::validate::MAX_BODY_BYTES;
use crate::gate::{Gate, GateRequest};
use crate::io::health::{ALIVE, READY_TIMEOUT, readiness};
use crate::io::queue::ScanQueue;
use crate::io::store::QuotaStore;

/// What every request of one worker needs.
pub(super) struct Routes<S, Q> {
    pub gate: Arc<Gate<S, Q>>,
    pub metrics: Option<PrometheusHandle>,
    pub limits: ServeLimits,
    /// The gate's tasks, which outlive their connections; shutdown waits
    /// for them.
    pub scans: TaskTracker,
}

/// A `GET` or `HEAD` of `path` (HEAD gets the same status and headers;
/// hyper leaves out the body).
fn is_probe(request: &Request<Incoming>, path: &str) -> bool {
    (request.method() == Method::GET || request.method() == Method::HEAD)
        && request.uri().path() == path
}

/// `GET /healthz` (alive: it touches nothing) and `GET /metrics`; `None`
/// for everything else.
fn endpoint(
    request: &Request<Incoming>,
    metrics: Option<&PrometheusHandle>,
) -> Option<Response<Full<Bytes>>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return None;
    }
    match (request.uri().path(), metrics) {
        ("/healthz", _) => Some(text(StatusCode::OK, "text/plain", ALIVE.into())),
        ("/metrics", Some(handle)) => Some(text(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            crate::io::meter::prometheus::render(handle),
        )),
        _ => None,
    }
}

impl<S: QuotaStore, Q: ScanQueue> Routes<S, Q> {
    /// Answers `request` from `peer`, whose connection holds `slot`.
    pub async fn route(
        self: Arc<Self>,
        peer: SocketAddr,
        slot: Arc<OwnedSemaphorePermit>,
        request: Request<Incoming>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        if let Some(answer) = endpoint(&request, self.metrics.as_ref()) {
            return Ok(answer);
        }
        if is_probe(&request, "/readyz") {
            let store = self.gate.store().ready(READY_TIMEOUT).await;
            let (status, body) = readiness(&store);
            return Ok(text(status, "application/json", body.into()));
        }
        if let Some(refusal) = refuse_before_body(&request) {
            return Ok(refusal);
        }
        let (parts, body) = request.into_parts();
        let limited = Limited::new(body, MAX_BODY_BYTES + 1).collect();
        let body = match tokio::time::timeout(self.limits.body_read_timeout, limited).await {
            Ok(Ok(collected)) => collected.to_bytes(),
            Ok(Err(e)) => return Ok(closing(unreadable_body(&*e).to_response())),
            Err(_) => {
                let after = self.limits.body_read_timeout;
                return Ok(closing(GateError::BodyTimeout { after }.to_response()));
            }
        };
        let request = GateRequest {
            method: parts.method,
            path: parts.uri.path().to_owned(),
            headers: parts.headers,
            body,
            peer: Some(peer.ip().to_canonical()),
            gateway_claims: None,
            remaining: None,
            trace: None,
            request_id: None,
        };
        // The gate runs to its end even if this future is dropped.
        let gate = self.gate.clone();
        let handled = super::detach::detach(&self.scans, async move {
            let response = gate.handle(request).await;
            drop(slot);
            response
        });
        Ok(match handled.await {
            Ok(response) => response.map(Full::new),
            Err(e) => {
                // Only a panic (or a runtime shutting down) ends the task
                // early: whether its job landed is not known.
                tracing::error!(error = %e, "a scan's task ended before its answer");
                let unknown = GateError::QueueFailed {
                    queued: Queued::Unknown,
                };
                unknown.to_response().map(Full::new)
            }
        })
    }
}

/// The answer to a request whose head arrived just as its connection was
/// closed to admit another: it never reached the gate, so nothing was
/// counted; the client may send it again. (The connection is on its way
/// out, so this is seldom even written.)
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

/// Why a body could not be read: past the limit (413), or cut short or
/// badly framed by the client (fewer bytes than its `Content-Length`, a
/// broken chunk), which is the client's mistake too (400), not a size.
fn unreadable_body(e: &(dyn std::error::Error + 'static)) -> GateError {
    if e.is::<http_body_util::LengthLimitError>() {
        return GateError::PayloadTooLarge;
    }
    GateError::bad_request(
        "incomplete_body",
        format!("the body could not be read to its end: {e}"),
    )
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
    let error = match crate::gate::validate::validate(
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

/// The gate's response, with `Connection: close`: the body was not read to
/// its end, so the connection cannot carry another request.
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
