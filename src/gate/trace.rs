//! The trace a request belongs to and its steps' spans. A request's [`TraceContext`] is the first
//! of: the front end's (Lambda's X-Ray context, which a client cannot set), the client's W3C
//! `traceparent` and `tracestate`, a proxy's `X-Amzn-Trace-Id`, or a new one. A malformed header
//! is passed over, never refused. Each step's span (target [`STEP_TARGET`]) carries `traceId`.

use http::HeaderMap;

use crate::rules::trace::{SpanId, TRACEPARENT, TRACESTATE, TraceContext, XRAY_HEADER};
use crate::rules::unix::UnixMillis;

/// The steps' spans' target: `RUST_LOG=info,quota_gate::step=off` leaves their lines out.
pub const STEP_TARGET: &str = "quota_gate::step";

/// A step's span (`count`, `pace`, `sleep`, `enqueue`) in the trace `$trace`.
macro_rules! step {
    ($name:literal, $trace:expr) => {
        tracing::info_span!(
            target: $crate::gate::trace::STEP_TARGET,
            $name,
            traceId = $trace.map(|t| tracing::field::display(t))
        )
    };
}
pub(crate) use step;

/// The request's trace, by the order in the module's docs.
pub fn resolve(
    given: Option<TraceContext>,
    headers: &HeaderMap,
    now_ms: UnixMillis,
) -> TraceContext {
    given
        .or_else(|| w3c(headers))
        .or_else(|| one(headers, XRAY_HEADER).and_then(from_xray_header))
        .unwrap_or_else(|| {
            let secs = u32::try_from(now_ms.get().div_euclid(1000)).unwrap_or(0);
            TraceContext::start(secs, random())
        })
}

/// An X-Ray header's context; one without a `Parent` hangs under a new span.
pub fn from_xray_header(header: &str) -> Option<TraceContext> {
    let spare = random();
    let mut span = [0u8; 8];
    span.copy_from_slice(&spare[..8]);
    span[7] |= 1;
    TraceContext::from_xray(header, SpanId::new(span)?)
}

/// The client's `traceparent` (exactly one) and its `tracestate` values joined by `,`, per spec.
fn w3c(headers: &HeaderMap) -> Option<TraceContext> {
    let parent = one(headers, TRACEPARENT)?;
    let states: Result<Vec<&str>, _> = headers
        .get_all(TRACESTATE)
        .iter()
        .map(|v| v.to_str())
        .collect();
    let state = states.ok().filter(|s| !s.is_empty()).map(|s| s.join(","));
    TraceContext::from_w3c(parent, state.as_deref())
}

/// The header `name` when it is there exactly once, as text.
fn one<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => v.to_str().ok(),
        _ => None,
    }
}

/// 20 random bytes: 12 of a trace id, 8 of a span id.
fn random() -> [u8; 20] {
    // A v4 UUID's bytes 0–5 and 10–15 are random (6 and 8 carry its version).
    let (a, b) = (
        uuid::Uuid::new_v4().into_bytes(),
        uuid::Uuid::new_v4().into_bytes(),
    );
    let mut out = [0u8; 20];
    out[..6].copy_from_slice(&a[..6]);
    out[6..12].copy_from_slice(&a[10..]);
    out[12..18].copy_from_slice(&b[..6]);
    out[18..].copy_from_slice(&b[10..12]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const XRAY: &str = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    /// The front end's context first, then the client's traceparent, then
    /// a proxy's X-Ray header, then a new trace in the request's second.
    #[test]
    fn precedence() {
        let now = UnixMillis(1_465_510_280_000);
        let given = from_xray_header(XRAY);
        let both = headers(&[
            (TRACEPARENT, TP),
            (XRAY_HEADER, "Root=1-00000001-000000000000000000000001"),
        ]);
        assert_eq!(resolve(given.clone(), &both, now), given.unwrap());
        assert_eq!(resolve(None, &both, now).trace_id.to_string(), &TP[3..35]);
        let xray = headers(&[(XRAY_HEADER, XRAY), (TRACEPARENT, "00-bad")]);
        assert_eq!(
            resolve(None, &xray, now).trace_id.to_string(),
            "5759e988bd862e3fe1be46a994272793"
        );
        let fresh = resolve(None, &HeaderMap::new(), now);
        assert!(fresh.trace_id.xray().as_str().starts_with("1-5759e988-"));
        assert_ne!(fresh, resolve(None, &HeaderMap::new(), now));
    }

    /// Two traceparents are none; tracestate headers are joined.
    #[test]
    fn repeated_headers() {
        let two = headers(&[(TRACEPARENT, TP), (TRACEPARENT, TP)]);
        assert!(w3c(&two).is_none());
        let states = headers(&[(TRACEPARENT, TP), (TRACESTATE, "a=1"), (TRACESTATE, "b=2")]);
        assert_eq!(w3c(&states).unwrap().tracestate(), Some("a=1,b=2"));
    }
}
