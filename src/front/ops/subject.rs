//! One client, found as the handler finds it, and `inspect` of its counter. A JWT the handler
//! rejects is refused: its requests are counted under their IP, so its `tid` counter would mislead.

use std::num::NonZeroU32;

use serde::Serialize;

use super::OpsError;
use super::level_report::LevelReport;
use super::valkey_admin::Snapshot;
use super::{aligned, grant_row, limit_row, rfc3339};
use crate::config::Config;
use crate::gate::identity::jwt::{Rejection, TokenSubject};
use crate::gate::identity::{self, Identifier, ip};
use crate::io::store::QuotaKey;
use crate::io::store::valkey::ValkeyStore;
use crate::rules::decide::decide;
use crate::rules::scope::Scope;
use crate::rules::unix::UnixSecs;

/// How the operator named a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectArg {
    /// A source address, as the gateway reports it (`/32` and `/128` allowed).
    Ip(String),
    /// A JWT (`Bearer ` prefix allowed) or a bare token id.
    Token(String),
    /// An account (`QUOTA_JWT_ACCOUNT_CLAIM`): its tokens' one counter.
    Account(String),
}

/// How the `tid` of a token subject was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// The normalised source address.
    Ip,
    /// A JWT that verified with the configured keys.
    VerifiedToken,
    /// A bare `tid`: its `tier` claim is unknown, so the default token quota is assumed.
    BareTid,
    /// An account's counter, shared by its tokens; the default token quota is assumed.
    Account,
}

/// A client as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub scope: Scope,
    pub key: QuotaKey,
    /// The daily ceiling the handler would apply.
    pub limit: NonZeroU32,
    pub basis: Basis,
}

/// Finds the keys of the client `arg` names, through the handler's own [`Identifier`].
pub fn resolve(config: &Config, arg: &SubjectArg) -> Result<Subject, OpsError> {
    let identifier = Identifier::new(config)?;
    let token = |subject: TokenSubject| identifier.token_identity(&subject, None, false);
    let (identity, basis) = match arg {
        SubjectArg::Ip(raw) => {
            let why = "--ip: not an IP address (a /32 or /128 suffix is allowed, no other prefix)";
            let addr = ip::parse_source(raw).ok_or_else(|| OpsError::Usage(why.into()))?;
            (identifier.ip_identity(addr), Basis::Ip)
        }
        SubjectArg::Token(raw) => {
            let raw = non_empty("--token", identity::bearer(raw).unwrap_or(raw))?;
            // Three dot-separated parts: a compact JWS.
            if raw.split('.').count() == 3 {
                let verified = identifier.verify(raw).map_err(refused)?;
                (token(verified), Basis::VerifiedToken)
            } else {
                (token(unverified(raw, None)), Basis::BareTid)
            }
        }
        SubjectArg::Account(raw) => {
            let account = non_empty("--account", raw)?;
            (token(unverified("", Some(account))), Basis::Account)
        }
    };
    Ok(Subject {
        scope: identity.scope,
        key: QuotaKey::new(identity.scope, &identity.digest),
        limit: identity.limit,
        basis,
    })
}

/// `value` trimmed; an error naming `flag` when that leaves nothing.
fn non_empty<'a>(flag: &str, value: &'a str) -> Result<&'a str, OpsError> {
    match value.trim() {
        "" => Err(OpsError::Usage(format!("{flag}: empty"))),
        value => Ok(value),
    }
}

/// A token subject known by its `tid` or account alone: no `tier`, not exempt.
fn unverified(tid: &str, account: Option<&str>) -> TokenSubject {
    TokenSubject {
        tid: tid.to_owned(),
        tier: None,
        exempt: false,
        account: account.map(str::to_owned),
    }
}

/// Why a JWT given to `--token` names no counter.
fn refused(rejection: Rejection) -> OpsError {
    OpsError::Usage(match rejection {
        Rejection::NoVerificationKey => "--token: this looks like a JWT, but neither \
            QUOTA_JWT_PUBLIC_KEY nor QUOTA_JWT_JWKS is set, so it cannot be verified; set one, \
            or pass the bare tid"
            .into(),
        rejection => format!(
            "--token: the token is not valid ({}): the gate counts its requests under \
             the caller's IP, not its tid; use --ip, or pass the bare tid",
            rejection.as_str()
        ),
    })
}

/// What the next scan of a client would get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NextScan {
    pub count: u64,
    pub tier: &'static str,
    pub delay_ms: u64,
    pub reminder: bool,
}

/// The `inspect` report (also its `--json` form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    pub scope: &'static str,
    pub basis: Basis,
    pub key: String,
    pub first_seen_key: String,
    /// Whether the counter exists (not before the period's first scan, even with a grant).
    pub exists: bool,
    pub count: u64,
    /// The daily ceiling with the grant added, as `GET /quota` reports it.
    pub limit: u32,
    /// The ceiling before the grant (the scope's, or the token's tier).
    pub base_limit: u32,
    /// Extra scans granted for the period, on top of `baseLimit`.
    pub grant: u64,
    /// RFC 3339, UTC; `None` with no grant, or one made before the period's first scan.
    pub grant_expires_at: Option<String>,
    /// Scans left in the period, as `X-Stella-Quota-Remaining` last said.
    pub remaining: u64,
    /// `None` when the counter does not exist or (wrongly) never expires.
    pub ttl_seconds: Option<u64>,
    pub first_seen: Option<String>,
    /// When the period ends (RFC 3339, UTC), as answers report `resetAt`; with no counter, when one
    /// opened now would expire; `None` for a counter that (wrongly) never expires.
    pub reset_at: Option<String>,
    /// When the last paced scan may start (RFC 3339, UTC), if still ahead.
    pub next_free_slot: Option<String>,
    /// How far ahead that is, in ms: the wait a scan arriving now would add.
    pub backlog_ms: u64,
    pub next: NextScan,
    /// The levels above the subject an anonymous scan is also counted at; none for a token.
    pub levels: Vec<LevelReport>,
}

impl Inspection {
    /// The report from a store snapshot read at `now`.
    pub fn new(
        config: &Config,
        subject: &Subject,
        snapshot: Option<&Snapshot>,
        now: UnixSecs,
    ) -> Self {
        let s = snapshot.cloned().unwrap_or_default();
        let count = s.peek.used;
        let ttl = s
            .peek
            .reset_at
            .map(|at| u64::try_from(at.get().saturating_sub(now.get())).unwrap_or(0));
        let limits = config.policy.limits(subject.limit).with_grant(s.peek.grant);
        let next = decide(count + 1, &limits);
        let slot = s.peek.slot_ms.filter(|slot| *slot > now.millis());
        Self {
            scope: subject.scope.as_str(),
            basis: subject.basis,
            key: subject.key.counter.clone(),
            first_seen_key: subject.key.first_seen.clone(),
            exists: s.counter,
            count,
            limit: limits.limit.get(),
            base_limit: subject.limit.get(),
            grant: s.peek.grant,
            grant_expires_at: s.grant_expires_at.map(rfc3339),
            remaining: u64::from(limits.limit.get()).saturating_sub(count),
            ttl_seconds: ttl,
            first_seen: s.first_seen.clone(),
            reset_at: s.reset_at(config, now),
            next_free_slot: slot.map(|at| crate::gate::respond::rfc3339_ms(at.get())),
            backlog_ms: s.backlog_ms(now),
            next: NextScan {
                count: count + 1,
                tier: next.tier.as_str(),
                delay_ms: crate::rules::unix::duration_ms(next.delay),
                reminder: next.reminder,
            },
            levels: Vec::new(),
        }
    }

    /// The human form: one aligned `label  value` line per row.
    pub fn render(&self) -> String {
        let basis = match self.basis {
            Basis::Ip => "source address",
            Basis::VerifiedToken => "verified token",
            Basis::BareTid => "bare tid (a token's tier claim would override the limit)",
            Basis::Account => "account (a token's tier claim would override the limit)",
        };
        let ttl = match (self.exists, self.ttl_seconds) {
            (false, _) => "-".to_owned(),
            (true, Some(t)) => format!("{t} s"),
            (true, None) => "none (the counter never expires: reset it)".to_owned(),
        };
        let mut next = format!("scan {}: {}", self.next.count, self.next.tier);
        if self.next.delay_ms > 0 {
            next.push_str(&format!(", delayed {} ms", self.next.delay_ms));
        }
        if self.next.reminder {
            next.push_str(", with reminder");
        }
        let limit = limit_row(self.limit, self.base_limit, self.grant);
        let grant = grant_row(self.grant, self.grant_expires_at.as_deref(), UNTIL_NEXT);
        let first_seen = self.first_seen.clone().unwrap_or_else(|| "-".into());
        let mut resets = self.reset_at.clone().unwrap_or_else(|| "-".into());
        if !self.exists {
            resets.push_str(" if a scan came now (no counter: the next scan starts a period)");
        }
        let slot = match &self.next_free_slot {
            Some(at) => format!("{at} (backlog {} ms)", self.backlog_ms),
            None => "- (no paced backlog)".into(),
        };
        let rows = [
            ("scope", format!("{} ({basis})", self.scope)),
            ("key", self.key.clone()),
            ("count", self.count.to_string()),
            ("limit", limit),
            ("grant", grant),
            ("remaining", self.remaining.to_string()),
            ("ttl", ttl),
            ("first seen", first_seen),
            ("resets at", resets),
            ("next slot", slot),
            ("next", next),
        ];
        let levels = self.levels.iter().map(|l| ("level", l.line()));
        aligned(rows.into_iter().chain(levels))
    }
}

/// Until when a grant made before the period's first scan lasts.
const UNTIL_NEXT: &str = ", until the end of the period the next scan opens (no scan yet)";

/// Reads a client's counter.
pub async fn inspect(
    store: &ValkeyStore,
    config: &Config,
    subject: &Subject,
) -> Result<Inspection, OpsError> {
    let snapshot = store.inspect(&subject.key).await?;
    let now = super::now();
    Ok(Inspection::new(config, subject, snapshot.as_ref(), now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::store::Peek;
    use crate::rules::unix::UnixMillis;

    fn config() -> Config {
        Config::from_lookup(|k| match k {
            "QUOTA_ANON" => Some("3".into()),
            "QUOTA_SOFT_WINDOW" => Some("2".into()),
            "QUOTA_HASH_SECRET" => Some("ops-test-secret-0123456789".into()),
            _ => None,
        })
        .unwrap()
    }

    /// `--account` names the account's one counter, as a token carrying it
    /// is counted: apart from a `tid` of the same text.
    #[test]
    fn an_account_is_its_tokens_counter() {
        let c = config();
        let account = resolve(&c, &SubjectArg::Account(" acct-1 ".into())).unwrap();
        assert_eq!(account.basis, Basis::Account);
        let digest = crate::rules::digest::Hasher::new(c.hash_secret()).account_digest("acct-1");
        assert_eq!(account.key, QuotaKey::new(Scope::Tid, &digest));
        let tid = resolve(&c, &SubjectArg::Token("acct-1".into())).unwrap();
        assert_ne!(account.key, tid.key);
        assert!(resolve(&c, &SubjectArg::Account(" ".into())).is_err());
    }

    /// The handler's normalisation: suffixes, mapped IPv6 and /64 prefixes name one key.
    #[test]
    fn ip_normalisation_matches_the_handler() {
        let c = config();
        let key = |raw: &str| {
            resolve(&c, &SubjectArg::Ip(raw.into()))
                .unwrap()
                .key
                .counter
        };
        assert_eq!(key("203.0.113.7"), key("203.0.113.7/32"));
        assert_eq!(key("203.0.113.7"), key("::ffff:203.0.113.7"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9/128"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        let identifier = Identifier::new(&c).unwrap();
        let digest = identifier.ip_digest("203.0.113.7".parse().unwrap());
        assert_eq!(
            key("203.0.113.7"),
            QuotaKey::new(Scope::Ip, &digest).counter
        );
        assert!(resolve(&c, &SubjectArg::Ip("203.0.113.0/24".into())).is_err());
    }

    /// A bare tid is hashed as is; a JWT without configured keys is refused.
    #[test]
    fn tokens() {
        let c = config();
        let s = resolve(&c, &SubjectArg::Token("tid-123".into())).unwrap();
        assert_eq!(s.basis, Basis::BareTid);
        assert_eq!(s.limit, c.policy.quota_token);
        assert!(s.key.counter.starts_with("quota:tid:{"));
        let err = resolve(&c, &SubjectArg::Token("a.b.c".into())).unwrap_err();
        assert!(err.to_string().contains("cannot be verified"), "{err}");
    }

    /// A subject whose counter reads `peek`, no first scan or grant expiry known.
    fn snapshot(peek: Peek) -> Snapshot {
        Snapshot {
            peek,
            counter: true,
            first_seen: None,
            grant_expires_at: None,
        }
    }

    /// The next scan's tier follows `decide(count + 1)`; reset instant is now + TTL.
    #[test]
    fn next_tier_and_reset() {
        let c = config();
        let s = resolve(&c, &SubjectArg::Ip("198.51.100.1".into())).unwrap();
        let snap = Snapshot {
            first_seen: Some("2026-11-30T00:00:01Z".into()),
            ..snapshot(Peek {
                used: 3,
                reset_at: Some(UnixSecs(1_796_000_060)),
                slot_ms: Some(UnixMillis(1_796_000_012_500)),
                grant: 0,
            })
        };
        let i = Inspection::new(&c, &s, Some(&snap), UnixSecs(1_796_000_000));
        assert_eq!(i.backlog_ms, 12_500);
        assert_eq!(
            i.next_free_slot.as_deref(),
            Some("2026-11-30T00:53:32.500Z")
        );
        assert_eq!((i.count, i.remaining, i.next.tier), (3, 0, "soft"));
        assert_eq!(i.next.delay_ms, c.policy.soft_delay.as_millis() as u64);
        assert_eq!(i.reset_at.as_deref(), Some("2026-11-30T00:54:20Z"));
        let none = Inspection::new(&c, &s, None, UnixSecs(0));
        assert_eq!((none.exists, none.count, none.remaining), (false, 0, 3));
        assert_eq!(none.next.tier, "within");
        assert!(i.render().contains(&s.key.counter));
        // A grant of 2 raises the ceiling: two more within, then soft.
        let mut granted = snap.clone();
        granted.peek.grant = 2;
        granted.grant_expires_at = Some(UnixSecs(1_796_000_060));
        let g = Inspection::new(&c, &s, Some(&granted), UnixSecs(1_796_000_000));
        assert_eq!((g.grant, g.remaining, g.next.tier), (2, 2, "within"));
        // `limit` is the granted ceiling, as `GET /quota` reports it.
        assert_eq!((g.limit, g.base_limit), (5, 3));
        assert!(
            g.render()
                .contains("+2 scans this period, until 2026-11-30T00:54:20Z"),
            "{}",
            g.render()
        );
    }

    /// A grant made before the period's first scan: no counter, so no
    /// "never expires" warning; the grant waits for the period that scan
    /// opens, and the reset shown is where a counter opened now would end.
    #[test]
    fn grant_without_a_counter() {
        let c = config();
        let s = resolve(&c, &SubjectArg::Ip("198.51.100.1".into())).unwrap();
        let snap = Snapshot {
            counter: false,
            ..snapshot(Peek {
                grant: 50,
                ..Peek::default()
            })
        };
        // 2026-11-30T10:00:00Z; utc-day: the period would end at midnight.
        let i = Inspection::new(&c, &s, Some(&snap), UnixSecs(1_796_032_800));
        assert_eq!(
            (i.exists, i.ttl_seconds, i.limit, i.remaining),
            (false, None, 53, 53)
        );
        assert_eq!(i.reset_at.as_deref(), Some("2026-12-01T00:00:00Z"));
        let text = i.render();
        assert!(!text.contains("never expires"), "{text}");
        assert!(text.contains("the period the next scan opens"), "{text}");
        // A counter that (wrongly) never expires is still called out.
        let stuck = Snapshot {
            counter: true,
            peek: Peek {
                used: 1,
                ..Peek::default()
            },
            ..snap
        };
        let i = Inspection::new(&c, &s, Some(&stuck), UnixSecs(1_796_032_800));
        assert_eq!(i.reset_at, None);
        assert!(i.render().contains("never expires"), "{}", i.render());
    }
}
