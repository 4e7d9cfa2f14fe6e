//! `GET /quota`: a client's own quota, without spending it (GitHub's
//! `GET /rate_limit` is the model: it "does not count against your rate
//! limit").
//!
//! The gate reads the subject's counter, its expiry, the pacing slot and
//! any grant in one round trip ([`crate::store::QuotaStore::peek`]); this
//! module turns that reading into the answer. It is pure, like
//! [`crate::decide`]: what the next `POST /scan` would get comes from the
//! rules the scan itself follows, called, not copied: `decide(used + 1)`
//! against `limit + grant`, [`settle::decided_delay_rule`] for where its
//! delay comes from, and [`crate::pace::next_slot`] for a paced one.
//! Its quota headers are every answer's ([`respond::Standing`]).
//! The answer never guesses: with the store down the gate answers 503.
//! In shadow mode it carries a [`ShadowVerdict`] (defined with the decision
//! in [`crate::decide`], re-exported here).

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde::Serialize;

use crate::clock::rfc3339;
use crate::config::{Mode, Pacing};
pub use crate::decide::ShadowVerdict;
use crate::decide::{Limits, decide};
use crate::digest::Scope;
use crate::identity::TokenStatus;
use crate::pace::next_slot;
use crate::record::Peek;
use crate::respond::{self, Standing};
use crate::settle::{self, DelayRule};
use crate::unix::{UnixMillis, duration_ms};

/// Whether `path` names the quota route: `/quota`, or `/<stage>/quota`
/// when API Gateway keeps a named stage in the path (as for `/scan`).
pub fn is_quota_path(path: &str) -> bool {
    match path.strip_suffix("/quota") {
        Some("") => true,
        Some(prefix) => prefix.starts_with('/') && !prefix[1..].contains('/') && prefix.len() > 1,
        None => false,
    }
}

/// What the policy says about the next scan, besides the limits.
#[derive(Debug, Clone, Copy)]
pub struct NextScanRules {
    pub mode: Mode,
    pub pacing: Pacing,
    pub max_backlog: Duration,
}

/// What the next `POST /scan` of the subject would get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NextScan {
    /// `within`, `soft`, `hard` (the decided tier) or `exempt`.
    pub tier: &'static str,
    /// The delay it would be given (0 in shadow mode: nobody waits).
    pub delay_ms: u64,
    /// Set when it would be refused with 503 `backlog_full`: the seconds
    /// after which a slot within `QUOTA_MAX_BACKLOG_MS` frees up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlog_full_retry_after: Option<u64>,
    /// In shadow mode: what enforcement would do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowVerdict>,
}

/// The next scan of a subject whose store reads `peek` at `now_ms`, under
/// `limits` (before the grant, which this adds).
pub fn next_scan(
    peek: &Peek,
    limits: Limits,
    rules: NextScanRules,
    now_ms: UnixMillis,
) -> NextScan {
    let decision = decide(peek.used + 1, &limits.with_grant(peek.grant));
    let shadow = rules.mode == Mode::Shadow;
    let plain = |delay_ms| NextScan {
        tier: decision.tier.as_str(),
        delay_ms,
        backlog_full_retry_after: None,
        shadow: shadow.then(|| ShadowVerdict::new(decision.tier, decision.delay)),
    };
    let tier_delay = match settle::decided_delay_rule(&decision, shadow, rules.pacing) {
        DelayRule::Fixed(delay) => return plain(duration_ms(delay)),
        DelayRule::Pace(tier_delay) => duration_ms(tier_delay),
    };
    let cap = duration_ms(rules.max_backlog);
    match next_slot(peek.slot_ms.unwrap_or_default(), now_ms, tier_delay, cap) {
        Ok(slot) => plain(u64::try_from(slot.get() - now_ms.get()).unwrap_or(0)),
        Err(retry_after_ms) => NextScan {
            backlog_full_retry_after: Some(retry_after_ms.div_ceil(1000).max(1)),
            ..plain(0)
        },
    }
}

/// The `GET /quota` answer for a counted subject.
#[derive(Debug, Clone)]
pub struct QuotaView {
    pub scope: Scope,
    pub used: u64,
    /// The limit with the grant added, what is left, and when the period
    /// ends: the counter's expiry, or when a new counter would expire.
    pub standing: Standing,
    pub next: NextScan,
    pub token: Option<TokenStatus>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    quota: Quota<'a>,
    next_scan: NextScan,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<respond::TokenBody>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Quota<'a> {
    scope: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    used: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_at: Option<&'a str>,
}

impl QuotaView {
    /// 200 with the quota, the next scan, and the IETF `RateLimit` headers.
    pub fn to_response(&self) -> Response<Bytes> {
        let reset_at = rfc3339(self.standing.reset_at);
        let body = Body {
            quota: Quota {
                scope: self.scope.as_str(),
                limit: Some(self.standing.limit),
                used: Some(self.used),
                remaining: Some(self.standing.remaining),
                reset_at: Some(&reset_at),
            },
            next_scan: self.next,
            token: self.token.map(respond::TokenBody::from),
        };
        ok(&body, &self.standing)
    }
}

/// The `GET /quota` answer for an exempt caller: no limit in the body, and
/// the next scan is exempt too; the quota headers, as an exempt 202's, say
/// where its own quota stands (`standing`).
pub fn exempt_response(token: Option<TokenStatus>, standing: &Standing) -> Response<Bytes> {
    let body = Body {
        quota: Quota {
            scope: "exempt",
            limit: None,
            used: None,
            remaining: None,
            reset_at: None,
        },
        next_scan: NextScan {
            tier: "exempt",
            delay_ms: 0,
            backlog_full_retry_after: None,
            shadow: None,
        },
        token: token.map(respond::TokenBody::from),
    };
    ok(&body, standing)
}

fn ok(body: &Body<'_>, standing: &Standing) -> Response<Bytes> {
    let json = serde_json::to_vec(body).unwrap_or_default();
    let reset_at = rfc3339(standing.reset_at);
    respond::answer(StatusCode::OK, json, standing, &reset_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::respond::{POLICY, QUOTA_STATE, RATELIMIT, RESET};
    use crate::unix::UnixSecs;
    use std::num::NonZeroU32;

    const NOW: i64 = 1_796_000_000_000;

    fn limits() -> Limits {
        Limits {
            limit: NonZeroU32::new(3).unwrap(),
            soft_window: 2,
            soft_delay: Duration::from_secs(5),
            hard_delay: Duration::from_secs(60),
            warn_at: NonZeroU32::new(100).unwrap(),
        }
    }

    fn rules(mode: Mode, pacing: Pacing) -> NextScanRules {
        NextScanRules {
            mode,
            pacing,
            max_backlog: Duration::from_secs(120),
        }
    }

    fn peek(used: u64, slot_ms: Option<i64>, grant: u64) -> Peek {
        Peek {
            used,
            reset_at: Some(UnixSecs(NOW / 1000 + 3600)),
            slot_ms: slot_ms.map(UnixMillis),
            grant,
        }
    }

    /// `/quota` and `/<stage>/quota` only.
    #[test]
    fn paths() {
        assert!(is_quota_path("/quota"));
        assert!(is_quota_path("/prod/quota"));
        assert!(!is_quota_path("/quota/"));
        assert!(!is_quota_path("/a/b/quota"));
        assert!(!is_quota_path("/scan"));
    }

    /// Within, soft, hard and paced: the next scan's tier and delay follow
    /// the scan's own rules, a grant included.
    #[test]
    fn next_scan_follows_the_scan_rules() {
        let on = rules(Mode::Enforce, Pacing::On);
        let n = |p: Peek| next_scan(&p, limits(), on, UnixMillis(NOW));
        assert_eq!(
            (n(peek(0, None, 0)).tier, n(peek(0, None, 0)).delay_ms),
            ("within", 0)
        );
        assert_eq!(n(peek(3, None, 0)).tier, "soft");
        assert_eq!(n(peek(3, None, 0)).delay_ms, 5_000);
        assert_eq!(n(peek(5, None, 0)).delay_ms, 60_000);
        // A slot 10 s ahead: the soft scan starts 5 s after it.
        assert_eq!(n(peek(3, Some(NOW + 10_000), 0)).delay_ms, 15_000);
        // A grant of 2 makes the 4th and 5th scans within.
        assert_eq!(n(peek(4, None, 2)).tier, "within");
        assert_eq!(n(peek(5, None, 2)).tier, "soft");
        // Past the cap: refused, with when to retry.
        let full = n(peek(5, Some(NOW + 100_000), 0));
        assert_eq!(full.backlog_full_retry_after, Some(40));
        // Pacing off: the tier's delay, whatever the slot.
        let off = next_scan(
            &peek(3, Some(NOW + 10_000), 0),
            limits(),
            rules(Mode::Enforce, Pacing::Off),
            UnixMillis(NOW),
        );
        assert_eq!(off.delay_ms, 5_000);
    }

    /// In shadow mode nobody waits; the verdict says what enforcement would do.
    #[test]
    fn shadow_waits_for_nothing() {
        let n = next_scan(
            &peek(5, Some(NOW + 10_000), 0),
            limits(),
            rules(Mode::Shadow, Pacing::On),
            UnixMillis(NOW),
        );
        assert_eq!((n.tier, n.delay_ms), ("hard", 0));
        assert_eq!(
            n.shadow,
            Some(ShadowVerdict {
                tier: "hard",
                delay_ms: 60_000
            })
        );
    }

    /// The answer's body and headers: quota, next scan, RateLimit; exempt has neither limit nor RateLimit.
    #[test]
    fn answers() {
        let view = QuotaView {
            scope: Scope::Ip,
            used: 2,
            standing: standing(),
            next: next_scan(
                &peek(2, None, 0),
                limits(),
                rules(Mode::Enforce, Pacing::On),
                UnixMillis(NOW),
            ),
            token: None,
        };
        let r = view.to_response();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()[&RATELIMIT], "\"daily\";r=1;t=600");
        assert_eq!(r.headers()[&POLICY], "\"daily\";q=3;w=86400");
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "quota": {"scope": "ip", "limit": 3, "used": 2, "remaining": 1, "resetAt": "2026-12-01T00:00:00Z"},
                "nextScan": {"tier": "within", "delayMs": 0}
            })
        );
        let r = exempt_response(None, &standing());
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["quota"], serde_json::json!({"scope": "exempt"}));
        assert_eq!(body["nextScan"]["tier"], "exempt");
        // The quota headers an exempt 202 carries: the caller's own quota.
        assert_eq!(r.headers()[&RATELIMIT], "\"daily\";r=1;t=600");
        assert_eq!(r.headers()[&POLICY], "\"daily\";q=3;w=86400");
        assert_eq!(r.headers()[&RESET], "2026-12-01T00:00:00Z");
        assert!(r.headers().get(&QUOTA_STATE).is_none());
        let unread = Standing {
            unavailable: true,
            ..standing()
        };
        let r = exempt_response(None, &unread);
        assert_eq!(r.headers()[&QUOTA_STATE], "unavailable");
    }

    /// Two of three scans used, the period ending in 600 s.
    fn standing() -> Standing {
        Standing {
            limit: 3,
            remaining: 1,
            reset_at: 1_796_083_200,
            seconds_to_reset: 600,
            unavailable: false,
        }
    }
}
