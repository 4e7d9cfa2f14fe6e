//! The quota store's settings: the Valkey, its timeout and what to do when it fails.

use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _};

use super::env::{Env, flag, millis, parsed};
use super::error::ConfigError;
use super::vars::{
    VALKEY_AUTH, VALKEY_CACHE_NAME, VALKEY_TLS_CA, VALKEY_URL, VALKEY_USER, VALKEY_WAIT_REPLICAS,
};
use crate::rules::modes::{FailMode, OnEviction, ValkeyAuth};

/// The quota Valkey.
#[derive(Clone, Deserialize)]
pub struct ValkeyConfig {
    /// Empty while it is read: unset, the in-memory store.
    #[serde(rename = "VALKEY_URL", default, deserialize_with = "valkey_url")]
    pub url: String,
    #[serde(rename = "VALKEY_CLUSTER", deserialize_with = "flag")]
    pub cluster: bool,
    /// Replicas a keyed claim must reach before its scan goes on (0: off).
    #[serde(rename = "VALKEY_WAIT_REPLICAS")]
    pub wait_replicas: u32,
    /// Extra trust for `rediss://`: replaces the platform's roots when set.
    #[serde(rename = "VALKEY_TLS_CA", default, deserialize_with = "ca_bundle")]
    pub tls_ca: Option<CaBundle>,
    /// ElastiCache IAM authentication; `None`: the URL's own credentials, if any.
    #[serde(skip)]
    pub iam: Option<IamConfig>,
}

/// Whom an IAM token names; no secret: the token is signed with the process's AWS credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IamConfig {
    pub user: String,
    pub cache: String,
    pub serverless: bool,
}

impl std::fmt::Debug for ValkeyConfig {
    /// The URL without its user and password: a credential is never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = match (self.url.find("://"), self.url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}…{}", &self.url[..scheme + 3], &self.url[at..])
            }
            _ => self.url.clone(),
        };
        f.debug_struct("ValkeyConfig")
            .field("url", &url)
            .field("cluster", &self.cluster)
            .field("wait_replicas", &self.wait_replicas)
            .field("tls_ca", &self.tls_ca)
            .field("iam", &self.iam)
            .finish()
    }
}

/// The quota store and what to do when it fails.
#[derive(Debug, Clone, Deserialize)]
pub struct StoreConfig {
    #[serde(skip)]
    pub valkey: Option<ValkeyConfig>,
    #[serde(rename = "QUOTA_STORE_TIMEOUT_MS", deserialize_with = "millis")]
    pub timeout: Duration,
    #[serde(rename = "QUOTA_FAIL_MODE", deserialize_with = "parsed")]
    pub fail_mode: FailMode,
    /// Consecutive failures that open the breaker (0: never opens).
    #[serde(rename = "QUOTA_BREAKER_FAILURES")]
    pub breaker_failures: u32,
    #[serde(rename = "QUOTA_BREAKER_COOLDOWN_MS", deserialize_with = "millis")]
    pub breaker_cool_down: Duration,
    #[serde(rename = "QUOTA_STORE_EVICTION", deserialize_with = "parsed")]
    pub on_eviction: OnEviction,
    #[serde(rename = "QUOTA_STORE_STATS_INTERVAL_MS", deserialize_with = "millis")]
    pub stats_interval: Duration,
}

/// CA certificates (PEM) read from `VALKEY_TLS_CA` at start.
#[derive(Clone, PartialEq, Eq)]
pub struct CaBundle {
    pub path: String,
    pub pem: Vec<u8>,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle")
            .field("path", &self.path)
            .finish()
    }
}

/// Read now, so a bad file stops the cold start with the variable's name, not every connection.
fn ca_bundle<'de, D: Deserializer<'de>>(d: D) -> Result<Option<CaBundle>, D::Error> {
    let path = String::deserialize(d)?;
    let pem =
        std::fs::read(&path).map_err(|e| D::Error::custom(format!("cannot read {path:?}: {e}")))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(D::Error::custom(format!(
            "{path:?} holds no PEM certificate"
        )));
    }
    Ok(Some(CaBundle { path, pem }))
}

fn valkey_url<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    const SCHEMES: [&str; 4] = ["redis://", "rediss://", "valkey://", "valkeys://"];
    let url = String::deserialize(d)?;
    if !SCHEMES.iter().any(|s| url.starts_with(s)) {
        return Err(D::Error::custom(
            "expected a redis://, rediss://, valkey:// or valkeys:// URL",
        ));
    }
    Ok(url)
}

impl ValkeyConfig {
    /// The Valkey variables, checked against each other; `None`: the in-memory store.
    pub(super) fn read(env: &Env) -> Result<Option<Self>, ConfigError> {
        let valkey: Self = env.group()?;
        if valkey.wait_replicas > 0 && valkey.cluster {
            // WAIT names no key: a cluster client cannot send it to the claim's primary.
            let problem = "needs a standalone Valkey (VALKEY_CLUSTER=false)";
            return Err(ConfigError::new(VALKEY_WAIT_REPLICAS.name, problem));
        }
        let iam = env.group::<IamVars>()?.iam()?;
        if valkey.tls_ca.is_some() && !is_tls_url(&valkey.url) {
            let problem = "needs a rediss:// or valkeys:// VALKEY_URL";
            return Err(ConfigError::new(VALKEY_TLS_CA.name, problem));
        }
        match (valkey.url.is_empty(), iam) {
            (true, None) => Ok(None),
            (true, Some(_)) => Err(ConfigError::new(VALKEY_AUTH.name, "iam needs a VALKEY_URL")),
            (false, None) => Ok(Some(valkey)),
            (false, Some(iam)) => valkey.signed_in(iam).map(Some),
        }
    }

    /// This Valkey, authenticated by IAM: over TLS only, and without a password of the URL's own.
    fn signed_in(self, iam: IamConfig) -> Result<Self, ConfigError> {
        if !is_tls_url(&self.url) {
            return Err(ConfigError::new(
                VALKEY_AUTH.name,
                "iam needs a rediss:// or valkeys:// VALKEY_URL (ElastiCache takes a token over TLS only)",
            ));
        }
        let scheme_end = self.url.find("://").map_or(0, |at| at + 3);
        if self.url[scheme_end..].contains('@') {
            return Err(ConfigError::new(
                VALKEY_URL.name,
                "carries a user or password, but VALKEY_AUTH=iam signs in with VALKEY_USER and a token",
            ));
        }
        Ok(Self {
            iam: Some(iam),
            ..self
        })
    }
}

#[derive(Deserialize)]
pub(super) struct IamVars {
    #[serde(rename = "VALKEY_AUTH", deserialize_with = "parsed")]
    auth: ValkeyAuth,
    #[serde(rename = "VALKEY_USER")]
    user: Option<String>,
    #[serde(rename = "VALKEY_CACHE_NAME")]
    cache: Option<String>,
    #[serde(rename = "VALKEY_CACHE_SERVERLESS", deserialize_with = "flag")]
    serverless: bool,
}

impl IamVars {
    /// A user or cache name without `iam` is refused: it would be silently ignored.
    fn iam(self) -> Result<Option<IamConfig>, ConfigError> {
        let need = |var: &'static str, value: Option<String>| match (self.auth, value) {
            (ValkeyAuth::Iam, Some(v)) => Ok(Some(v)),
            (ValkeyAuth::Iam, None) => Err(ConfigError::new(var, "required with VALKEY_AUTH=iam")),
            (ValkeyAuth::Password, None) => Ok(None),
            (ValkeyAuth::Password, Some(_)) => Err(ConfigError::new(
                var,
                "only read with VALKEY_AUTH=iam (a password's user goes in VALKEY_URL)",
            )),
        };
        let user = need(VALKEY_USER.name, self.user.clone())?;
        let cache = need(VALKEY_CACHE_NAME.name, self.cache.clone())?;
        Ok(user.zip(cache).map(|(user, cache)| IamConfig {
            user,
            cache,
            serverless: self.serverless,
        }))
    }
}

/// Whether a Valkey URL asks for TLS (`rediss://` or `valkeys://`).
pub fn is_tls_url(url: &str) -> bool {
    url.starts_with("rediss://") || url.starts_with("valkeys://")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Valkey URL's user and password never reach a `Debug` print.
    #[test]
    fn debug_hides_credentials() {
        let mut v = ValkeyConfig {
            url: "rediss://gate:pa55word@host:6379".into(),
            cluster: false,
            wait_replicas: 0,
            tls_ca: None,
            iam: None,
        };
        assert!(
            format!("{v:?}").contains("\"rediss://…@host:6379\""),
            "{v:?}"
        );
        v.url = "redis://127.0.0.1:6379".into();
        assert!(format!("{v:?}").contains("\"redis://127.0.0.1:6379\""));
    }
}
