//! Step 8: the 202 Accepted contract (never 429 under the free tier). Every answer's quota headers,
//! each 202's and `GET /quota`'s, exempt or not, come from one [`Standing`].

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header};
use serde::Serialize;
use uuid::Uuid;

mod standing;

use crate::gate::identity::TokenStatus;
use crate::gate::identity::jwt::{Claim, Rejection};
pub use crate::io::clock::{rfc3339, rfc3339_ms};
use crate::rules::decide::ShadowVerdict;
use crate::rules::delay::DelayPlan;
use crate::rules::level::LevelName;
use crate::rules::scope::Scope;
use crate::rules::unix::duration_ms;
pub use standing::{LevelStanding, Standing, fewest_remaining, policy, ratelimit};

pub const REMAINING: HeaderName = HeaderName::from_static("x-stella-quota-remaining");
pub const RESET: HeaderName = HeaderName::from_static("x-stella-reset");
pub const POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const DELAY: HeaderName = HeaderName::from_static("x-stella-quota-delay-ms");
pub const REMINDER: HeaderName = HeaderName::from_static("x-stella-quota-reminder");
pub const QUOTA_STATE: HeaderName = HeaderName::from_static("x-stella-quota");
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
pub const SHADOW: HeaderName = HeaderName::from_static("x-stella-quota-shadow");

/// Everything the 202 says.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub scan_id: Uuid,
    pub scope: Scope,
    /// `None` when the store was unavailable and the scan was not counted.
    pub used: Option<u64>,
    /// The limit (with any grant), what is left, and when the period ends.
    pub standing: Standing,
    pub plan: DelayPlan,
    /// When the scan may start (unix ms): arrival plus the whole delay.
    pub not_before_ms: i64,
    pub token: Option<TokenStatus>,
    pub reminder: bool,
    /// Shadow mode: what enforcement would have done (the scan waited for nothing).
    pub shadow: Option<ShadowVerdict>,
    /// The level whose decision set the delay (`None`: not counted).
    pub level: Option<LevelName>,
    /// Where each level above the subject stands after this scan.
    pub levels: Vec<LevelStanding>,
}

/// A 202's body; `Q` is its `quota` (an exempt scan's is only its scope).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a, Q> {
    scan_id: Uuid,
    status: &'static str,
    delay_ms: u64,
    slept_ms: u64,
    deferred_ms: u64,
    not_before: &'a str,
    quota: Q,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<TokenBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reminder: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shadow: Option<ShadowVerdict>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Quota<'a> {
    scope: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    level: Option<LevelName>,
    limit: u32,
    used: Option<u64>,
    remaining: u64,
    reset_at: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unavailable: bool,
}

/// What became of a presented token, as every answer says it.
#[derive(Serialize)]
pub struct TokenBody {
    accepted: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    /// The claim a `malformed` token was refused for (`tid`, `account`).
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<&'static str>,
}

impl From<TokenStatus> for TokenBody {
    fn from(t: TokenStatus) -> Self {
        let rejection = match t {
            TokenStatus::Accepted => None,
            TokenStatus::Rejected(r) => Some(r),
        };
        Self {
            accepted: rejection.is_none(),
            reason: rejection.map(Rejection::as_str),
            claim: rejection.and_then(Rejection::claim).map(Claim::as_str),
        }
    }
}

/// A JSON answer with `status`, `Cache-Control: no-store` and the quota headers.
pub fn answer(
    status: StatusCode,
    body: Vec<u8>,
    standing: &Standing,
    levels: &[LevelStanding],
    reset_at: &str,
) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = status;
    // Sized for every header of a 202 at once: no rehash while inserting.
    *response.headers_mut() = HeaderMap::with_capacity(12);
    let h = response.headers_mut();
    let text = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(REMAINING, HeaderValue::from(standing.remaining));
    h.insert(RESET, text(reset_at));
    let lines = std::iter::once((LevelName::Subject, standing.limit));
    let lines = lines.chain(levels.iter().map(|l| (l.name, l.standing.limit)));
    h.insert(POLICY, text(&policy(lines)));
    let (name, least) = fewest_remaining(standing, levels);
    let line = ratelimit(name, least.remaining, least.seconds_to_reset);
    h.insert(RATELIMIT, text(&line));
    if standing.unavailable {
        h.insert(QUOTA_STATE, HeaderValue::from_static("unavailable"));
    }
    response
}

/// The 202 of an exempt scan: queued at once, never counted.
pub fn exempt(
    scan_id: Uuid,
    received_ms: i64,
    token: Option<TokenStatus>,
    standing: &Standing,
) -> Response<Bytes> {
    let not_before = rfc3339_ms(received_ms);
    let body = Body {
        scan_id,
        status: "queued",
        delay_ms: 0,
        slept_ms: 0,
        deferred_ms: 0,
        not_before: &not_before,
        quota: serde_json::json!({"scope": "exempt"}),
        token: token.map(TokenBody::from),
        reminder: None,
        shadow: None,
    };
    let body = serde_json::to_vec(&body).unwrap_or_default();
    let reset_at = rfc3339(standing.reset_at);
    let mut response = answer(StatusCode::ACCEPTED, body, standing, &[], &reset_at);
    response
        .headers_mut()
        .insert(DELAY, HeaderValue::from(0u64));
    response
}

/// A 202 as an idempotency record keeps it: its headers and body.
#[derive(Serialize, serde::Deserialize)]
struct Saved {
    headers: Vec<(String, String)>,
    body: String,
}

pub fn save(response: &Response<Bytes>) -> String {
    let saved = Saved {
        headers: response
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect(),
        body: String::from_utf8_lossy(response.body()).into_owned(),
    };
    serde_json::to_string(&saved).unwrap_or_default()
}

/// The saved answer again, marked `Idempotent-Replayed: true`; `None` if it cannot be read.
pub fn replay(saved: &str) -> Option<Response<Bytes>> {
    let saved: Saved = serde_json::from_str(saved).ok()?;
    let mut response = Response::new(Bytes::from(saved.body));
    *response.status_mut() = StatusCode::ACCEPTED;
    let h = response.headers_mut();
    for (k, v) in saved.headers {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).ok()?,
            HeaderValue::from_str(&v).ok()?,
        );
    }
    h.insert(REPLAYED, HeaderValue::from_static("true"));
    Some(response)
}

impl Accepted {
    /// The reminder: own count past `T_warn`, or a delay a level above set; ASCII, to fit a header.
    pub fn reminder_text(&self, reset_at: &str) -> Option<String> {
        let own = self.used.filter(|_| self.reminder).map(|used| {
            let scans = if used == 1 { "scan" } else { "scans" };
            format!(
                "You have used {used} {scans} today; your daily quota is {} and resets at {reset_at}.",
                self.standing.limit
            )
        });
        let shared = self.level_reminder();
        match (own, shared) {
            (Some(own), Some(shared)) => Some([own, shared].join(" ")),
            (own, shared) => own.or(shared),
        }
    }

    /// Why a level above the subject delayed this scan, and that a token lifts its limit.
    fn level_reminder(&self) -> Option<String> {
        let level = self.level.filter(|l| *l != LevelName::Subject)?;
        let delayed =
            self.plan.total > Duration::ZERO || self.shadow.is_some_and(|v| v.delay_ms > 0);
        let line = self.levels.iter().find(|l| l.name == level);
        let limit = line.filter(|_| delayed)?.standing.limit;
        Some(match level {
            LevelName::Anon => format!(
                "All anonymous scans together ({level}) are over their shared limit of {limit} scans today, so their scans start one delay apart; scanning with a token lifts this limit."
            ),
            LevelName::TokenNetwork(_) => format!(
                "The token holders of your network ({level}) are over their shared limit of {limit} scans today, so their scans start one delay apart."
            ),
            _ => format!(
                "Your network ({level}) is over its shared limit of {limit} scans today, so its scans start one delay apart; scanning with a token lifts the network's limit."
            ),
        })
    }

    fn body_json(&self, reset_at: &str, reminder: Option<&str>) -> Vec<u8> {
        let not_before = rfc3339_ms(self.not_before_ms);
        let body = Body {
            scan_id: self.scan_id,
            status: "queued",
            delay_ms: duration_ms(self.plan.total),
            slept_ms: duration_ms(self.plan.sleep),
            deferred_ms: duration_ms(self.plan.deferred),
            not_before: &not_before,
            quota: Quota {
                scope: self.scope.as_str(),
                level: self.level,
                limit: self.standing.limit,
                used: self.used,
                remaining: self.standing.remaining,
                reset_at,
                unavailable: self.standing.unavailable,
            },
            token: self.token.map(TokenBody::from),
            reminder,
            shadow: self.shadow,
        };
        let mut json = Vec::with_capacity(512);
        if serde_json::to_writer(&mut json, &body).is_err() {
            json.clear();
        }
        json
    }

    pub fn to_response(&self) -> Response<Bytes> {
        let reset_at = rfc3339(self.standing.reset_at);
        let reminder = self.reminder_text(&reset_at);
        let json = self.body_json(&reset_at, reminder.as_deref());
        let mut response = answer(
            StatusCode::ACCEPTED,
            json,
            &self.standing,
            &self.levels,
            &reset_at,
        );
        let h = response.headers_mut();
        h.insert(DELAY, HeaderValue::from(duration_ms(self.plan.total)));
        if let Some(r) = reminder {
            let empty = HeaderValue::from_static("");
            h.insert(REMINDER, HeaderValue::from_str(&r).unwrap_or(empty));
        }
        if let Some(shadow) = &self.shadow {
            h.insert(SHADOW, HeaderValue::from_static(shadow.tier));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::identity::jwt::Rejection;
    use std::time::Duration;

    fn accepted() -> Accepted {
        Accepted {
            scan_id: Uuid::now_v7(),
            scope: Scope::Ip,
            used: Some(34),
            standing: Standing {
                limit: 33,
                remaining: 0,
                reset_at: 1_796_083_200,
                seconds_to_reset: 3600,
                unavailable: false,
            },
            plan: DelayPlan {
                total: Duration::from_secs(5),
                sleep: Duration::from_secs(5),
                deferred: Duration::ZERO,
            },
            not_before_ms: 1_796_079_605_250,
            token: Some(TokenStatus::Rejected(Rejection::Expired)),
            reminder: false,
            shadow: None,
            level: Some(LevelName::Subject),
            levels: Vec::new(),
        }
    }

    fn v4_24() -> LevelName {
        LevelName::Network(crate::rules::networks::Network {
            family: crate::rules::networks::Family::V4,
            len: 24,
        })
    }

    /// A /24 level with `remaining` of 264 left, its period ending in 7200 s.
    fn network(remaining: u64) -> LevelStanding {
        LevelStanding {
            name: v4_24(),
            used: 264 - remaining,
            standing: Standing {
                limit: 264,
                remaining,
                reset_at: 1_796_086_800,
                seconds_to_reset: 7200,
                unavailable: false,
            },
        }
    }

    /// Headers and body follow the response contract.
    #[test]
    fn contract() {
        let r = accepted().to_response();
        assert_eq!(r.status(), 202);
        let h = r.headers();
        assert_eq!(h[&REMAINING], "0");
        assert_eq!(h[&RESET], "2026-12-01T00:00:00Z");
        assert_eq!(h[&POLICY], "\"daily\";q=33;w=86400");
        assert_eq!(h[&RATELIMIT], "\"daily\";r=0;t=3600");
        assert_eq!(h[&DELAY], "5000");
        assert!(h.get(&REMINDER).is_none());
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["status"], "queued");
        assert_eq!(body["delayMs"], 5000);
        assert_eq!(body["sleptMs"], 5000);
        assert_eq!(body["deferredMs"], 0);
        assert_eq!(body["notBefore"], "2026-11-30T23:00:05.250Z");
        assert_eq!(
            body["quota"],
            serde_json::json!({"scope":"ip","level":"subject","limit":33,"used":34,"remaining":0,"resetAt":"2026-12-01T00:00:00Z"})
        );
        assert_eq!(
            body["token"],
            serde_json::json!({"accepted": false, "reason": "expired"})
        );
        assert!(body.get("reminder").is_none());
    }

    /// A saved answer replays with the same headers and body, marked replayed.
    #[test]
    fn save_and_replay() {
        let first = accepted().to_response();
        let again = replay(&save(&first)).unwrap();
        assert_eq!(again.status(), 202);
        assert_eq!(again.body(), first.body());
        assert_eq!(again.headers()[&RATELIMIT], first.headers()[&RATELIMIT]);
        assert_eq!(again.headers()[&REPLAYED], "true");
        assert!(replay("not json").is_none());
    }

    /// The reminder shows in a header and the body; an unavailable store is said so.
    #[test]
    fn reminder_and_unavailable() {
        let mut a = accepted();
        a.reminder = true;
        a.used = Some(200);
        let r = a.to_response();
        assert!(
            r.headers()[&REMINDER]
                .to_str()
                .unwrap()
                .contains("200 scans")
        );
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert!(
            body["reminder"]
                .as_str()
                .unwrap()
                .contains("resets at 2026-12-01T00:00:00Z")
        );

        a.used = Some(1);
        let one = a.reminder_text("x").unwrap();
        assert!(one.starts_with("You have used 1 scan today;"), "{one}");

        a.used = None;
        a.standing.unavailable = true;
        let r = a.to_response();
        assert_eq!(r.headers()[&QUOTA_STATE], "unavailable");
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["quota"]["unavailable"], true);
        assert!(body["quota"]["used"].is_null());
    }

    /// One policy per level, the subject's first; `RateLimit` names the
    /// one with the fewest remaining, the subject on a tie.
    #[test]
    fn a_policy_per_level() {
        assert_eq!(
            policy([(LevelName::Subject, 33), (v4_24(), 264)]),
            "\"daily\";q=33;w=86400, \"v4-24\";q=264;w=86400"
        );
        assert_eq!(policy([(LevelName::Anon, 9)]), "\"anon\";q=9;w=86400");
        assert_eq!(ratelimit(v4_24(), 3, 60), "\"v4-24\";r=3;t=60");
        let subject = accepted().standing; // 0 remaining
        let pick = |s: &Standing, l: &[LevelStanding]| fewest_remaining(s, l).0;
        assert_eq!(pick(&subject, &[network(0)]), LevelName::Subject);
        let roomy = Standing {
            remaining: 10,
            ..subject
        };
        assert_eq!(pick(&roomy, &[network(3)]), v4_24());
        assert_eq!(pick(&roomy, &[network(10)]), LevelName::Subject);
        assert_eq!(pick(&roomy, &[]), LevelName::Subject);

        let mut a = accepted();
        a.standing = roomy;
        a.levels = vec![network(0)];
        let r = a.to_response();
        let h = r.headers();
        assert_eq!(
            h[&POLICY],
            "\"daily\";q=33;w=86400, \"v4-24\";q=264;w=86400"
        );
        assert_eq!(h[&RATELIMIT], "\"v4-24\";r=0;t=7200");
        // The subject's own remaining stays in its header.
        assert_eq!(h[&REMAINING], "10");
    }

    /// A delay set by the network: `quota.level` names it and the reminder
    /// says a token lifts it (ASCII, in a header and the body); a delay
    /// set by the subject, or none, has no such reminder.
    #[test]
    fn a_network_delay_is_explained() {
        let mut a = accepted();
        a.level = Some(v4_24());
        a.levels = vec![network(0)];
        let r = a.to_response();
        let text = r.headers()[&REMINDER].to_str().unwrap().to_owned();
        assert!(text.contains("Your network (v4/24)"), "{text}");
        assert!(text.contains("shared limit of 264"), "{text}");
        assert!(text.contains("token"), "{text}");
        assert!(text.is_ascii());
        let body: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(body["quota"]["level"], "v4/24");
        assert_eq!(body["reminder"], text.as_str());

        a.level = Some(LevelName::Anon);
        a.levels[0].name = LevelName::Anon;
        let text = a.reminder_text("x").unwrap();
        assert!(
            text.starts_with("All anonymous scans together (anon)"),
            "{text}"
        );

        // Shadow mode: nobody waited, the verdict says it would have.
        a.plan = DelayPlan {
            total: Duration::ZERO,
            sleep: Duration::ZERO,
            deferred: Duration::ZERO,
        };
        assert!(a.reminder_text("x").is_none());
        a.shadow = Some(ShadowVerdict {
            tier: "soft",
            delay_ms: 5000,
        });
        assert!(a.reminder_text("x").is_some());

        // Both reminders: the subject's sentence, then the network's.
        a.reminder = true;
        let both = a.reminder_text("x").unwrap();
        assert!(both.starts_with("You have used 34 scans") && both.contains("token"));

        a.level = Some(LevelName::Subject);
        a.reminder = false;
        assert!(a.reminder_text("x").is_none());
    }
}
