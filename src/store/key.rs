//! The keys of one subject, and when its period ends.
//!
//! Every key of a subject shares the digest as its hash tag, so one subject
//! lives in one cluster slot (the layout is the table in [`crate::store`]).

use sha2::{Digest as _, Sha256};

use crate::config::ResetPolicy;
use crate::digest::{Digest, Scope};
use crate::unix::UnixSecs;

/// The pattern matching every key the gate writes.
pub const KEY_PATTERN: &str = "quota:*";

/// How long an idempotency record answers repeats of its key.
pub const IDEMPOTENCY_TTL_SECS: i64 = 86_400;

/// The keys of one subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKey {
    pub counter: String,
    pub first_seen: String,
    pub slot: String,
    /// Extra scans granted for the period: read with every count, in the
    /// same round trip, and added to the limit the scan is decided against.
    pub grant: String,
}

impl QuotaKey {
    /// Built once per request, by concatenation (no `format!`).
    pub fn new(scope: Scope, digest: &Digest) -> Self {
        let counter = ["quota:", scope.as_str(), ":{", digest.as_str(), "}"].concat();
        let beside = |suffix: &str| [counter.as_str(), suffix].concat();
        Self {
            first_seen: beside(":ts"),
            slot: beside(":slot"),
            grant: beside(":grant"),
            counter,
        }
    }

    /// The record key of one `Idempotency-Key`: a digest of the client's
    /// key (which may be anything visible), beside the subject's counter.
    pub fn idempotency(&self, client_key: &str) -> String {
        let hash = Sha256::digest(client_key.as_bytes());
        format!("{}:idem:{}", self.counter, hex::encode(&hash[..16]))
    }

    /// A `SCAN MATCH` pattern for every key of the subject.
    pub fn pattern(&self) -> String {
        format!("{}*", self.counter)
    }
}

/// When a new counter expires: the next 00:00 UTC after `now`, or 24 h on.
pub fn period_end(reset: ResetPolicy, now: UnixSecs) -> UnixSecs {
    let now = now.get();
    UnixSecs(match reset {
        ResetPolicy::Rolling => now + 86_400,
        ResetPolicy::UtcDay => now - now.rem_euclid(86_400) + 86_400,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Hasher;

    /// Keys follow the spec's layout, with the digest as the hash tag.
    #[test]
    fn key_layout() {
        let d = Hasher::new(b"0123456789abcdef").digest(Scope::Ip, "203.0.113.7");
        let k = QuotaKey::new(Scope::Ip, &d);
        assert_eq!(k.counter, format!("quota:ip:{{{d}}}"));
        assert_eq!(k.first_seen, format!("quota:ip:{{{d}}}:ts"));
        assert_eq!(k.slot, format!("quota:ip:{{{d}}}:slot"));
        assert_eq!(k.grant, format!("quota:ip:{{{d}}}:grant"));
        assert!(
            k.grant
                .starts_with(&k.pattern().trim_end_matches('*').to_owned())
        );
        let idem = k.idempotency("retry-1");
        assert!(idem.starts_with(&format!("quota:ip:{{{d}}}:idem:")));
        assert_eq!(idem.len(), k.counter.len() + 6 + 32);
        assert_ne!(idem, k.idempotency("retry-2"));
        let k = QuotaKey::new(Scope::Tid, &d);
        assert!(k.counter.starts_with("quota:tid:{"));
    }
}
