//! The Lambda front end: API Gateway (payload 1.0 and 2.0) and Function URL events in,
//! [`Gate::handle`] out. The source address comes from the request context, never from a header.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt, Response, service_fn};

use crate::gate::identity::ip::parse_source;
use crate::gate::{Gate, GateRequest};
use crate::io::meter::emf::Sink;
use crate::io::meter::store::{Process, StoreMeter};
use crate::io::queue::ScanQueue;
use crate::io::store::{AnyStore, QuotaStore};

/// Turns a Lambda HTTP event into a gate request.
pub fn to_gate_request(request: Request) -> GateRequest {
    let (peer, gateway_claims) = match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => {
            let jwt = ctx.authorizer.as_ref().and_then(|a| a.jwt.as_ref());
            let peer = ctx.http.source_ip.as_deref().and_then(parse_source);
            (peer, jwt.map(|j| j.claims.clone()))
        }
        Some(RequestContext::ApiGatewayV1(ctx)) => (
            ctx.identity.source_ip.as_deref().and_then(parse_source),
            None,
        ),
        _ => (None, None),
    };
    let context = request.lambda_context_ref();
    let remaining = context.and_then(time_left);
    // The invocation's X-Ray context, which no client can set.
    let trace = context
        .and_then(|c| c.xray_trace_id.as_deref())
        .and_then(crate::gate::trace::from_xray_header);
    let request_id = context.map(|c| c.request_id.clone());
    let (parts, body) = request.into_parts();
    let body = match body {
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
        trace,
        request_id,
    }
}

/// The earliest deadline taken for an epoch instant (2000-01-01T00:00:00Z, in ms).
pub const EARLIEST_DEADLINE_MS: u64 = 946_684_800_000;

/// Time left before the invocation's deadline; `None` for no deadline (0) or one that is not an
/// epoch instant (a local emulator may send the timeout itself). One already passed is zero.
pub fn time_left(context: &lambda_runtime::Context) -> Option<Duration> {
    let now = u64::try_from(crate::io::clock::wall_ms()).unwrap_or(0);
    remaining_before(context.deadline, now)
}

/// Time from `now_ms` to `deadline_ms` (epoch milliseconds), as [`time_left`].
pub fn remaining_before(deadline_ms: u64, now_ms: u64) -> Option<Duration> {
    if deadline_ms == 0 {
        return None;
    }
    if deadline_ms < EARLIEST_DEADLINE_MS {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                deadline_ms,
                "the runtime's Lambda-Runtime-Deadline-Ms is not an epoch instant \
                 (a local emulator?); ignoring it: only QUOTA_GATEWAY_TIMEOUT_MS bounds the delay"
            );
        });
        return None;
    }
    Some(Duration::from_millis(deadline_ms.saturating_sub(now_ms)))
}

/// The gate's answer as a Lambda response.
pub fn to_lambda_response(response: http::Response<Bytes>) -> Response<Body> {
    let (parts, body) = response.into_parts();
    let body = match String::from_utf8(body.to_vec()) {
        Ok(text) => Body::Text(text),
        Err(e) => Body::Binary(e.into_bytes()),
    };
    Response::from_parts(parts, body)
}

/// The error type a configuration error is reported under.
pub const CONFIG_ERROR_TYPE: &str = "Runtime.ConfigError";

/// Reports a cold-start failure to the Lambda Runtime API at `api` (`AWS_LAMBDA_RUNTIME_API`), so
/// the invocation's error names the cause instead of "Runtime exited". Returns the status code.
pub async fn report_init_error(
    api: &str,
    error_type: &str,
    message: &str,
) -> Result<u16, lambda_runtime::Error> {
    use lambda_runtime_api_client::{PooledClient, body::Body, build_request};
    let endpoint: http::Uri = api.parse()?;
    let body = serde_json::json!({"errorMessage": message, "errorType": error_type}).to_string();
    let request = build_request()
        .method(http::Method::POST)
        .uri("/2018-06-01/runtime/init/error")
        .header("lambda-runtime-function-error-type", error_type)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))?;
    let client = PooledClient::builder().with_endpoint(endpoint).build();
    let response = tokio::time::timeout(Duration::from_secs(2), client.call(request))
        .await
        .map_err(|_| "the Runtime API did not answer")??;
    Ok(response.status().as_u16())
}

/// The Lambda's init check of the store's eviction policy: logged and metered, or the init refused
/// when `QUOTA_STORE_EVICTION=refuse`. Evictions during the run are left to the cache's alarm.
pub async fn check_store<Q: ScanQueue>(gate: &Gate<AnyStore, Q>) -> Result<(), String> {
    let AnyStore::Valkey(store) = gate.store() else {
        return Ok(());
    };
    let config = gate.config();
    let sink = Sink::sync(Box::new(std::io::stdout()));
    let meter = StoreMeter::new(&config.metrics_namespace, Process::Lambda, Some(sink));
    crate::io::eviction_watch::check_at_start(store.valkey(), &config.store, &meter).await
}

/// Serves Lambda invocations until the runtime stops.
pub async fn run<S: QuotaStore, Q: ScanQueue>(
    gate: Arc<Gate<S, Q>>,
) -> Result<(), lambda_http::Error> {
    lambda_http::run(service_fn(move |request: Request| {
        let gate = gate.clone();
        async move {
            let response = gate.handle(to_gate_request(request)).await;
            Ok::<_, Infallible>(to_lambda_response(response))
        }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real deadline counts down; none, or a duration where an instant
    /// belongs (`cargo lambda watch`), is no deadline at all.
    #[test]
    fn deadlines() {
        let now = 1_796_032_800_000;
        assert_eq!(
            remaining_before(now + 3_000, now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(remaining_before(now - 1, now), Some(Duration::ZERO));
        assert_eq!(remaining_before(0, now), None);
        assert_eq!(remaining_before(600_000, now), None);
        assert_eq!(remaining_before(EARLIEST_DEADLINE_MS - 1, now), None);
    }
}
