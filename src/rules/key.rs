//! The keys of one subject and when its period ends. They share the digest as their hash tag, so a
//! subject lives in one cluster slot (the layout: [`crate::io::store`]).

use sha2::{Digest as _, Sha256};

use crate::rules::digest::Digest;
use crate::rules::modes::ResetPolicy;
use crate::rules::scope::Scope;
use crate::rules::unix::{DAY_SECS, UnixSecs};

/// The pattern matching every key the gate writes.
pub const KEY_PATTERN: &str = "quota:*";

/// How long an idempotency record answers repeats of its key.
pub const IDEMPOTENCY_TTL_SECS: i64 = DAY_SECS;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKey {
    pub counter: String,
    pub first_seen: String,
    pub slot: String,
    /// Extra scans granted for the period, added to the limit; it lasts as long as the counter's
    /// period (under `rolling`, set before the first scan, it gets the counter's expiry from the
    /// count opening it). A level's grant is held in its counter; this key says how much.
    pub grant: String,
}

impl QuotaKey {
    /// Built once per request, by concatenation (no `format!`).
    pub fn new(scope: Scope, digest: &Digest) -> Self {
        Self::named(scope.as_str(), digest, true)
    }

    /// The keys of a level above the subject (`quota:net:{<digest>}`), in a slot of their own.
    pub fn level(digest: &Digest) -> Self {
        Self::named("net", digest, false)
    }

    /// A level has no first-seen key (one allocation less per level).
    fn named(kind: &str, digest: &Digest, first_seen: bool) -> Self {
        let counter = ["quota:", kind, ":{", digest.as_str(), "}"].concat();
        let beside = |suffix: &str| [counter.as_str(), suffix].concat();
        Self {
            first_seen: if first_seen {
                beside(":ts")
            } else {
                String::new()
            },
            slot: beside(":slot"),
            grant: beside(":grant"),
            counter,
        }
    }

    /// The record key of an `Idempotency-Key`, hashed (the client's key may be anything visible).
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
        ResetPolicy::Rolling => now + DAY_SECS,
        ResetPolicy::UtcDay => now - now.rem_euclid(DAY_SECS) + DAY_SECS,
    })
}

/// When a grant made at `now` with no counter expires; `None` under `rolling`: its count sets it.
pub fn grant_period_end(reset: ResetPolicy, now: UnixSecs) -> Option<UnixSecs> {
    match reset {
        ResetPolicy::UtcDay => Some(period_end(reset, now)),
        ResetPolicy::Rolling => None,
    }
}

/// The reset every answer reports: the counter's expiry, or when one opened at `now` would expire.
pub fn resets_at(reset: ResetPolicy, counter_expiry: Option<UnixSecs>, now: UnixSecs) -> UnixSecs {
    counter_expiry.unwrap_or_else(|| period_end(reset, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::digest::Hasher;

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

    /// The reset instant: the counter's expiry, or where a new counter's
    /// would be under each `QUOTA_RESET`.
    #[test]
    fn reset_instant() {
        // 2026-11-30T10:00:00Z
        let now = UnixSecs(1_796_032_800);
        let midnight = UnixSecs(1_796_083_200);
        let expiry = Some(UnixSecs(1_796_040_000));
        for reset in [ResetPolicy::UtcDay, ResetPolicy::Rolling] {
            assert_eq!(resets_at(reset, expiry, now), UnixSecs(1_796_040_000));
        }
        assert_eq!(resets_at(ResetPolicy::UtcDay, None, now), midnight);
        assert_eq!(
            resets_at(ResetPolicy::Rolling, None, now),
            UnixSecs(now.get() + DAY_SECS)
        );
    }
}
