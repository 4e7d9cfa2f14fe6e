//! The Lambda front end: API Gateway events in, [`Gate::handle`] out.
//!
//! Accepts HTTP API (payload 2.0), REST API (payload 1.0) and Function URL
//! events. The source address is taken from the request context, where the
//! gateway put it, never from a header.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt, Response, service_fn};

use crate::gate::{Gate, GateRequest};
use crate::identity::ip::parse_source;
use crate::queue::ScanQueue;
use crate::store::QuotaStore;

/// Turns a Lambda HTTP event into a gate request.
pub fn to_gate_request(request: Request) -> GateRequest {
    let mut gateway_claims = None;
    let peer = match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => {
            gateway_claims = ctx
                .authorizer
                .as_ref()
                .and_then(|a| a.jwt.as_ref())
                .map(|j| j.claims.clone());
            ctx.http.source_ip.as_deref().and_then(parse_source)
        }
        Some(RequestContext::ApiGatewayV1(ctx)) => {
            ctx.identity.source_ip.as_deref().and_then(parse_source)
        }
        _ => None,
    };
    let remaining = request.lambda_context_ref().and_then(time_left);
    let (parts, body) = request.into_parts();
    let body = match body {
        Body::Empty => Bytes::new(),
        Body::Text(t) => Bytes::from(t),
        Body::Binary(b) => Bytes::from(b),
        _ => Bytes::new(),
    };
    GateRequest {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        headers: parts.headers,
        body,
        peer,
        gateway_claims,
        remaining,
    }
}

/// Time left before the invocation's deadline. A deadline of 0 means the
/// runtime gave none (a bare test event); one already passed is zero, so
/// nothing sleeps.
fn time_left(context: &lambda_runtime::Context) -> Option<Duration> {
    if context.deadline == 0 {
        return None;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    Some(Duration::from_millis(context.deadline.saturating_sub(now)))
}

/// The gate's answer as a Lambda response (our bodies are always JSON text).
pub fn to_lambda_response(response: http::Response<Bytes>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let body = match String::from_utf8(body.to_vec()) {
        Ok(text) => Body::Text(text),
        Err(e) => Body::Binary(e.into_bytes()),
    };
    Response::from_parts(parts, body)
}

/// Serves Lambda invocations until the runtime stops.
pub async fn run<S: QuotaStore, Q: ScanQueue>(
    gate: Arc<Gate<S, Q>>,
) -> Result<(), lambda_http::Error> {
    lambda_http::run(service_fn(move |request: Request| {
        let gate = gate.clone();
        async move {
            Ok::<_, Infallible>(to_lambda_response(
                gate.handle(to_gate_request(request)).await,
            ))
        }
    }))
    .await
}
