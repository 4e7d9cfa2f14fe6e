//! How a request becomes a subject: hash secret, proxies, exempt networks, token verification.

use ipnet::IpNet;
use serde::Deserialize;
use serde::de::{Deserializer, Error as _};

use super::env::flag;

/// Used when none is configured; it is in the source, so digests made with it are not private.
pub const DEV_HASH_SECRET: &str = "quota-gate-local-development-secret";

#[derive(Clone, Default, PartialEq, Eq)]
pub(super) enum HashSecret {
    Configured(String),
    /// Unset: [`DEV_HASH_SECRET`], where a development secret is allowed.
    #[default]
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
#[derive(Debug, Clone, Deserialize)]
pub struct IdentityConfig {
    /// Read it through [`super::Config::hash_secret`].
    #[serde(rename = "QUOTA_HASH_SECRET")]
    #[serde(default, deserialize_with = "hash_secret")]
    pub(super) hash_secret: HashSecret,
    #[serde(rename = "QUOTA_IPV6_PREFIX")]
    pub ipv6_prefix: u8,
    #[serde(rename = "QUOTA_TRUSTED_PROXIES")]
    #[serde(default, deserialize_with = "networks")]
    pub trusted_proxies: Vec<IpNet>,
    #[serde(rename = "QUOTA_EXEMPT_NETWORKS")]
    #[serde(default, deserialize_with = "networks")]
    pub exempt_networks: Vec<IpNet>,
    #[serde(skip)]
    pub jwt: JwtConfig,
}

/// How bearer tokens are verified.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct JwtConfig {
    #[serde(rename = "QUOTA_JWT_PUBLIC_KEY")]
    pub public_key: Option<String>,
    #[serde(rename = "QUOTA_JWT_JWKS")]
    pub jwks: Option<String>,
    #[serde(rename = "QUOTA_JWT_ISSUER")]
    pub issuer: String,
    #[serde(rename = "QUOTA_JWT_AUDIENCE")]
    pub audience: Option<String>,
    #[serde(rename = "QUOTA_TRUST_GATEWAY_CLAIMS", deserialize_with = "flag")]
    pub trust_gateway_claims: bool,
    #[serde(rename = "QUOTA_EXEMPT_CLAIM")]
    #[serde(default, deserialize_with = "claim_name")]
    pub exempt_claim: Option<String>,
    #[serde(rename = "QUOTA_JWT_ACCOUNT_CLAIM")]
    #[serde(default, deserialize_with = "claim_name")]
    pub account_claim: Option<String>,
}

fn hash_secret<'de, D: Deserializer<'de>>(d: D) -> Result<HashSecret, D::Error> {
    match String::deserialize(d)? {
        s if s.len() < 16 => Err(D::Error::custom(
            "must be at least 16 bytes (32 random bytes recommended)",
        )),
        s => Ok(HashSecret::Configured(s)),
    }
}

fn networks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    String::deserialize(d)?
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
                .map(|net| net.trunc())
                .map_err(|_| D::Error::custom(format!("{s:?} is not an IP address or CIDR")))
        })
        .collect()
}

fn claim_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = String::deserialize(d)?;
    if !name.chars().all(|c| c.is_ascii_graphic()) {
        let problem = format!("{name:?} is not a claim name (visible ASCII, no spaces)");
        return Err(D::Error::custom(problem));
    }
    if ["tid", "tier", "exp", "iss", "aud", "nbf", "iat"].contains(&name.as_str()) {
        let problem = format!("{name:?} is a claim the gate already reads");
        return Err(D::Error::custom(problem));
    }
    Ok(Some(name))
}
