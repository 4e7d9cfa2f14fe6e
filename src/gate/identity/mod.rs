//! Step 2: who is asking, and under which quota. A valid bearer token puts the request in the
//! token scope (`tid`); anything else falls back to the anonymous scope keyed by the normalised
//! source IP. The subject leaves this module only as a keyed [`Digest`].

pub mod ip;
pub mod jwt;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::num::NonZeroU32;

use http::{HeaderMap, header};
use ipnet::IpNet;
use serde_json::Value;

use crate::config::{Config, ConfigError, IdentityConfig, Policy};
use crate::gate::error::GateError;
use crate::rules::digest::{Digest, Hasher};
use crate::rules::key::QuotaKey;
use crate::rules::level::{Level, LevelName, LevelOf, Levels};
use crate::rules::scope::Scope;
use jwt::{Rejection, TokenSubject, Verifier};

/// What became of a presented token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenStatus {
    Accepted,
    Rejected(Rejection),
}

/// The counted subject of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub scope: Scope,
    pub digest: Digest,
    /// The daily ceiling that applies to this subject.
    pub limit: NonZeroU32,
    /// `None` when no token was presented.
    pub token: Option<TokenStatus>,
    /// From an exempt network or with a verified exempt claim: never counted, delayed or paced.
    pub exempt: bool,
    /// The levels above the subject it is also counted at (none when exempt).
    pub levels: Vec<Level>,
    /// `QUOTA_JWT_ACCOUNT_CLAIM` is set but this token names no account, so it is counted by `tid`.
    pub account_missing: bool,
}

/// What the platform tells us about a request besides its headers.
#[derive(Debug, Clone, Default)]
pub struct Origin<'a> {
    /// The direct peer: the gateway's `sourceIp`, or the socket peer locally.
    pub peer: Option<IpAddr>,
    /// Claims an API Gateway JWT authorizer already verified.
    pub gateway_claims: Option<&'a HashMap<String, String>>,
}

#[derive(Debug)]
pub struct Identifier {
    hasher: Hasher,
    verifier: Option<Verifier>,
    /// The proxies, exempt networks, IPv6 prefix, and the claim names read of the gateway's claims.
    config: IdentityConfig,
    policy: Policy,
    network_digests: quick_cache::sync::Cache<(LevelName, IpNet), Digest>,
    /// The anonymous budget's digest (its material is a constant).
    anon_digest: Digest,
}

/// How many networks' digests [`Identifier::levels_of`] keeps.
pub const NETWORK_DIGESTS: usize = 4096;

impl Identifier {
    /// Builds the identifier, warning when digests use the built-in development secret.
    pub fn new(config: &Config) -> Result<Self, ConfigError> {
        // Once per process, however many gates it builds (`serve`'s workers).
        static WARNED: std::sync::Once = std::sync::Once::new();
        if config.uses_development_secret() {
            WARNED.call_once(|| {
                tracing::warn!(
                    "QUOTA_HASH_SECRET is unset: using the built-in development secret; \
                     digests are not private. Set it for anything but local testing."
                );
            });
        }
        warn_of_exempt_proxies(config);
        let hasher = Hasher::new(config.hash_secret());
        Ok(Self {
            anon_digest: hasher.level_digest(crate::rules::level::ANON_MATERIAL),
            hasher,
            verifier: Verifier::from_config(&config.identity.jwt)?,
            config: config.identity.clone(),
            policy: config.policy.clone(),
            network_digests: quick_cache::sync::Cache::new(NETWORK_DIGESTS),
        })
    }

    /// Identifies the subject of a request. It is exempt when its client address (past the trusted
    /// proxies, never a proxy's own) is in an exempt network, or its verified claims say so.
    pub fn identify(
        &self,
        headers: &HeaderMap,
        origin: &Origin<'_>,
    ) -> Result<Identity, GateError> {
        let client = origin
            .peer
            .map(|peer| ip::client_ip(peer, headers, &self.config.trusted_proxies));
        let exempt_networks = &self.config.exempt_networks;
        let from_exempt_network = client.is_some_and(|c| {
            !c.proxy_fallback && exempt_networks.iter().any(|net| net.contains(&c.addr))
        });
        let client = client.map(|c| c.addr);
        let trusted = self.config.jwt.trust_gateway_claims;
        let gateway = origin.gateway_claims.filter(|_| trusted);
        let gateway = gateway.and_then(|claims| self.gateway_subject(claims));
        let token = match gateway.map(Ok).or_else(|| self.check_token(headers)) {
            None => None,
            Some(Ok(subject)) => {
                return Ok(self.token_identity(&subject, client, from_exempt_network));
            }
            Some(Err(rejection)) => Some(TokenStatus::Rejected(rejection)),
        };
        let client = client.ok_or(GateError::NoSourceAddress)?;
        let mut identity = self.ip_identity(client);
        identity.token = token;
        if from_exempt_network {
            identity.exempt = true;
            identity.levels.clear();
        }
        Ok(identity)
    }

    /// The levels above a subject of `scope` at `ip`; network digests are cached, sparing the HMAC.
    pub fn levels_of(&self, scope: Scope, ip: IpAddr) -> Vec<Level> {
        let ip = ip.to_canonical();
        let levels = &self.policy.levels;
        let networks = levels.networks_of(scope, ip).map(|(name, level, net)| {
            let Ok(digest) = self.network_digests.get_or_insert_with(&(name, net), || {
                Ok::<_, Infallible>(self.hasher.level_digest(&Levels::material(name, net)))
            });
            let limits = self.policy.level_limits(name, level.limit);
            Level::new(name, QuotaKey::level(&digest), limits)
        });
        let anon = levels.anon.filter(|_| scope == Scope::Ip).map(|budget| {
            let limits = self.policy.level_limits(LevelName::Anon, budget.limit);
            Level::new(LevelName::Anon, QuotaKey::level(&self.anon_digest), limits)
        });
        networks.chain(anon).collect()
    }

    /// One level as the store counts it: keyed by its digest, never its material.
    pub fn level(&self, level: LevelOf) -> Level {
        let key = QuotaKey::level(&self.hasher.level_digest(&level.material));
        let limits = self.policy.level_limits(level.name, level.limit);
        Level::new(level.name, key, limits)
    }

    /// The anonymous subject's digest for an address (the operator commands find counters by it).
    pub fn ip_digest(&self, ip: IpAddr) -> Digest {
        self.hasher
            .digest(Scope::Ip, &ip::material(ip, self.config.ipv6_prefix))
    }

    /// The anonymous subject of a direct, already trusted address, with its levels.
    pub fn ip_identity(&self, ip: IpAddr) -> Identity {
        Identity {
            scope: Scope::Ip,
            digest: self.ip_digest(ip),
            limit: self.policy.quota_anon,
            token: None,
            exempt: false,
            levels: self.levels_of(Scope::Ip, ip),
            account_missing: false,
        }
    }

    /// The token holder a verified `subject` names (its account, else its `tid`), at its levels.
    pub fn token_identity(
        &self,
        subject: &TokenSubject,
        client: Option<IpAddr>,
        from_exempt_network: bool,
    ) -> Identity {
        let digest = match &subject.account {
            Some(account) => self.hasher.account_digest(account),
            None => self.hasher.digest(Scope::Tid, &subject.tid),
        };
        let exempt = subject.exempt || from_exempt_network;
        let levels = match client {
            Some(ip) if !exempt => self.levels_of(Scope::Tid, ip),
            _ => Vec::new(),
        };
        Identity {
            scope: Scope::Tid,
            digest,
            limit: subject.tier.unwrap_or(self.policy.quota_token),
            token: Some(TokenStatus::Accepted),
            exempt,
            levels,
            account_missing: self.config.jwt.account_claim.is_some() && subject.account.is_none(),
        }
    }

    /// The subject the gateway authorizer's claims (all strings) name, if they carry a `tid`.
    fn gateway_subject(&self, claims: &HashMap<String, String>) -> Option<TokenSubject> {
        let tid = claims.get("tid").filter(|t| !t.is_empty())?;
        let claim = |name: &Option<String>| claims.get(name.as_deref()?);
        Some(TokenSubject {
            tid: tid.clone(),
            tier: claims
                .get("tier")
                .and_then(|t| jwt::tier_from_claim(&Value::from(t.as_str()))),
            exempt: claim(&self.config.jwt.exempt_claim).is_some_and(|v| v == "true"),
            account: claim(&self.config.jwt.account_claim)
                .filter(|a| !a.is_empty())
                .cloned(),
        })
    }

    /// Verifies a bearer token (without its scheme) with the configured keys.
    pub fn verify(&self, token: &str) -> Result<TokenSubject, Rejection> {
        self.verifier
            .as_ref()
            .ok_or(Rejection::NoVerificationKey)?
            .verify(token)
    }

    /// `None` when no `Authorization` header was sent.
    fn check_token(&self, headers: &HeaderMap) -> Option<Result<TokenSubject, Rejection>> {
        let value = headers.get(header::AUTHORIZATION)?;
        let token = value
            .to_str()
            .ok()
            .and_then(bearer)
            .ok_or(Rejection::NotBearer);
        Some(token.and_then(|token| self.verify(token)))
    }
}

/// Warns once per process of each exempt network covering a trusted proxy: a proxy's own address
/// never exempts, so such a network exempts only the clients it also names.
fn warn_of_exempt_proxies(config: &Config) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let identity = &config.identity;
    let overlaps =
        ip::exempt_covering_proxies(&identity.exempt_networks, &identity.trusted_proxies);
    if overlaps.is_empty() {
        return;
    }
    WARNED.call_once(|| {
        for (exempt, proxy) in overlaps {
            tracing::warn!(
                %exempt,
                %proxy,
                "QUOTA_EXEMPT_NETWORKS covers a trusted proxy network: the proxies' own \
                 addresses are never exempt (a request a proxy forwards without a usable \
                 X-Forwarded-For is counted on its proxy-fallback counter); only clients \
                 the header names in that network are exempt"
            );
        }
    });
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive.
pub fn bearer(value: &str) -> Option<&str> {
    value
        .trim_start()
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// An exempt network over the trusted proxy: the clients the proxy
    /// names in it are exempt; the proxy's own address, counted when the
    /// header names nobody usable, never is.
    #[test]
    fn a_trusted_proxy_is_never_exempt() {
        let config = Config::from_lookup(|k| match k {
            "QUOTA_TRUSTED_PROXIES" => Some("10.0.0.0/24".into()),
            "QUOTA_EXEMPT_NETWORKS" => Some("10.0.0.0/8".into()),
            "QUOTA_HASH_SECRET" => Some("identity-test-secret-0123456789".into()),
            _ => None,
        })
        .unwrap();
        let identifier = Identifier::new(&config).unwrap();
        let proxy: IpAddr = "10.0.0.5".parse().unwrap();
        let origin = Origin {
            peer: Some(proxy),
            gateway_claims: None,
        };
        let via = |xff: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = xff {
                h.insert("x-forwarded-for", HeaderValue::from_str(v).unwrap());
            }
            identifier.identify(&h, &origin).unwrap()
        };
        assert!(
            via(Some("10.1.2.3")).exempt,
            "an exempt client behind the proxy"
        );
        let outside = via(Some("198.51.100.1"));
        assert!(!outside.exempt);
        for unusable in [
            None,
            Some("198.51.100.1:443"),
            Some("198.51.100.1,"),
            Some("junk"),
        ] {
            let id = via(unusable);
            assert!(!id.exempt, "{unusable:?} exempted the proxy's fallback");
            assert_eq!(id.digest, identifier.ip_digest(proxy), "{unusable:?}");
        }
        // Not through a proxy, the exempt network still exempts.
        let direct = Origin {
            peer: Some("10.9.9.9".parse().unwrap()),
            gateway_claims: None,
        };
        assert!(
            identifier
                .identify(&HeaderMap::new(), &direct)
                .unwrap()
                .exempt
        );
    }
}
