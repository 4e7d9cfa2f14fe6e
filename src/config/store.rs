//! The quota store: the Valkey (its URL, cluster mode, replicas, TLS trust,
//! how it authenticates), its timeout and what to do when it fails.

use std::time::Duration;

use super::error::ConfigError;
use super::lookup::Lookup;
use super::vars;
use crate::rules::modes::{FailMode, OnEviction, ValkeyAuth};

/// The quota Valkey.
#[derive(Clone)]
pub struct ValkeyConfig {
    pub url: String,
    pub cluster: bool,
    /// Replicas a keyed claim must reach before its scan goes on (0: off).
    pub wait_replicas: u32,
    /// Extra trust for `rediss://`: replaces the platform's roots when set.
    pub tls_ca: Option<CaBundle>,
    /// ElastiCache IAM authentication (`VALKEY_AUTH=iam`); `None`: the URL's
    /// own credentials, if any.
    pub iam: Option<IamConfig>,
}

/// Whom an ElastiCache IAM authentication token names: the user (its id,
/// which is also its name) and the cache. No secret: the token is signed
/// with the process's AWS credentials when a connection is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IamConfig {
    pub user: String,
    pub cache: String,
    /// An ElastiCache Serverless cache: the token names its resource type.
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
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `None`: the in-memory store.
    pub valkey: Option<ValkeyConfig>,
    /// Bound on every store call.
    pub timeout: Duration,
    pub fail_mode: FailMode,
    /// Consecutive failures that open the breaker (0: never opens).
    pub breaker_failures: u32,
    pub breaker_cool_down: Duration,
    /// What the start does with a store that can evict the gate's keys.
    pub on_eviction: OnEviction,
    /// How often `serve` and `consume` read the store's evicted keys.
    pub stats_interval: Duration,
}

/// CA certificates (PEM) read from `VALKEY_TLS_CA` at start.
#[derive(Clone, PartialEq, Eq)]
pub struct CaBundle {
    /// Where it was read from, for messages.
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

impl CaBundle {
    /// Reads the bundle now, so a missing or unreadable file stops the cold
    /// start with the variable's name instead of failing every connection.
    fn read(path: &str) -> Result<Self, ConfigError> {
        let var = vars::VALKEY_TLS_CA.name();
        let pem = std::fs::read(path)
            .map_err(|e| ConfigError::new(var, format!("cannot read {path:?}: {e}")))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(ConfigError::new(
                var,
                format!("{path:?} holds no PEM certificate"),
            ));
        }
        Ok(Self {
            path: path.to_owned(),
            pem,
        })
    }
}

impl StoreConfig {
    /// Valkey (or the in-memory store), its timeout and failure handling.
    pub(super) fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
        Ok(Self {
            valkey: ValkeyConfig::from_vars(env)?,
            timeout: env.millis(&vars::QUOTA_STORE_TIMEOUT_MS)?,
            fail_mode: env.word(&vars::QUOTA_FAIL_MODE)?,
            breaker_failures: env.count(&vars::QUOTA_BREAKER_FAILURES)?,
            breaker_cool_down: env.millis(&vars::QUOTA_BREAKER_COOLDOWN_MS)?,
            on_eviction: env.word(&vars::QUOTA_STORE_EVICTION)?,
            stats_interval: env.millis(&vars::QUOTA_STORE_STATS_INTERVAL_MS)?,
        })
    }
}

impl ValkeyConfig {
    /// `VALKEY_URL`, `VALKEY_CLUSTER`, `VALKEY_WAIT_REPLICAS` and `VALKEY_TLS_CA`; `None`: the
    /// in-memory store. A CA bundle needs a TLS URL.
    fn from_vars(env: &Lookup) -> Result<Option<Self>, ConfigError> {
        let cluster = env.flag(&vars::VALKEY_CLUSTER)?;
        let wait_replicas = env.count(&vars::VALKEY_WAIT_REPLICAS)?;
        if wait_replicas > 0 && cluster {
            // WAIT names no key: a cluster client cannot send it to the
            // claim's primary.
            return Err(ConfigError::new(
                vars::VALKEY_WAIT_REPLICAS.name(),
                "needs a standalone Valkey (VALKEY_CLUSTER=false)",
            ));
        }
        let valkey = env
            .optional(&vars::VALKEY_URL)
            .map(ValkeyConfig::parse)
            .transpose()?;
        let tls_ca = env
            .optional(&vars::VALKEY_TLS_CA)
            .map(|path| CaBundle::read(&path))
            .transpose()?;
        let iam = IamConfig::from_vars(env)?;
        let valkey = match (valkey, tls_ca) {
            (None, None) => None,
            (Some(v), tls_ca) if tls_ca.is_none() || v.is_tls() => Some(ValkeyConfig {
                cluster,
                wait_replicas,
                tls_ca,
                ..v
            }),
            _ => {
                return Err(ConfigError::new(
                    vars::VALKEY_TLS_CA.name(),
                    "needs a rediss:// or valkeys:// VALKEY_URL",
                ));
            }
        };
        match (valkey, iam) {
            (valkey, None) => Ok(valkey),
            (Some(v), Some(iam)) => v.signed_in(iam).map(Some),
            (None, Some(_)) => Err(ConfigError::new(
                vars::VALKEY_AUTH.name(),
                "iam needs a VALKEY_URL",
            )),
        }
    }

    /// This Valkey, authenticated by IAM: only over TLS (ElastiCache takes a
    /// token over TLS only, and it must not cross a network in the clear),
    /// and with no password of the URL's own beside it.
    fn signed_in(self, iam: IamConfig) -> Result<Self, ConfigError> {
        if !self.is_tls() {
            return Err(ConfigError::new(
                vars::VALKEY_AUTH.name(),
                "iam needs a rediss:// or valkeys:// VALKEY_URL (ElastiCache takes a token over TLS only)",
            ));
        }
        let scheme_end = self.url.find("://").map_or(0, |at| at + 3);
        if self.url[scheme_end..].contains('@') {
            return Err(ConfigError::new(
                vars::VALKEY_URL.name(),
                "carries a user or password, but VALKEY_AUTH=iam signs in with VALKEY_USER and a token",
            ));
        }
        Ok(Self {
            iam: Some(iam),
            ..self
        })
    }

    fn parse(url: String) -> Result<Self, ConfigError> {
        const SCHEMES: [&str; 4] = ["redis://", "rediss://", "valkey://", "valkeys://"];
        if !SCHEMES.iter().any(|s| url.starts_with(s)) {
            return Err(ConfigError::new(
                vars::VALKEY_URL.name(),
                "expected a redis://, rediss://, valkey:// or valkeys:// URL",
            ));
        }
        Ok(Self {
            url,
            cluster: false,
            wait_replicas: 0,
            tls_ca: None,
            iam: None,
        })
    }

    fn is_tls(&self) -> bool {
        is_tls_url(&self.url)
    }
}

impl IamConfig {
    /// `VALKEY_AUTH` and, with `iam`, whom the token names. `VALKEY_USER`
    /// and `VALKEY_CACHE_NAME` are refused without `iam`: a password user
    /// goes in the URL, and a user set beside a URL without one would be
    /// silently ignored.
    fn from_vars(env: &Lookup) -> Result<Option<Self>, ConfigError> {
        let serverless = env.flag(&vars::VALKEY_CACHE_SERVERLESS)?;
        let user = env.optional(&vars::VALKEY_USER);
        let cache = env.optional(&vars::VALKEY_CACHE_NAME);
        let auth = env.word(&vars::VALKEY_AUTH)?;
        let need = |name: &'static str, value: Option<String>| match (auth, value) {
            (ValkeyAuth::Iam, Some(v)) => Ok(Some(v)),
            (ValkeyAuth::Iam, None) => Err(ConfigError::new(name, "required with VALKEY_AUTH=iam")),
            (ValkeyAuth::Password, None) => Ok(None),
            (ValkeyAuth::Password, Some(_)) => Err(ConfigError::new(
                name,
                "only read with VALKEY_AUTH=iam (a password's user goes in VALKEY_URL)",
            )),
        };
        let user = need(vars::VALKEY_USER.name(), user)?;
        let cache = need(vars::VALKEY_CACHE_NAME.name(), cache)?;
        Ok(user.zip(cache).map(|(user, cache)| Self {
            user,
            cache,
            serverless,
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
        let mut v = ValkeyConfig::parse("rediss://gate:pa55word@host:6379".into()).unwrap();
        assert!(
            format!("{v:?}").contains("\"rediss://…@host:6379\""),
            "{v:?}"
        );
        v.url = "redis://127.0.0.1:6379".into();
        assert!(format!("{v:?}").contains("\"redis://127.0.0.1:6379\""));
    }
}
