//! Building a handle: the URL, TLS and the configuration.
//!
//! TLS (`rediss://`, as ElastiCache Serverless always requires) is rustls
//! with the aws-lc-rs provider, installed here as the process default so no
//! rustls user in the process panics for want of one. Servers are verified
//! against the platform's roots (ElastiCache certificates chain to Amazon's
//! public roots), or only against `VALKEY_TLS_CA` when set. There is no
//! switch to skip verification.
//!
//! With `VALKEY_AUTH=iam` every connection the handle opens, and every node
//! connection of a cluster client, signs in with an IAM token from one
//! [`IamSigner`] (`iam.rs`).

use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisError, RedisResult, TlsCertificates};

use super::connector::{Kind, MIN_CONNECT_TIMEOUT, Valkey};
use super::iam::IamSigner;
use super::send::DETACHED_WAIT;
use crate::config::{Config, ConfigError, ValkeyConfig, is_tls_url};

/// The cluster client re-sends nothing. Its retries would re-send a command
/// whose connection broke after it was written (an `INCR` counted twice, a
/// refund taken twice), which [`Valkey::send`] reports as unanswered instead.
/// The price: a command refused with `MOVED`/`ASK`, `TRYAGAIN` or
/// `CLUSTERDOWN` (during a slot migration or a failover; it did not run) is
/// not redirected but refused, and the client refreshes its slot map for
/// the next command.
const CLUSTER_RETRIES: u32 = 0;

/// Makes aws-lc-rs the process-wide rustls provider, once. rustls refuses to
/// pick one itself when more than one is compiled in (the AWS SDK brings its
/// own rustls), and would panic at the first TLS handshake.
fn install_crypto_provider() {
    // Err means a provider is installed already, which is all we need.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

impl Valkey {
    /// Prepares a connection to `url` without connecting, trusting the
    /// platform's roots for `rediss://`. `timeout` bounds each command the
    /// request path sends.
    pub fn new(url: &str, cluster: bool, timeout: Duration) -> Result<Self, ConfigError> {
        Self::with_tls_ca(url, cluster, timeout, None, None)
    }

    /// The Valkey named by `config` (`VALKEY_URL`, `VALKEY_CLUSTER`,
    /// `VALKEY_TLS_CA`, `VALKEY_AUTH`), its commands bound by
    /// `QUOTA_STORE_TIMEOUT_MS`; `None` when no URL is set.
    pub fn from_config(config: &Config) -> Result<Option<Self>, ConfigError> {
        Self::from_config_within(config, config.store.timeout)
    }

    /// The Valkey named by `config`, its commands bound by `timeout` (the
    /// consumer gives its marker and ack calls more room than a request's):
    /// the one place a handle is built from the configuration.
    pub fn from_config_within(
        config: &Config,
        timeout: Duration,
    ) -> Result<Option<Self>, ConfigError> {
        config
            .store
            .valkey
            .as_ref()
            .map(|v| Self::configured(v, timeout, v.iam.clone().map(IamSigner::new)))
            .transpose()
    }

    /// The Valkey named by `config`, signing in with `signer`'s tokens (its
    /// credentials, region and clock) instead of the process's: the tests'
    /// way to know each token.
    #[cfg(feature = "testing")]
    pub fn from_config_signed(
        config: &Config,
        signer: IamSigner,
    ) -> Result<Option<Self>, ConfigError> {
        config
            .store
            .valkey
            .as_ref()
            .map(|v| Self::configured(v, config.store.timeout, Some(signer.clone())))
            .transpose()
    }

    fn configured(
        v: &ValkeyConfig,
        timeout: Duration,
        iam: Option<IamSigner>,
    ) -> Result<Self, ConfigError> {
        let ca = v.tls_ca.as_ref().map(|ca| ca.pem.as_slice());
        Self::with_tls_ca(&v.url, v.cluster, timeout, ca, iam)
    }

    /// Like [`new`](Self::new), but a `rediss://` server must chain to one of
    /// the PEM certificates in `ca` (and only to those).
    fn with_tls_ca(
        url: &str,
        cluster: bool,
        timeout: Duration,
        ca: Option<&[u8]>,
        iam: Option<IamSigner>,
    ) -> Result<Self, ConfigError> {
        if is_tls_url(url) {
            install_crypto_provider();
        }
        let tls = ca.map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        });
        let (var, info) = match url.into_connection_info() {
            Ok(info) => ("VALKEY_TLS_CA", info),
            Err(e) => return Err(ConfigError::new("VALKEY_URL", e.to_string())),
        };
        // A bad CA surfaces when the client is built; name the right variable.
        let bad = |e: RedisError| {
            ConfigError::new(
                if tls.is_some() { var } else { "VALKEY_URL" },
                e.to_string(),
            )
        };
        let connect_timeout = timeout.max(MIN_CONNECT_TIMEOUT);
        let kind = if cluster {
            let mut builder = ClusterClient::builder([info.clone()])
                .connection_timeout(connect_timeout)
                .response_timeout(DETACHED_WAIT)
                .retries(CLUSTER_RETRIES);
            if let Some(certs) = &tls {
                builder = builder.certs(certs.clone());
            }
            if let Some(signer) = &iam {
                builder = builder.set_credentials_provider(signer.clone());
            }
            Kind::Cluster(Arc::new(builder.build().map_err(bad)?))
        } else {
            Kind::Standalone(Box::new(
                client_for(info.clone(), tls.as_ref()).map_err(bad)?,
            ))
        };
        Ok(Self::assemble(kind, info, tls, iam, timeout))
    }
}

pub(crate) fn client_for(
    info: ConnectionInfo,
    tls: Option<&TlsCertificates>,
) -> RedisResult<redis::Client> {
    match tls {
        Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
        None => redis::Client::open(info),
    }
}
