//! The one place that maps failures to HTTP: 4xx to fix the request, 503 with `Retry-After`.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use crate::rules::settle::Failure;

/// Seconds a client should wait before retrying after a 503.
pub const RETRY_AFTER_SECS: u64 = 1;

/// Why a request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("no such route; use POST /scan")]
    NotFound,
    #[error("only POST is allowed on /scan")]
    MethodNotAllowed,
    #[error("only GET and HEAD are allowed on /quota")]
    QuotaMethodNotAllowed,
    #[error("the body must be JSON: send Content-Type: application/json")]
    UnsupportedMediaType,
    #[error("the body is larger than 64 KiB")]
    PayloadTooLarge,
    /// `serve` gave up reading a body that stopped arriving.
    #[error("the body did not arrive within {} s", after.as_secs())]
    BodyTimeout { after: Duration },
    /// The body is not a valid scan request; `code` says which rule it broke.
    #[error("{detail}")]
    BadRequest { code: &'static str, detail: String },
    #[error("Idempotency-Key must be 1 to 255 visible ASCII characters")]
    InvalidIdempotencyKey,
    /// `Idempotency-Key` was sent more than once: which one is meant is unknown.
    #[error(
        "Idempotency-Key was sent {count} times; send it once (1 to 255 visible ASCII characters)"
    )]
    RepeatedIdempotencyKey { count: usize },
    #[error("this Idempotency-Key was used with a different request body")]
    IdempotencyMismatch,
    #[error("a request with this Idempotency-Key is still in flight; retry after it answers")]
    IdempotencyInProgress { retry_after: u64 },
    /// The quota store failed and the gate fails closed; a count that may still land is taken back.
    #[error("the quota store is unavailable; the scan was not counted; retry shortly")]
    StoreUnavailable,
    /// The store did not answer a keyed scan's count: it may still land, and nothing was queued.
    #[error(
        "the quota store did not answer in time: the scan may have been counted and was not queued; \
         retry with the same Idempotency-Key to settle it (one job, one count)"
    )]
    StoreUnsettled,
    /// The subject's paced backlog would exceed `QUOTA_MAX_BACKLOG_MS`.
    #[error(
        "too many of your scans are already waiting; not counted, nothing queued; retry after Retry-After seconds"
    )]
    BacklogFull { retry_after: u64 },
    /// The scan could not be queued: refused (refunded) or timed out (the job may still land).
    #[error("{}", match queued {
        Queued::No => "the scan could not be queued and was not counted; retry shortly",
        Queued::Unknown => "the scan queue did not answer in time: the scan may still be queued; \
            retry with the same Idempotency-Key to settle it (one job, one count)",
    })]
    QueueFailed { queued: Queued },
    #[error("the quota store is unavailable; your quota cannot be read now; retry shortly")]
    QuotaUnavailable,
    /// The platform gave no source address; a deployment fault, not the client's.
    #[error("the request carries no source address")]
    NoSourceAddress,
}

/// Whether a refused scan's job may still land.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// Nothing was queued, and nothing will be.
    No,
    /// The queue did not answer in time: the job may land later.
    Unknown,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    queued: Option<serde_json::Value>,
    /// `"unknown"` when the count may still land (a keyed retry settles it).
    #[serde(skip_serializing_if = "Option::is_none")]
    counted: Option<&'static str>,
}

impl GateError {
    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            detail: detail.into(),
        }
    }

    /// What the client is told of a failed enqueue, for counted and exempt scans alike.
    pub fn queue_failed(failure: Failure) -> Self {
        let queued = match failure {
            Failure::NotQueued => Queued::No,
            Failure::QueueUnknown | Failure::Store { .. } | Failure::BacklogFull => Queued::Unknown,
        };
        Self::QueueFailed { queued }
    }

    /// 503 `backlog_full`, retried when a slot frees up, never past the counter's reset.
    pub fn backlog_full(retry_after_ms: u64, seconds_to_reset: Option<u64>) -> Self {
        Self::BacklogFull {
            retry_after: crate::rules::pace::retry_after_secs(retry_after_ms, seconds_to_reset),
        }
    }

    /// Whether the gate's own infrastructure failed (worth a log line); a full backlog is not.
    pub fn is_our_failure(&self) -> bool {
        self.status().is_server_error() && !matches!(self, Self::BacklogFull { .. })
    }

    pub fn status(&self) -> StatusCode {
        self.kind().0
    }

    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        self.kind().1
    }

    /// The status and the code, by variant.
    fn kind(&self) -> (StatusCode, &'static str) {
        match self {
            Self::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Self::MethodNotAllowed | Self::QuotaMethodNotAllowed => {
                (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed")
            }
            Self::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::BodyTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            Self::BadRequest { code, .. } => (StatusCode::BAD_REQUEST, code),
            Self::InvalidIdempotencyKey | Self::RepeatedIdempotencyKey { .. } => {
                (StatusCode::BAD_REQUEST, "invalid_idempotency_key")
            }
            Self::IdempotencyMismatch => {
                (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_mismatch")
            }
            Self::IdempotencyInProgress { .. } => (StatusCode::CONFLICT, "idempotency_in_progress"),
            Self::StoreUnavailable | Self::StoreUnsettled | Self::QuotaUnavailable => {
                (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable")
            }
            Self::BacklogFull { .. } => (StatusCode::SERVICE_UNAVAILABLE, "backlog_full"),
            Self::QueueFailed { .. } => (StatusCode::SERVICE_UNAVAILABLE, "queue_unavailable"),
            Self::NoSourceAddress => (StatusCode::INTERNAL_SERVER_ERROR, "no_source_address"),
        }
    }

    /// The JSON error response.
    pub fn to_response(&self) -> Response<Bytes> {
        let queued = match self {
            Self::QueueFailed {
                queued: Queued::Unknown,
            } => Some(serde_json::Value::from("unknown")),
            Self::QueueFailed { queued: Queued::No }
            | Self::StoreUnavailable
            | Self::StoreUnsettled
            | Self::BacklogFull { .. } => Some(serde_json::Value::from(false)),
            _ => None,
        };
        let body = serde_json::to_vec(&ErrorBody {
            error: self.code(),
            detail: self.to_string(),
            queued,
            counted: matches!(self, Self::StoreUnsettled).then_some("unknown"),
        })
        .unwrap_or_default();
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        match self {
            Self::MethodNotAllowed => {
                headers.insert(header::ALLOW, HeaderValue::from_static("POST"));
            }
            Self::QuotaMethodNotAllowed => {
                headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            }
            Self::StoreUnavailable
            | Self::StoreUnsettled
            | Self::QuotaUnavailable
            | Self::QueueFailed { .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            }
            Self::BacklogFull { retry_after } | Self::IdempotencyInProgress { retry_after } => {
                headers.insert(
                    header::RETRY_AFTER,
                    HeaderValue::from((*retry_after).max(1)),
                );
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Error bodies are JSON with `error` and `detail`; 503s carry Retry-After.
    #[test]
    fn shapes() {
        let r = GateError::QueueFailed { queued: Queued::No }.to_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["error"], "queue_unavailable");
        assert_eq!(body["queued"], false);
        assert!(body["detail"].as_str().unwrap().contains("not counted"));

        let r = GateError::QueueFailed {
            queued: Queued::Unknown,
        }
        .to_response();
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["queued"], "unknown");
        assert!(body["detail"].as_str().unwrap().contains("Idempotency-Key"));

        let r = GateError::BacklogFull { retry_after: 7 }.to_response();
        assert_eq!(
            (r.status().as_u16(), &r.headers()[header::RETRY_AFTER]),
            (503, &"7".parse::<HeaderValue>().unwrap())
        );
        let r = GateError::backlog_full(86_401_000, Some(9_282)).to_response();
        assert_eq!(
            r.headers()[header::RETRY_AFTER],
            "9282",
            "capped at the reset"
        );
        let r = GateError::backlog_full(29_001, Some(9_282)).to_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "30");
        let r = GateError::backlog_full(30_000, Some(0)).to_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "1", "never 0");

        let r = GateError::RepeatedIdempotencyKey { count: 2 }.to_response();
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(
            (r.status().as_u16(), &body["error"]),
            (400, &"invalid_idempotency_key".into())
        );
        assert!(
            body["detail"].as_str().unwrap().contains("sent 2 times"),
            "{body}"
        );

        let r = GateError::IdempotencyInProgress { retry_after: 0 }.to_response();
        assert_eq!(
            (r.status().as_u16(), &r.headers()[header::RETRY_AFTER]),
            (409, &"1".parse::<HeaderValue>().unwrap())
        );
        assert_eq!(GateError::IdempotencyMismatch.status(), 422);

        let r = GateError::MethodNotAllowed.to_response();
        assert_eq!(r.headers()[header::ALLOW], "POST");
    }

    /// A body that stopped arriving is 408 `request_timeout`, saying how long `serve` waited.
    #[test]
    fn body_timeout() {
        let after = Duration::from_secs(10);
        let r = GateError::BodyTimeout { after }.to_response();
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(
            (r.status().as_u16(), &body["error"], &body["detail"]),
            (
                408,
                &"request_timeout".into(),
                &"the body did not arrive within 10 s".into()
            )
        );
    }
}
