//! How a request becomes a subject: the hash secret, the proxies and
//! networks, and how bearer tokens are verified.

use std::str::FromStr;

use ipnet::IpNet;

use super::error::ConfigError;
use super::lookup::Lookup;
use super::vars;

/// The secret used by `quota-gate serve` when none is configured. Digests made
/// with it are not private: it is in the source.
pub const DEV_HASH_SECRET: &str = "quota-gate-local-development-secret";

/// The HMAC key for subject digests (`QUOTA_HASH_SECRET`).
#[derive(Clone, PartialEq, Eq)]
pub(super) enum HashSecret {
    Configured(String),
    /// Unset: [`DEV_HASH_SECRET`], where a development secret is allowed.
    Development,
}

impl std::fmt::Debug for HashSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Configured(_) => "Configured(…)",
            Self::Development => "Development",
        })
    }
}

/// How a request becomes a subject.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    /// Read it through [`super::Config::hash_secret`].
    pub(super) hash_secret: HashSecret,
    pub ipv6_prefix: u8,
    pub trusted_proxies: Vec<IpNet>,
    /// Client networks whose scans are exempt (`QUOTA_EXEMPT_NETWORKS`).
    pub exempt_networks: Vec<IpNet>,
    pub jwt: JwtConfig,
}

/// How bearer tokens are verified.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub public_key: Option<String>,
    pub jwks: Option<String>,
    pub issuer: String,
    pub audience: Option<String>,
    pub trust_gateway_claims: bool,
    /// A verified token whose claim of this name is `true` is exempt.
    pub exempt_claim: Option<String>,
    /// A verified token whose claim of this name is a non-empty string is
    /// counted by that value, its account, not by its `tid`.
    pub account_claim: Option<String>,
}

impl HashSecret {
    fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
        match env.optional(&vars::QUOTA_HASH_SECRET) {
            Some(s) if s.len() < 16 => Err(ConfigError::new(
                vars::QUOTA_HASH_SECRET.name(),
                "must be at least 16 bytes (32 random bytes recommended)",
            )),
            Some(s) => Ok(Self::Configured(s)),
            None => Ok(Self::Development),
        }
    }
}

impl IdentityConfig {
    /// The hash secret, proxies and token verification.
    pub(super) fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
        Ok(Self {
            hash_secret: HashSecret::from_vars(env)?,
            ipv6_prefix: env.number(&vars::QUOTA_IPV6_PREFIX)? as u8,
            trusted_proxies: networks(env, &vars::QUOTA_TRUSTED_PROXIES)?,
            exempt_networks: networks(env, &vars::QUOTA_EXEMPT_NETWORKS)?,
            jwt: JwtConfig {
                public_key: env.optional(&vars::QUOTA_JWT_PUBLIC_KEY),
                jwks: env.optional(&vars::QUOTA_JWT_JWKS),
                issuer: env.text(&vars::QUOTA_JWT_ISSUER),
                audience: env.optional(&vars::QUOTA_JWT_AUDIENCE),
                trust_gateway_claims: env.flag(&vars::QUOTA_TRUST_GATEWAY_CLAIMS)?,
                exempt_claim: claim_name(env, &vars::QUOTA_EXEMPT_CLAIM)?,
                account_claim: claim_name(env, &vars::QUOTA_JWT_ACCOUNT_CLAIM)?,
            },
        })
    }
}

/// `QUOTA_TRUSTED_PROXIES` or `QUOTA_EXEMPT_NETWORKS`: comma-separated
/// CIDRs or bare addresses. A malformed entry stops the start, naming `var`.
fn networks(env: &Lookup, var: &vars::Var<vars::Optional>) -> Result<Vec<IpNet>, ConfigError> {
    env.optional(var)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            IpNet::from_str(s)
                .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
                .map(|net| net.trunc())
                .map_err(|_| {
                    ConfigError::new(var.name(), format!("{s:?} is not an IP address or CIDR"))
                })
        })
        .collect()
}

/// `QUOTA_EXEMPT_CLAIM` or `QUOTA_JWT_ACCOUNT_CLAIM`: a claim name, one
/// word of visible ASCII, and none the gate already reads.
fn claim_name(
    env: &Lookup,
    var: &vars::Var<vars::Optional>,
) -> Result<Option<String>, ConfigError> {
    match env.optional(var).map(|s| s.trim().to_owned()) {
        Some(name) if !name.chars().all(|c| c.is_ascii_graphic()) => Err(ConfigError::new(
            var.name(),
            format!("{name:?} is not a claim name (visible ASCII, no spaces)"),
        )),
        Some(name)
            if ["tid", "tier", "exp", "iss", "aud", "nbf", "iat"].contains(&name.as_str()) =>
        {
            Err(ConfigError::new(
                var.name(),
                format!("{name:?} is a claim the gate already reads"),
            ))
        }
        other => Ok(other.filter(|s| !s.is_empty())),
    }
}
