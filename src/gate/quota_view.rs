//! `GET /quota`: a client's own quota, without spending it. Pure, like [`crate::rules::decide`]:
//! what the next `POST /scan` would get comes from the rules the scan itself follows, called, not
//! copied. The answer never guesses: with the store down the gate answers 503.

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use serde::Serialize;

use crate::config::{Mode, Pacing};
use crate::gate::identity::TokenStatus;
use crate::gate::respond::{self, LevelStanding, Standing};
use crate::io::clock::rfc3339;
use crate::rules::count::Peek;
pub use crate::rules::decide::ShadowVerdict;
use crate::rules::decide::{Decision, Limits, decide};
use crate::rules::level::{Level, LevelName, most_severe};
use crate::rules::pace::{next_start, retry_after_secs};
use crate::rules::scope::Scope;
use crate::rules::settle::{self, DelayRule};
use crate::rules::unix::{UnixMillis, duration_ms};

/// Whether `path` names the quota route, by the same stage rule as `/scan`.
pub fn is_quota_path(path: &str) -> bool {
    crate::gate::validate::is_route(path, "/quota")
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
    /// The level whose decision sets it (`subject`, `v4/24`, …; none when exempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<LevelName>,
    /// The delay it would be given (0 in shadow mode: nobody waits).
    pub delay_ms: u64,
    /// When it would be refused with 503 `backlog_full`: the seconds until a slot frees up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlog_full_retry_after: Option<u64>,
    /// In shadow mode: what enforcement would do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowVerdict>,
}

/// The next scan of a subject whose store reads `peek` (before its grant) and its `levels`' at
/// `now_ms`: the most severe decision sets its tier; paced, it starts after every line delaying it.
pub fn next_scan(
    peek: &Peek,
    limits: Limits,
    levels: &[(Level, Peek)],
    rules: NextScanRules,
    now_ms: UnixMillis,
) -> NextScan {
    let next = |p: &Peek, l: Limits| decide(p.used + 1, &l.with_grant(p.grant));
    let subject = next(peek, limits);
    let decided: Vec<(LevelName, Decision, &Peek)> = levels
        .iter()
        .map(|(l, p)| (l.name, next(p, l.limits), p))
        .collect();
    let (level, decision) = most_severe(subject, decided.iter().map(|(n, d, _)| (*n, *d)));
    let shadow = rules.mode == Mode::Shadow;
    let plain = |delay_ms| NextScan {
        tier: decision.tier.as_str(),
        level: Some(level),
        delay_ms,
        backlog_full_retry_after: None,
        shadow: shadow.then(|| ShadowVerdict::new(decision.tier, decision.delay)),
    };
    if let DelayRule::Fixed(delay) = settle::decided_delay_rule(&decision, shadow, rules.pacing) {
        return plain(duration_ms(delay));
    }
    let line = |p: &Peek, d: &Decision| (p.slot_ms.unwrap_or_default(), duration_ms(d.delay));
    let lines =
        std::iter::once(line(peek, &subject)).chain(decided.iter().map(|(_, d, p)| line(p, d)));
    match next_start(lines, now_ms, duration_ms(rules.max_backlog)) {
        Ok(start) => plain(u64::try_from(start.get() - now_ms.get()).unwrap_or(0)),
        Err(retry_after_ms) => {
            let to_reset = peek.reset_at.map(|at| at.get() - now_ms.secs().get());
            let to_reset = to_reset.map(|s| u64::try_from(s).unwrap_or(0));
            NextScan {
                backlog_full_retry_after: Some(retry_after_secs(retry_after_ms, to_reset)),
                ..plain(0)
            }
        }
    }
}

/// The `GET /quota` answer for a counted subject.
#[derive(Debug, Clone)]
pub struct QuotaView {
    pub scope: Scope,
    pub used: u64,
    /// The limit with the grant added, what is left, and when the period ends.
    pub standing: Standing,
    /// Each level above the subject (none for a token holder).
    pub levels: Vec<LevelStanding>,
    pub next: NextScan,
    pub token: Option<TokenStatus>,
}

/// The answer's body; `Q` is its `quota` (an exempt caller's is only its scope).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a, Q> {
    quota: Q,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    levels: &'a [LevelBody],
    next_scan: NextScan,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<respond::TokenBody>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Quota<'a> {
    scope: &'static str,
    limit: u32,
    used: u64,
    remaining: u64,
    reset_at: &'a str,
}

#[derive(Serialize)]
struct LevelBody {
    level: LevelName,
    limit: u32,
    used: u64,
    remaining: u64,
}

impl QuotaView {
    /// 200 with the quota, its levels, the next scan, and the IETF `RateLimit` headers.
    pub fn to_response(&self) -> Response<Bytes> {
        let reset_at = rfc3339(self.standing.reset_at);
        let levels: Vec<LevelBody> = self
            .levels
            .iter()
            .map(|l| LevelBody {
                level: l.name,
                limit: l.standing.limit,
                used: l.used,
                remaining: l.standing.remaining,
            })
            .collect();
        let body = Body {
            levels: &levels,
            quota: Quota {
                scope: self.scope.as_str(),
                limit: self.standing.limit,
                used: self.used,
                remaining: self.standing.remaining,
                reset_at: &reset_at,
            },
            next_scan: self.next,
            token: self.token.map(respond::TokenBody::from),
        };
        ok(&body, &self.standing, &self.levels)
    }
}

/// The `GET /quota` answer for an exempt caller, with the quota headers of its own standing.
pub fn exempt_response(token: Option<TokenStatus>, standing: &Standing) -> Response<Bytes> {
    let body = Body {
        quota: serde_json::json!({"scope": "exempt"}),
        levels: &[],
        next_scan: NextScan {
            tier: "exempt",
            level: None,
            delay_ms: 0,
            backlog_full_retry_after: None,
            shadow: None,
        },
        token: token.map(respond::TokenBody::from),
    };
    ok(&body, standing, &[])
}

fn ok<Q: Serialize>(
    body: &Body<'_, Q>,
    standing: &Standing,
    levels: &[LevelStanding],
) -> Response<Bytes> {
    let json = serde_json::to_vec(body).unwrap_or_default();
    let reset_at = rfc3339(standing.reset_at);
    respond::answer(StatusCode::OK, json, standing, levels, &reset_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::respond::{POLICY, QUOTA_STATE, RATELIMIT, RESET};
    use crate::rules::key::QuotaKey;
    use crate::rules::unix::UnixSecs;
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
        let n = |p: Peek| next_scan(&p, limits(), &[], on, UnixMillis(NOW));
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
        // Never past the counter's reset, as the scan's own 503 says (the
        // two drifted once: `GET /quota` promised the longer wait).
        let soon = Peek {
            reset_at: Some(UnixSecs(NOW / 1000 + 30)),
            ..peek(5, Some(NOW + 100_000), 0)
        };
        assert_eq!(n(soon).backlog_full_retry_after, Some(30));
        let refused = crate::gate::error::GateError::backlog_full(100_000 - 60_000, Some(30));
        let crate::gate::error::GateError::BacklogFull { retry_after } = refused else {
            unreachable!()
        };
        assert_eq!(n(soon).backlog_full_retry_after, Some(retry_after));
        // Pacing off: the tier's delay, whatever the slot.
        let off = next_scan(
            &peek(3, Some(NOW + 10_000), 0),
            limits(),
            &[],
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
            &[],
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
            levels: Vec::new(),
            next: next_scan(
                &peek(2, None, 0),
                limits(),
                &[],
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
                "nextScan": {"tier": "within", "level": "subject", "delayMs": 0}
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

    fn v4_24() -> LevelName {
        LevelName::Network(crate::rules::networks::Network {
            family: crate::rules::networks::Family::V4,
            len: 24,
        })
    }

    /// A /24 of limit 6 (soft 2 at 5 s, then 60 s) that has counted `used`.
    fn network(used: u64, slot_ms: Option<i64>) -> (Level, Peek) {
        let digest = crate::rules::digest::Hasher::new(b"k").level_digest("v4/24:203.0.113.0");
        let limits = Limits {
            limit: NonZeroU32::new(6).unwrap(),
            ..limits()
        };
        let level = Level::new(v4_24(), QuotaKey::level(&digest), limits);
        (level, peek(used, slot_ms, 0))
    }

    /// The most severe line sets the tier and names the level; paced, the
    /// next scan starts after every line that would delay it.
    #[test]
    fn every_level_counts_for_the_next_scan() {
        let on = rules(Mode::Enforce, Pacing::On);
        let n = |p: Peek, l: &[(Level, Peek)]| next_scan(&p, limits(), l, on, UnixMillis(NOW));
        let within = n(peek(0, None, 0), &[network(2, None)]);
        assert_eq!(
            (within.tier, within.level),
            ("within", Some(LevelName::Subject))
        );
        // The network is over (7th of 6): soft, set by the network.
        let net = n(peek(0, None, 0), &[network(6, Some(NOW + 20_000))]);
        assert_eq!((net.tier, net.level), ("soft", Some(v4_24())));
        assert_eq!(net.delay_ms, 25_000);
        // Both soft: the subject's tie; its own slot is older, the
        // network's holds it later.
        let both = n(
            peek(3, Some(NOW + 1_000), 0),
            &[network(6, Some(NOW + 20_000))],
        );
        assert_eq!((both.tier, both.level), ("soft", Some(LevelName::Subject)));
        assert_eq!(both.delay_ms, 25_000);
        // A hard network outweighs a soft subject.
        let hard = n(peek(3, None, 0), &[network(8, None)]);
        assert_eq!(
            (hard.tier, hard.level, hard.delay_ms),
            ("hard", Some(v4_24()), 60_000)
        );
        // A network's backlog past the cap: refused, as the scan would be.
        let full = n(peek(0, None, 0), &[network(8, Some(NOW + 100_000))]);
        assert_eq!(full.backlog_full_retry_after, Some(40));
        // Shadow: nobody waits, the verdict names the network's tier.
        let shadow = next_scan(
            &peek(0, None, 0),
            limits(),
            &[network(6, None)],
            rules(Mode::Shadow, Pacing::On),
            UnixMillis(NOW),
        );
        assert_eq!((shadow.delay_ms, shadow.level), (0, Some(v4_24())));
        assert_eq!(shadow.shadow.unwrap().tier, "soft");
    }

    /// The levels in the body and the headers: one policy per level, and
    /// `RateLimit` for the fewest remaining.
    #[test]
    fn levels_in_the_answer() {
        let level = network(6, None);
        let view = QuotaView {
            scope: Scope::Ip,
            used: 2,
            standing: standing(),
            levels: vec![LevelStanding {
                name: level.0.name,
                used: 6,
                standing: Standing {
                    limit: 6,
                    remaining: 0,
                    ..standing()
                },
            }],
            next: next_scan(
                &peek(2, None, 0),
                limits(),
                &[level],
                rules(Mode::Enforce, Pacing::On),
                UnixMillis(NOW),
            ),
            token: None,
        };
        let r = view.to_response();
        assert_eq!(
            r.headers()[&POLICY],
            "\"daily\";q=3;w=86400, \"v4-24\";q=6;w=86400"
        );
        assert_eq!(r.headers()[&RATELIMIT], "\"v4-24\";r=0;t=600");
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(
            body["levels"],
            serde_json::json!([{"level": "v4/24", "limit": 6, "used": 6, "remaining": 0}])
        );
        assert_eq!(body["nextScan"]["level"], "v4/24");
        assert_eq!(body["nextScan"]["tier"], "soft");
    }
}
