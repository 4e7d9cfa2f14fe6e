//! The one place that maps failures to HTTP.
//!
//! Variants are named after what the caller can do about them: fix the
//! request (4xx) or retry later (503 with `Retry-After`). Bodies are
//! `{"error": "<code>", "detail": "<sentence>"}`.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

/// Seconds a client should wait before retrying after a 503.
pub const RETRY_AFTER_SECS: u64 = 1;

/// Why a request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("no such route; use POST /scan")]
    NotFound,
    #[error("only POST is allowed on /scan")]
    MethodNotAllowed,
    #[error("the body must be JSON: send Content-Type: application/json")]
    UnsupportedMediaType,
    #[error("the body is larger than 64 KiB")]
    PayloadTooLarge,
    /// The body is not a valid scan request; `code` says which rule it broke.
    #[error("{detail}")]
    BadRequest { code: &'static str, detail: String },
    /// The quota store failed and the gate fails closed.
    #[error("the quota store is unavailable; retry shortly")]
    StoreUnavailable,
    /// The scan could not be queued; its count was refunded.
    #[error("the scan could not be queued and was not counted; retry shortly")]
    QueueFailed,
    /// The platform gave no source address; a deployment fault, not the client's.
    #[error("the request carries no source address")]
    NoSourceAddress,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    detail: String,
}

impl GateError {
    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::BadRequest {
            code,
            detail: detail.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BadRequest { .. } => StatusCode::BAD_REQUEST,
            Self::StoreUnavailable | Self::QueueFailed => StatusCode::SERVICE_UNAVAILABLE,
            Self::NoSourceAddress => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// A stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::PayloadTooLarge => "payload_too_large",
            Self::BadRequest { code, .. } => code,
            Self::StoreUnavailable => "store_unavailable",
            Self::QueueFailed => "queue_unavailable",
            Self::NoSourceAddress => "no_source_address",
        }
    }

    /// The JSON error response.
    pub fn to_response(&self) -> Response<Bytes> {
        let body = serde_json::to_vec(&ErrorBody {
            error: self.code(),
            detail: self.to_string(),
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
            Self::StoreUnavailable | Self::QueueFailed => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
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
        let r = GateError::QueueFailed.to_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["error"], "queue_unavailable");
        assert!(body["detail"].as_str().unwrap().contains("not counted"));

        let r = GateError::MethodNotAllowed.to_response();
        assert_eq!(r.headers()[header::ALLOW], "POST");
    }
}
