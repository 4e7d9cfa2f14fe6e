//! Every setting, read once at start from environment variables into one serde struct per group
//! ([`vars::VARIABLES`] holds names, defaults and ranges). Environment variables rather than clap's
//! `env` feature: Lambda has no command line, and one parser serves both binaries.

mod env;
mod error;
mod identity;
mod policy;
mod queue;
pub mod secret_ref;
mod store;
pub mod table;
pub mod vars;

pub use crate::rules::modes::{
    DelayMode, FailMode, Mode, OnEviction, Pacing, ResetPolicy, ValkeyAuth,
};
use std::net::SocketAddr;
use std::time::Duration;

use env::{Env, flag, millis};
pub use error::ConfigError;
use identity::HashSecret;
pub use identity::{DEV_HASH_SECRET, IdentityConfig, JwtConfig};
pub use policy::Policy;
pub use queue::QueueTarget;
use serde::Deserialize;
use serde::de::{Deserializer, Error as _};
pub use store::{CaBundle, IamConfig, StoreConfig, ValkeyConfig, is_tls_url};

/// Every setting of the gate.
#[derive(Debug, Clone)]
pub struct Config {
    pub policy: Policy,
    pub identity: IdentityConfig,
    pub store: StoreConfig,
    /// A [`QueueTarget::ValkeyStream`] only ever comes with a [`StoreConfig::valkey`].
    pub queue: QueueTarget,
    pub queue_over: Option<String>,
    pub metrics_namespace: String,
    pub serve: ServeConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self::from_lookup(|_| None).expect("the defaults are valid")
    }
}

impl Config {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Builds the configuration from `lookup`, so tests touch no global state.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        secret_ref::refuse_unresolved(&lookup)?;
        let env = Env::read(&lookup)?;
        let policy: Policy = env.group()?;
        let mut identity: IdentityConfig = env.group()?;
        identity.jwt = env.group()?;
        let policy = policy.with_levels(&env, identity.ipv6_prefix)?;
        let store = StoreConfig {
            valkey: ValkeyConfig::read(&env)?,
            ..env.group()?
        };
        let (queue, queue_over) = queue::read(&env, store.valkey.is_some())?;
        Ok(Self {
            policy,
            identity,
            store,
            queue,
            queue_over,
            serve: env.group()?,
            metrics_namespace: env.group::<Namespace>()?.name,
        })
    }

    /// Needs `QUOTA_HASH_SECRET`: in Lambda, the development secret would make digests guessable.
    pub fn require_hash_secret(self) -> Result<Self, ConfigError> {
        match self.identity.hash_secret {
            HashSecret::Configured(_) => Ok(self),
            HashSecret::Development => Err(ConfigError::new(
                vars::QUOTA_HASH_SECRET.name,
                "required in Lambda (32 random bytes, e.g. from Secrets Manager)",
            )),
        }
    }

    /// Whether digests use the built-in [`DEV_HASH_SECRET`] (`QUOTA_HASH_SECRET` unset).
    pub fn uses_development_secret(&self) -> bool {
        self.identity.hash_secret == HashSecret::Development
    }

    /// The HMAC key for digests: `QUOTA_HASH_SECRET`, or [`DEV_HASH_SECRET`] where it is unset.
    pub fn hash_secret(&self) -> &[u8] {
        match &self.identity.hash_secret {
            HashSecret::Configured(secret) => secret.as_bytes(),
            HashSecret::Development => DEV_HASH_SECRET.as_bytes(),
        }
    }
}

/// The local server (`quota-gate serve`).
#[derive(Debug, Clone, Deserialize)]
pub struct ServeConfig {
    #[serde(rename = "QUOTA_LISTEN", deserialize_with = "host_port")]
    pub listen: SocketAddr,
    #[serde(rename = "QUOTA_MAX_CONNECTIONS")]
    pub max_connections: u32,
    #[serde(rename = "QUOTA_SERVE_WORKERS")]
    pub workers: u16,
    #[serde(rename = "QUOTA_EMF", deserialize_with = "flag")]
    pub emf: bool,
    #[serde(rename = "QUOTA_DRAIN_TIMEOUT_MS", deserialize_with = "millis")]
    pub drain_timeout: Duration,
}

fn host_port<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let listen = String::deserialize(d)?;
    listen
        .parse()
        .map_err(|_| D::Error::custom(format!("expected host:port, got {listen:?}")))
}

#[derive(Deserialize)]
struct Namespace {
    #[serde(rename = "QUOTA_METRICS_NAMESPACE")]
    name: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::time::Duration;

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

    /// `VALKEY_AUTH=iam` needs a TLS URL without credentials, a user and a
    /// cache; each refusal names its variable, and a user or cache without
    /// `iam` is refused rather than ignored.
    #[test]
    fn iam_auth() {
        let iam = [
            ("VALKEY_URL", "rediss://cache.example:6379"),
            ("VALKEY_AUTH", "iam"),
            ("VALKEY_USER", "gate"),
            ("VALKEY_CACHE_NAME", "quota"),
            ("VALKEY_CACHE_SERVERLESS", "true"),
        ];
        let c = config(&iam).unwrap().store.valkey.unwrap();
        let want = IamConfig {
            user: "gate".into(),
            cache: "quota".into(),
            serverless: true,
        };
        assert_eq!(c.iam, Some(want));
        let with = |var: &str, value: &str| {
            let mut vars = iam.to_vec();
            vars.retain(|(k, _)| *k != var);
            vars.push((var, value));
            config(&vars).map(|_| ()).unwrap_err().var
        };
        assert_eq!(
            with("VALKEY_URL", "redis://cache.example:6379"),
            "VALKEY_AUTH"
        );
        assert_eq!(
            with("VALKEY_URL", "rediss://u:p@cache.example:6379"),
            "VALKEY_URL"
        );
        assert_eq!(with("VALKEY_USER", ""), "VALKEY_USER");
        assert_eq!(with("VALKEY_CACHE_NAME", ""), "VALKEY_CACHE_NAME");
        assert_eq!(with("VALKEY_AUTH", "token"), "VALKEY_AUTH");
        assert_eq!(with("VALKEY_AUTH", "password"), "VALKEY_USER");
        assert_eq!(config(&iam[1..]).unwrap_err().var, "VALKEY_AUTH");
        let plain = config(&[("VALKEY_URL", "redis://127.0.0.1:6379")]).unwrap();
        assert_eq!(plain.store.valkey.unwrap().iam, None);
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

    /// The names a group asks serde for: its fields' variables.
    fn fields<T: serde::de::DeserializeOwned>() -> Vec<&'static str> {
        use serde::de::{Error, Visitor, value};
        struct Fields(Vec<&'static str>);
        impl<'de> serde::Deserializer<'de> for &mut Fields {
            type Error = value::Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, value::Error> {
                Err(Error::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, value::Error> {
                self.0.extend(fields);
                Err(Error::custom("fields read"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
                byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
                identifier ignored_any
            }
        }
        let mut fields = Fields(Vec::new());
        let _ = T::deserialize(&mut fields);
        fields.0
    }

    /// Every row of the table (less the logger's) is the field of one
    /// group, and every group's field is a row.
    #[test]
    fn every_row_is_a_field() {
        let mut read = [
            fields::<Policy>(),
            fields::<policy::LevelVars>(),
            fields::<IdentityConfig>(),
            fields::<JwtConfig>(),
            fields::<StoreConfig>(),
            fields::<ValkeyConfig>(),
            fields::<store::IamVars>(),
            fields::<queue::QueueVars>(),
            fields::<ServeConfig>(),
            fields::<Namespace>(),
        ]
        .concat();
        read.sort_unstable();
        let mut rows: Vec<_> = vars::VARIABLES
            .iter()
            .filter(|v| v.applies != vars::Applies::Logging)
            .map(|v| v.name)
            .collect();
        rows.sort_unstable();
        assert_eq!(read, rows);
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
