//! Liveness and readiness for `serve` and `consume`: `/healthz` answers without touching anything,
//! `/readyz` only when the store answers a `PING` within [`READY_TIMEOUT`]. A Valkey that is away
//! makes the gate not ready, never dead, so it is not restarted for what a restart cannot mend.

use std::time::Duration;

use http::StatusCode;

use crate::io::store::SendError;

/// How long `/readyz` waits for the store: under a probe's timeout (1 s by default in Kubernetes).
pub const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// `/healthz`'s body.
pub const ALIVE: &str = "ok\n";

/// 200, or 503 with why in a word, never the store's own message, which may name its address.
pub fn readiness(store: &Result<(), SendError>) -> (StatusCode, &'static str) {
    let body = match store {
        Ok(()) => return (StatusCode::OK, r#"{"ready":true}"#),
        Err(SendError::NotSent(_) | SendError::Skipped) => {
            r#"{"ready":false,"store":"unreachable"}"#
        }
        Err(SendError::Unanswered) => r#"{"ready":false,"store":"no_answer"}"#,
        Err(SendError::Refused(_)) => r#"{"ready":false,"store":"refused"}"#,
    };
    (StatusCode::SERVICE_UNAVAILABLE, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only an answer is ready; each failure says its kind in JSON, without
    /// the store's message.
    #[test]
    fn answers() {
        assert_eq!(readiness(&Ok(())).0, StatusCode::OK);
        for (e, word) in [
            (
                SendError::NotSent("10.0.0.9:6379 refused".into()),
                "unreachable",
            ),
            (SendError::Unanswered, "no_answer"),
            (SendError::Refused("NOAUTH".into()), "refused"),
        ] {
            let (status, body) = readiness(&Err(e));
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            let json: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(json["store"], word);
            assert!(!body.contains("10.0.0.9"));
        }
    }
}
