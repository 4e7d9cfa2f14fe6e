//! Every setting, read once at start from environment variables.
//!
//! [`Config::from_lookup`] takes a lookup function instead of reading the
//! process environment, so tests build configurations without touching
//! global state. A bad value fails at start with the variable's name.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `QUOTA_ANON` | 33 | daily ceiling per anonymous source (IP); 1 … 4294967295 |
//! | `QUOTA_TOKEN` | 333 | daily ceiling per token id; a valid token's `tier` claim overrides it; 1 … 4294967295 |
//! | `QUOTA_WARN_AT` | 200 | scans used from which the response carries a reminder; 1 … 4294967295 |
//! | `QUOTA_SOFT_WINDOW` | 30 | over-quota scans that get the soft delay; 0 … 4294967295 |
//! | `QUOTA_SOFT_DELAY_MS` | 5000 | soft delay; 0 … 86400000 (24 h) |
//! | `QUOTA_HARD_DELAY_MS` | 60000 | hard delay, beyond the soft window; 0 … 86400000 (24 h) |
//! | `QUOTA_RESET` | `utc-day` | `utc-day` (next 00:00 UTC) or `rolling` (24 h after the first scan) |
//! | `QUOTA_HASH_SECRET` | — | HMAC key for subject digests; required in Lambda, ≥ 16 bytes |
//! | `QUOTA_IPV6_PREFIX` | 64 | IPv6 addresses are counted per prefix of this length; 1 … 128 |
//! | `QUOTA_TRUSTED_PROXIES` | empty | CIDRs whose `X-Forwarded-For` is believed |
//! | `VALKEY_URL` | unset: in-memory store | `redis://` or `rediss://` URL of the quota Valkey |
//! | `VALKEY_CLUSTER` | `false` | speak cluster mode (ElastiCache Serverless) |
//! | `VALKEY_TLS_CA` | unset: the platform's roots | path to a PEM file of CA certificates trusted for `rediss://` (for a private CA; ElastiCache needs none) |
//! | `QUOTA_STORE_TIMEOUT_MS` | 100 | bound on every Valkey call; 1 … 86400000 (24 h) |
//! | `QUOTA_FAIL_MODE` | `open` | `open`: accept unmetered when Valkey fails; `closed`: 503 |
//! | `QUOTA_BREAKER_FAILURES` | 5 | consecutive store failures that open the circuit breaker; 0 turns it off; 0 … 4294967295 |
//! | `QUOTA_BREAKER_COOLDOWN_MS` | 1000 | how long an open breaker skips the store before one probe; 0 … 86400000 (24 h) |
//! | `QUOTA_DELAY_MODE` | `sleep` | `sleep` in the handler (rest deferred) or `defer` all of it |
//! | `QUOTA_GATEWAY_TIMEOUT_MS` | 29000 | the gateway's integration timeout; 1 … 86400000 (24 h) |
//! | `QUOTA_DELAY_MARGIN_MS` | 1000 | kept free below the gateway and Lambda deadlines; 0 … 86400000 (24 h) |
//! | `QUOTA_PACING` | `on` | `on`: a subject's over-quota scans start one delay apart; `off`: the seed's fixed per-request delays |
//! | `QUOTA_MAX_BACKLOG_MS` | 900000 | a scan whose paced delay would exceed this is refused with 503 `backlog_full`; 0 … 86400000 (24 h) |
//! | `SCAN_QUEUE_URL` | unset: stdout spool | an SQS queue URL, or `valkey-stream:<key>` |
//! | `QUOTA_JWT_PUBLIC_KEY` | — | PEM text, or a path to a PEM file (RSA, P-256 or Ed25519) |
//! | `QUOTA_JWT_JWKS` | — | JWKS JSON, or a path to it; keys picked by `kid` |
//! | `QUOTA_JWT_ISSUER` | `stella-ops.org` | required `iss` |
//! | `QUOTA_JWT_AUDIENCE` | unset: not checked | required `aud` |
//! | `QUOTA_TRUST_GATEWAY_CLAIMS` | `false` | use claims an API Gateway JWT authorizer verified |
//! | `QUOTA_METRICS_NAMESPACE` | `StellaOps/Quota` | CloudWatch namespace of the EMF lines |
//! | `QUOTA_LISTEN` | `127.0.0.1:9000` | address of the local server (`quota-gate serve`) |
//! | `QUOTA_MAX_CONNECTIONS` | 1024 | connections `quota-gate serve` keeps open at once (more wait until one closes); 1 … 1000000, keep it below `ulimit -n` |

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;

use crate::decide::Limits;

/// A configuration error, naming the variable at fault.
#[derive(Debug, thiserror::Error)]
#[error("{var}: {problem}")]
pub struct ConfigError {
    pub var: &'static str,
    pub problem: String,
}

impl ConfigError {
    pub fn new(var: &'static str, problem: impl Into<String>) -> Self {
        Self {
            var,
            problem: problem.into(),
        }
    }
}

/// A setting that is one of a few words: the enum, its variants' words, and
/// `FromStr` that names the words it expects.
macro_rules! word_setting {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $word:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// The word that names it in the environment.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $word,)+
                }
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(word: &str) -> Result<Self, String> {
                match word {
                    $($word => Ok(Self::$variant),)+
                    other => Err(format!(
                        "expected {}, got {other:?}",
                        [$($word),+].join(" or ")
                    )),
                }
            }
        }
    };
}

word_setting! {
    /// When a counter expires.
    ResetPolicy {
        /// At the next 00:00 UTC after the first scan.
        UtcDay = "utc-day",
        /// 24 hours after the first scan.
        Rolling = "rolling",
    }
}

word_setting! {
    /// What to do when the quota store cannot answer in time.
    FailMode {
        /// Accept the scan without delay and say the quota was not checked.
        Open = "open",
        /// Refuse with 503 and `Retry-After`.
        Closed = "closed",
    }
}

word_setting! {
    /// Where over-quota delay is spent.
    DelayMode {
        /// Sleep in the handler as far as the gateway allows; defer the rest onto the job.
        Sleep = "sleep",
        /// Answer at once; the whole delay holds the queued job back.
        Defer = "defer",
    }
}

word_setting! {
    /// Whether a subject's over-quota scans are spread out one delay apart.
    Pacing {
        /// `slot_k = max(arrival_k, slot_(k-1)) + D(tier_k)`: a burst is spread out.
        On = "on",
        /// The seed's fixed per-request delays.
        Off = "off",
    }
}

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
        let pem = std::fs::read(path)
            .map_err(|e| ConfigError::new("VALKEY_TLS_CA", format!("cannot read {path:?}: {e}")))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(ConfigError::new(
                "VALKEY_TLS_CA",
                format!("{path:?} holds no PEM certificate"),
            ));
        }
        Ok(Self {
            path: path.to_owned(),
            pem,
        })
    }
}

/// The largest daily ceiling, window or failure count: 2^32 − 1.
pub const MAX_LIMIT: u64 = u32::MAX as u64;
/// The longest delay or timeout: 24 h, in milliseconds.
pub const MAX_MILLIS: u64 = 86_400_000;
/// The most connections `QUOTA_MAX_CONNECTIONS` may allow.
pub const MAX_CONNECTIONS: u64 = 1_000_000;

/// Parses a whole number in `min..=max` for the variable `var`.
pub fn ranged_number(var: &'static str, raw: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    let expected = || format!("expected a whole number in {min}..={max}, got {raw:?}");
    let n: u64 = raw
        .trim()
        .parse()
        .map_err(|_| ConfigError::new(var, expected()))?;
    if (min..=max).contains(&n) {
        Ok(n)
    } else {
        Err(ConfigError::new(var, expected()))
    }
}

/// The secret used by `quota-gate serve` when none is configured. Digests made
/// with it are not private: it is in the source.
pub const DEV_HASH_SECRET: &str = "quota-gate-local-development-secret";

/// Every setting of the gate.
#[derive(Debug, Clone)]
pub struct Config {
    pub quota_anon: NonZeroU32,
    pub quota_token: NonZeroU32,
    pub warn_at: NonZeroU32,
    pub soft_window: u32,
    pub soft_delay: Duration,
    pub hard_delay: Duration,
    pub reset: ResetPolicy,
    /// `None` when unset; read it through [`Config::hash_secret`].
    hash_secret: Option<String>,
    pub ipv6_prefix: u8,
    pub trusted_proxies: Vec<IpNet>,
    pub valkey_url: Option<String>,
    pub valkey_cluster: bool,
    /// Extra trust for `rediss://`: replaces the platform's roots when set.
    pub valkey_tls_ca: Option<CaBundle>,
    pub store_timeout: Duration,
    /// Consecutive failures that open the breaker (0: never opens).
    pub breaker_failures: u32,
    pub breaker_cool_down: Duration,
    pub fail_mode: FailMode,
    pub delay_mode: DelayMode,
    pub gateway_timeout: Duration,
    pub delay_margin: Duration,
    pub pacing: Pacing,
    /// The longest delay a paced scan may be given; beyond it, 503 `backlog_full`.
    pub max_backlog: Duration,
    pub queue: QueueTarget,
    pub jwt_public_key: Option<String>,
    pub jwt_jwks: Option<String>,
    pub jwt_issuer: String,
    pub jwt_audience: Option<String>,
    pub trust_gateway_claims: bool,
    pub metrics_namespace: String,
    pub listen: SocketAddr,
    /// Connections `quota-gate serve` keeps open at once.
    pub max_connections: u32,
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

    /// Builds the configuration from `lookup`, which returns a variable's value.
    /// Empty values count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |k: &str| {
            lookup(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let parse = |k: &'static str, default: &str| -> Result<String, ConfigError> {
            Ok(get(k).unwrap_or_else(|| default.to_owned()))
        };
        // Every numeric setting has a range (documented in the table above):
        // a value outside it stops the start, naming the variable, so no value
        // can make a later request overflow.
        let ranged = |k: &'static str, default: &str, min: u64, max: u64| {
            ranged_number(k, &parse(k, default)?, min, max)
        };
        let limit = |k: &'static str, default: &str| -> Result<NonZeroU32, ConfigError> {
            let n = ranged(k, default, 1, MAX_LIMIT)?;
            NonZeroU32::new(n as u32).ok_or_else(|| ConfigError::new(k, "must be above 0"))
        };
        let count = |k: &'static str, default: &str| -> Result<u32, ConfigError> {
            Ok(ranged(k, default, 0, MAX_LIMIT)? as u32)
        };
        let millis = |k: &'static str, default: &str, min: u64| {
            ranged(k, default, min, MAX_MILLIS).map(Duration::from_millis)
        };
        let flag = |k: &'static str| -> Result<bool, ConfigError> {
            match parse(k, "false")?.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => Ok(true),
                "false" | "0" | "no" => Ok(false),
                other => Err(ConfigError::new(
                    k,
                    format!("expected true or false, got {other:?}"),
                )),
            }
        };

        fn word<T: FromStr<Err = String>>(
            var: &'static str,
            raw: String,
        ) -> Result<T, ConfigError> {
            raw.parse()
                .map_err(|problem| ConfigError::new(var, problem))
        }
        let reset = word("QUOTA_RESET", parse("QUOTA_RESET", "utc-day")?)?;
        let fail_mode = word("QUOTA_FAIL_MODE", parse("QUOTA_FAIL_MODE", "open")?)?;
        let delay_mode = word("QUOTA_DELAY_MODE", parse("QUOTA_DELAY_MODE", "sleep")?)?;
        let pacing = word("QUOTA_PACING", parse("QUOTA_PACING", "on")?)?;

        let hash_secret = get("QUOTA_HASH_SECRET");
        if let Some(s) = &hash_secret {
            if s.len() < 16 {
                return Err(ConfigError::new(
                    "QUOTA_HASH_SECRET",
                    "must be at least 16 bytes (32 random bytes recommended)",
                ));
            }
        }

        let ipv6_prefix = ranged("QUOTA_IPV6_PREFIX", "64", 1, 128)?;

        let trusted_proxies = get("QUOTA_TRUSTED_PROXIES")
            .map(|raw| {
                raw.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        IpNet::from_str(s)
                            .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
                            .map_err(|_| {
                                ConfigError::new(
                                    "QUOTA_TRUSTED_PROXIES",
                                    format!("{s:?} is not an IP address or CIDR"),
                                )
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();

        let valkey_url = get("VALKEY_URL");
        if let Some(url) = &valkey_url {
            if !(url.starts_with("redis://")
                || url.starts_with("rediss://")
                || url.starts_with("valkey://")
                || url.starts_with("valkeys://"))
            {
                return Err(ConfigError::new(
                    "VALKEY_URL",
                    "expected a redis://, rediss://, valkey:// or valkeys:// URL",
                ));
            }
        }

        let valkey_tls_ca = get("VALKEY_TLS_CA")
            .map(|path| CaBundle::read(&path))
            .transpose()?;
        if valkey_tls_ca.is_some()
            && !valkey_url
                .as_deref()
                .is_some_and(|u| u.starts_with("rediss://") || u.starts_with("valkeys://"))
        {
            return Err(ConfigError::new(
                "VALKEY_TLS_CA",
                "needs a rediss:// or valkeys:// VALKEY_URL",
            ));
        }

        let queue = match get("SCAN_QUEUE_URL") {
            None => QueueTarget::Spool,
            Some(url) => match url.strip_prefix("valkey-stream:") {
                Some("") => {
                    return Err(ConfigError::new(
                        "SCAN_QUEUE_URL",
                        "valkey-stream: needs a key",
                    ));
                }
                Some(key) if valkey_url.is_none() => {
                    return Err(ConfigError::new(
                        "SCAN_QUEUE_URL",
                        format!("valkey-stream:{key} needs VALKEY_URL"),
                    ));
                }
                Some(key)
                    if key.contains(['{', '}'])
                        && key
                            .find('{')
                            .is_none_or(|o| key[o + 1..].find('}').is_none_or(|len| len == 0)) =>
                {
                    return Err(ConfigError::new(
                        "SCAN_QUEUE_URL",
                        format!(
                            "valkey-stream:{key}: braces in a stream key must form a \
                             non-empty hash tag ({{tag}})"
                        ),
                    ));
                }
                Some(key) => QueueTarget::ValkeyStream(key.to_owned()),
                None if url.starts_with("https://") || url.starts_with("http://") => {
                    QueueTarget::Sqs(url)
                }
                None => {
                    return Err(ConfigError::new(
                        "SCAN_QUEUE_URL",
                        "expected an SQS queue URL (https://…) or valkey-stream:<key>",
                    ));
                }
            },
        };

        let listen = parse("QUOTA_LISTEN", "127.0.0.1:9000")?;
        let listen = listen.parse().map_err(|_| {
            ConfigError::new(
                "QUOTA_LISTEN",
                format!("expected host:port, got {listen:?}"),
            )
        })?;

        let store_timeout = millis("QUOTA_STORE_TIMEOUT_MS", "100", 1)?;

        Ok(Self {
            quota_anon: limit("QUOTA_ANON", "33")?,
            quota_token: limit("QUOTA_TOKEN", "333")?,
            warn_at: limit("QUOTA_WARN_AT", "200")?,
            soft_window: count("QUOTA_SOFT_WINDOW", "30")?,
            soft_delay: millis("QUOTA_SOFT_DELAY_MS", "5000", 0)?,
            hard_delay: millis("QUOTA_HARD_DELAY_MS", "60000", 0)?,
            reset,
            hash_secret,
            ipv6_prefix: ipv6_prefix as u8,
            trusted_proxies,
            valkey_url,
            valkey_cluster: flag("VALKEY_CLUSTER")?,
            valkey_tls_ca,
            store_timeout,
            breaker_failures: count("QUOTA_BREAKER_FAILURES", "5")?,
            breaker_cool_down: millis("QUOTA_BREAKER_COOLDOWN_MS", "1000", 0)?,
            fail_mode,
            delay_mode,
            gateway_timeout: millis("QUOTA_GATEWAY_TIMEOUT_MS", "29000", 1)?,
            delay_margin: millis("QUOTA_DELAY_MARGIN_MS", "1000", 0)?,
            pacing,
            max_backlog: millis("QUOTA_MAX_BACKLOG_MS", "900000", 0)?,
            queue,
            jwt_public_key: get("QUOTA_JWT_PUBLIC_KEY"),
            jwt_jwks: get("QUOTA_JWT_JWKS"),
            jwt_issuer: parse("QUOTA_JWT_ISSUER", "stella-ops.org")?,
            jwt_audience: get("QUOTA_JWT_AUDIENCE"),
            trust_gateway_claims: flag("QUOTA_TRUST_GATEWAY_CLAIMS")?,
            metrics_namespace: parse("QUOTA_METRICS_NAMESPACE", "StellaOps/Quota")?,
            listen,
            max_connections: ranged("QUOTA_MAX_CONNECTIONS", "1024", 1, MAX_CONNECTIONS)? as u32,
        })
    }

    /// The HMAC key for digests: `QUOTA_HASH_SECRET`. Unset, it is an error
    /// where a real deployment runs (Lambda), and the built-in
    /// [`DEV_HASH_SECRET`] with a warning where `development` is allowed
    /// (`quota-gate serve` and the operator commands on a laptop). The one
    /// place that decides it.
    pub fn hash_secret(&self, development: bool) -> Result<&[u8], ConfigError> {
        match &self.hash_secret {
            Some(secret) => Ok(secret.as_bytes()),
            None if development => {
                tracing::warn!(
                    "QUOTA_HASH_SECRET is unset: using the built-in development secret; \
                     digests are not private. Set it for anything but local testing."
                );
                Ok(DEV_HASH_SECRET.as_bytes())
            }
            None => Err(ConfigError::new(
                "QUOTA_HASH_SECRET",
                "required in Lambda (32 random bytes, e.g. from Secrets Manager)",
            )),
        }
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
        assert_eq!(c.quota_anon.get(), 33);
        assert_eq!(c.quota_token.get(), 333);
        assert_eq!(c.warn_at.get(), 200);
        assert_eq!(c.soft_window, 30);
        assert_eq!(c.soft_delay, Duration::from_secs(5));
        assert_eq!(c.hard_delay, Duration::from_secs(60));
        assert_eq!(c.reset, ResetPolicy::UtcDay);
        assert_eq!(c.queue, QueueTarget::Spool);
        assert_eq!(c.gateway_timeout, Duration::from_millis(29_000));
        assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(c.jwt_issuer, "stella-ops.org");
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
        let dir = std::env::temp_dir().join(format!("quota-gate-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
        assert_eq!(c.valkey_tls_ca.unwrap().path, good);
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
        let _ = std::fs::remove_dir_all(&dir);
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
        assert_eq!(c.trusted_proxies.len(), 3);
    }
}
