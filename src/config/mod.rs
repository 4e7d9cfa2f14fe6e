//! Every setting, read once at start from environment variables.
//!
//! [`Config::from_lookup`] takes a lookup function instead of reading the
//! process environment, so tests build configurations without touching
//! global state. A bad value fails at start with the variable's name.
//!
//! The variables, their defaults and ranges are one table,
//! [`vars::VARIABLES`]: the parser reads its defaults and ranges from it, the
//! README's configuration table is its [`vars::markdown_table`] (a test
//! compares them), and `tests/template.rs` checks `template.yaml` against it.
//! Each row is a typed `const` handle (`vars::QUOTA_ANON`, a [`vars::Var`]),
//! and the parser reads a variable only through its handle, never by a
//! string: a misspelt name, or a word read as a number, is a compile error
//! rather than a panic at start, and a test checks the parser reads every row.
//!
//! The settings are grouped by who reads them, and each group reads its own
//! variables (`from_vars`): [`Policy`] (the quota and its delays:
//! [`crate::decide`], [`crate::delay`], pacing), [`IdentityConfig`] (the hash
//! secret, proxies, [`JwtConfig`]), [`StoreConfig`] (Valkey, its timeout and
//! failure handling), the [`QueueTarget`] and [`ServeConfig`]. They are read
//! in that order, so with several bad values the first group's error is the
//! one reported.
//! The settings that are one word each ([`FailMode`], [`DelayMode`], …)
//! live in [`words`] and [`ConfigError`] in `error`, below the parser, so
//! the pure rules import a setting without the configuration.
//! A plain environment variable table was chosen over clap's `env` feature:
//! Lambda has no command line, and one parser serves both binaries.

mod error;
mod lookup;
pub mod vars;
pub mod words;

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;

use crate::decide::Limits;
use crate::hash_tag::has_hash_tag;
pub use error::ConfigError;
use lookup::Lookup;
pub use lookup::ranged_number;
pub use words::{DelayMode, FailMode, Mode, Pacing, ResetPolicy};

/// Where accepted scans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueTarget {
    /// One JSON line per job on standard output (the local default).
    Spool,
    /// `XADD` to this stream key on the quota Valkey.
    ValkeyStream(String),
    /// An SQS queue URL.
    Sqs(String),
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

/// The secret used by `quota-gate serve` when none is configured. Digests made
/// with it are not private: it is in the source.
pub const DEV_HASH_SECRET: &str = "quota-gate-local-development-secret";

/// The HMAC key for subject digests (`QUOTA_HASH_SECRET`).
#[derive(Clone, PartialEq, Eq)]
enum HashSecret {
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

/// The quota and what happens past it.
#[derive(Debug, Clone)]
pub struct Policy {
    pub quota_anon: NonZeroU32,
    pub quota_token: NonZeroU32,
    pub warn_at: NonZeroU32,
    pub soft_window: u32,
    pub soft_delay: Duration,
    pub hard_delay: Duration,
    pub reset: ResetPolicy,
    /// `enforce` or `shadow` (`QUOTA_MODE`).
    pub mode: Mode,
    pub pacing: Pacing,
    /// The longest delay a paced scan may be given; beyond it, 503 `backlog_full`.
    pub max_backlog: Duration,
    pub delay_mode: DelayMode,
    pub gateway_timeout: Duration,
    pub delay_margin: Duration,
}

impl Policy {
    /// The quota and its delays.
    fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
        Ok(Self {
            quota_anon: env.limit(&vars::QUOTA_ANON)?,
            quota_token: env.limit(&vars::QUOTA_TOKEN)?,
            warn_at: env.limit(&vars::QUOTA_WARN_AT)?,
            soft_window: env.count(&vars::QUOTA_SOFT_WINDOW)?,
            soft_delay: env.millis(&vars::QUOTA_SOFT_DELAY_MS)?,
            hard_delay: env.millis(&vars::QUOTA_HARD_DELAY_MS)?,
            reset: env.word(&vars::QUOTA_RESET)?,
            mode: env.word(&vars::QUOTA_MODE)?,
            pacing: env.word(&vars::QUOTA_PACING)?,
            max_backlog: env.millis(&vars::QUOTA_MAX_BACKLOG_MS)?,
            delay_mode: env.word(&vars::QUOTA_DELAY_MODE)?,
            gateway_timeout: env.millis(&vars::QUOTA_GATEWAY_TIMEOUT_MS)?,
            delay_margin: env.millis(&vars::QUOTA_DELAY_MARGIN_MS)?,
        })
    }

    /// The limits for a subject whose daily ceiling is `limit`.
    pub fn limits(&self, limit: NonZeroU32) -> Limits {
        Limits {
            limit,
            soft_window: self.soft_window,
            soft_delay: self.soft_delay,
            hard_delay: self.hard_delay,
            warn_at: self.warn_at,
        }
    }
}

/// How a request becomes a subject.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    /// Read it through [`Config::hash_secret`].
    hash_secret: HashSecret,
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
}

/// The quota Valkey.
#[derive(Debug, Clone)]
pub struct ValkeyConfig {
    pub url: String,
    pub cluster: bool,
    /// Replicas a keyed claim must reach before its scan goes on (0: off).
    pub wait_replicas: u32,
    /// Extra trust for `rediss://`: replaces the platform's roots when set.
    pub tls_ca: Option<CaBundle>,
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
}

/// The local server (`quota-gate serve`).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// Connections kept open at once.
    pub max_connections: u32,
    /// Single-threaded workers; 0: one per CPU.
    pub workers: u16,
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
    fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
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
                exempt_claim: exempt_claim(env)?,
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

/// `QUOTA_EXEMPT_CLAIM`: a claim name, one word of visible ASCII.
fn exempt_claim(env: &Lookup) -> Result<Option<String>, ConfigError> {
    let var = &vars::QUOTA_EXEMPT_CLAIM;
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

impl StoreConfig {
    /// Valkey (or the in-memory store), its timeout and failure handling.
    fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
        Ok(Self {
            valkey: ValkeyConfig::from_vars(env)?,
            timeout: env.millis(&vars::QUOTA_STORE_TIMEOUT_MS)?,
            fail_mode: env.word(&vars::QUOTA_FAIL_MODE)?,
            breaker_failures: env.count(&vars::QUOTA_BREAKER_FAILURES)?,
            breaker_cool_down: env.millis(&vars::QUOTA_BREAKER_COOLDOWN_MS)?,
        })
    }
}

impl ServeConfig {
    /// `quota-gate serve`'s address, connection cap and workers.
    fn from_vars(env: &Lookup) -> Result<Self, ConfigError> {
        let listen = env.text(&vars::QUOTA_LISTEN);
        let listen = listen.parse().map_err(|_| {
            ConfigError::new(
                vars::QUOTA_LISTEN.name(),
                format!("expected host:port, got {listen:?}"),
            )
        })?;
        Ok(Self {
            listen,
            max_connections: env.number(&vars::QUOTA_MAX_CONNECTIONS)? as u32,
            workers: env.number(&vars::QUOTA_SERVE_WORKERS)? as u16,
        })
    }
}

/// Every setting of the gate.
#[derive(Debug, Clone)]
pub struct Config {
    pub policy: Policy,
    pub identity: IdentityConfig,
    pub store: StoreConfig,
    /// A [`QueueTarget::ValkeyStream`] only ever comes with a
    /// [`StoreConfig::valkey`]: the parser refuses one without the other.
    pub queue: QueueTarget,
    /// CloudWatch namespace of the EMF lines.
    pub metrics_namespace: String,
    pub serve: ServeConfig,
}

impl Default for Config {
    /// The documented defaults: what an empty environment gives.
    fn default() -> Self {
        Self::from_lookup(|_| None).expect("the defaults are valid")
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Builds the configuration from `lookup`, which returns a variable's
    /// value. Empty values count as unset; defaults and ranges come from
    /// [`vars::VARIABLES`].
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let env = Lookup(&lookup);
        let policy = Policy::from_vars(&env)?;
        let identity = IdentityConfig::from_vars(&env)?;
        let store = StoreConfig::from_vars(&env)?;
        let queue = QueueTarget::from_vars(&env, store.valkey.is_some())?;
        Ok(Self {
            policy,
            identity,
            store,
            queue,
            metrics_namespace: env.text(&vars::QUOTA_METRICS_NAMESPACE),
            serve: ServeConfig::from_vars(&env)?,
        })
    }

    /// Refuses a configuration without `QUOTA_HASH_SECRET`: where a real
    /// deployment runs (Lambda), the built-in development secret would make
    /// every digest guessable.
    pub fn require_hash_secret(self) -> Result<Self, ConfigError> {
        match self.identity.hash_secret {
            HashSecret::Configured(_) => Ok(self),
            HashSecret::Development => Err(ConfigError::new(
                vars::QUOTA_HASH_SECRET.name(),
                "required in Lambda (32 random bytes, e.g. from Secrets Manager)",
            )),
        }
    }

    /// Whether digests use the built-in [`DEV_HASH_SECRET`] (`QUOTA_HASH_SECRET` unset).
    pub fn uses_development_secret(&self) -> bool {
        self.identity.hash_secret == HashSecret::Development
    }

    /// The HMAC key for digests: `QUOTA_HASH_SECRET`, or the built-in
    /// [`DEV_HASH_SECRET`] where it is unset (which only Lambda refuses, see
    /// [`Config::require_hash_secret`]). The one place that decides it.
    pub fn hash_secret(&self) -> &[u8] {
        match &self.identity.hash_secret {
            HashSecret::Configured(secret) => secret.as_bytes(),
            HashSecret::Development => DEV_HASH_SECRET.as_bytes(),
        }
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
        match (valkey, tls_ca) {
            (None, None) => Ok(None),
            (Some(v), tls_ca) if tls_ca.is_none() || v.is_tls() => Ok(Some(ValkeyConfig {
                cluster,
                wait_replicas,
                tls_ca,
                ..v
            })),
            _ => Err(ConfigError::new(
                vars::VALKEY_TLS_CA.name(),
                "needs a rediss:// or valkeys:// VALKEY_URL",
            )),
        }
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
        })
    }

    fn is_tls(&self) -> bool {
        is_tls_url(&self.url)
    }
}

/// Whether a Valkey URL asks for TLS (`rediss://` or `valkeys://`).
pub fn is_tls_url(url: &str) -> bool {
    url.starts_with("rediss://") || url.starts_with("valkeys://")
}

impl QueueTarget {
    /// `SCAN_QUEUE_URL`; a Valkey stream needs `has_valkey`.
    fn from_vars(env: &Lookup, has_valkey: bool) -> Result<Self, ConfigError> {
        Self::parse(env.optional(&vars::SCAN_QUEUE_URL), has_valkey)
    }

    /// `SCAN_QUEUE_URL`: unset, an SQS URL, or `valkey-stream:<key>` (which
    /// needs Valkey).
    fn parse(url: Option<String>, has_valkey: bool) -> Result<Self, ConfigError> {
        let err = |problem: String| Err(ConfigError::new(vars::SCAN_QUEUE_URL.name(), problem));
        let Some(url) = url else {
            return Ok(Self::Spool);
        };
        match url.strip_prefix("valkey-stream:") {
            Some("") => err("valkey-stream: needs a key".into()),
            Some(key) if !has_valkey => err(format!("valkey-stream:{key} needs VALKEY_URL")),
            // Braces in a key are a cluster hash tag: they must enclose something.
            Some(key) if key.contains(['{', '}']) && !has_hash_tag(key) => {
                err(format!(
                    "valkey-stream:{key}: braces in a stream key must form a non-empty hash \
                     tag ({{tag}})"
                ))
            }
            Some(key) => Ok(Self::ValkeyStream(key.to_owned())),
            None if url.starts_with("https://") || url.starts_with("http://") => Ok(Self::Sqs(url)),
            None => err("expected an SQS queue URL (https://…) or valkey-stream:<key>".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    /// An empty environment gives the documented defaults.
    #[test]
    fn defaults() {
        let c = Config::default();
        assert_eq!(c.policy.quota_anon.get(), 33);
        assert_eq!(c.policy.quota_token.get(), 333);
        assert_eq!(c.policy.warn_at.get(), 200);
        assert_eq!(c.policy.soft_window, 30);
        assert_eq!(c.policy.soft_delay, Duration::from_secs(5));
        assert_eq!(c.policy.hard_delay, Duration::from_secs(60));
        assert_eq!(c.policy.reset, ResetPolicy::UtcDay);
        assert_eq!(c.queue, QueueTarget::Spool);
        assert_eq!(c.policy.gateway_timeout, Duration::from_millis(29_000));
        assert_eq!(c.serve.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(c.identity.jwt.issuer, "stella-ops.org");
        assert_eq!(c.metrics_namespace, "StellaOps/Quota");
    }

    /// Each bad value names its variable.
    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            ("QUOTA_ANON", "0"),
            ("QUOTA_ANON", "many"),
            ("QUOTA_TOKEN", "-3"),
            ("QUOTA_RESET", "weekly"),
            ("QUOTA_FAIL_MODE", "maybe"),
            ("QUOTA_DELAY_MODE", "later"),
            ("QUOTA_PACING", "maybe"),
            ("QUOTA_MAX_BACKLOG_MS", "soon"),
            ("QUOTA_HASH_SECRET", "short"),
            ("QUOTA_IPV6_PREFIX", "129"),
            ("QUOTA_TRUSTED_PROXIES", "10.0.0.0/8, nonsense"),
            ("VALKEY_URL", "http://localhost"),
            ("VALKEY_CLUSTER", "perhaps"),
            ("SCAN_QUEUE_URL", "ftp://queue"),
            ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
            ("QUOTA_LISTEN", "everywhere"),
            ("QUOTA_STORE_TIMEOUT_MS", "0"),
            ("VALKEY_TLS_CA", "/nonexistent/ca.pem"),
            ("QUOTA_BREAKER_FAILURES", "some"),
            ("QUOTA_BREAKER_COOLDOWN_MS", "-1"),
        ] {
            let err = config(&[(var, value)]).unwrap_err();
            assert_eq!(err.var, var, "{var}={value}: {err}");
            assert!(err.to_string().starts_with(var));
        }
    }

    /// VALKEY_TLS_CA is read at start, must hold a certificate and needs a TLS URL.
    #[test]
    fn tls_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let good = dir.join("ca.pem");
        std::fs::write(
            &good,
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let bad = dir.join("empty.pem");
        std::fs::write(&bad, "nothing here").unwrap();
        let good = good.to_str().unwrap();
        let c = config(&[
            ("VALKEY_URL", "rediss://cache:6379"),
            ("VALKEY_TLS_CA", good),
        ])
        .unwrap();
        assert_eq!(c.store.valkey.unwrap().tls_ca.unwrap().path, good);
        for vars in [
            vec![
                ("VALKEY_URL", "redis://cache:6379"),
                ("VALKEY_TLS_CA", good),
            ],
            vec![("VALKEY_TLS_CA", good)],
            vec![
                ("VALKEY_URL", "rediss://cache:6379"),
                ("VALKEY_TLS_CA", bad.to_str().unwrap()),
            ],
        ] {
            assert_eq!(config(&vars).unwrap_err().var, "VALKEY_TLS_CA", "{vars:?}");
        }
    }

    /// Queue targets are told apart by their URL.
    #[test]
    fn queue_targets() {
        let c = config(&[
            ("VALKEY_URL", "redis://127.0.0.1:6379"),
            ("SCAN_QUEUE_URL", "valkey-stream:scan-jobs"),
        ])
        .unwrap();
        assert_eq!(c.queue, QueueTarget::ValkeyStream("scan-jobs".into()));
        let url = "https://sqs.us-east-1.amazonaws.com/123456789012/scans";
        let c = config(&[("SCAN_QUEUE_URL", url)]).unwrap();
        assert_eq!(c.queue, QueueTarget::Sqs(url.into()));
    }

    /// Trusted proxies accept CIDRs and bare addresses.
    #[test]
    fn trusted_proxies() {
        let c = config(&[(
            "QUOTA_TRUSTED_PROXIES",
            "10.0.0.0/8, 192.0.2.1,2001:db8::/32",
        )])
        .unwrap();
        assert_eq!(c.identity.trusted_proxies.len(), 3);
    }

    /// The secret is decided here: configured, or the development one that
    /// only Lambda refuses.
    #[test]
    fn hash_secret() {
        let c = Config::default();
        assert!(c.uses_development_secret());
        assert_eq!(c.hash_secret(), DEV_HASH_SECRET.as_bytes());
        assert_eq!(
            c.require_hash_secret().unwrap_err().var,
            "QUOTA_HASH_SECRET"
        );
        let c = config(&[("QUOTA_HASH_SECRET", "0123456789abcdef0123")]).unwrap();
        assert_eq!(c.hash_secret(), b"0123456789abcdef0123");
        assert!(c.require_hash_secret().is_ok());
    }

    /// Every numeric default lies in its range, so an empty environment
    /// builds a configuration.
    #[test]
    fn table_defaults_are_valid() {
        let _ = Config::default();
        for v in vars::VARIABLES {
            if let (Some((min, max)), vars::DefaultValue::Value(d)) = (v.range, v.default) {
                let n: u64 = d.parse().unwrap();
                assert!((min..=max).contains(&n), "{}", v.name);
            }
        }
    }
}
