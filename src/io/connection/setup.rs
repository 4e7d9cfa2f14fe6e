//! Building a handle from a URL or the configuration. TLS is rustls, verified against the
//! platform's roots, or only against `VALKEY_TLS_CA` when set; nothing skips verification.

use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisError, RedisResult, TlsCertificates};

use super::connector::{Kind, MIN_CONNECT_TIMEOUT, Valkey};
use super::iam::IamSigner;
use super::send::DETACHED_WAIT;
use crate::config::{Config, ConfigError, ValkeyConfig, is_tls_url};

/// No retries: one would re-send a command whose connection broke after it was written (an `INCR`
/// counted twice). So `MOVED`/`ASK`, `TRYAGAIN` and `CLUSTERDOWN` (it did not run) are refused,
/// not redirected; the client refreshes its slot map for the next command.
const CLUSTER_RETRIES: u32 = 0;

impl Valkey {
    /// A handle on `url`, not connected yet; `timeout` bounds each command of the request path.
    pub fn new(url: &str, cluster: bool, timeout: Duration) -> Result<Self, ConfigError> {
        Self::with_tls_ca(url, cluster, timeout, None, None)
    }

    /// The Valkey named by `config`, commands bound by `QUOTA_STORE_TIMEOUT_MS`; `None` if no URL.
    pub fn from_config(config: &Config) -> Result<Option<Self>, ConfigError> {
        Self::from_config_within(config, config.store.timeout)
    }

    /// The Valkey named by `config`, commands bound by `timeout` (the consumer's acks get more).
    pub fn from_config_within(
        config: &Config,
        timeout: Duration,
    ) -> Result<Option<Self>, ConfigError> {
        Self::configured(config, timeout, |v| v.iam.clone().map(IamSigner::new))
    }

    /// The Valkey named by `config`, signing in with `signer`'s tokens: the tests know each one.
    #[cfg(feature = "testing")]
    pub fn from_config_signed(
        config: &Config,
        signer: IamSigner,
    ) -> Result<Option<Self>, ConfigError> {
        Self::configured(config, config.store.timeout, |_| Some(signer))
    }

    fn configured(
        config: &Config,
        timeout: Duration,
        iam: impl FnOnce(&ValkeyConfig) -> Option<IamSigner>,
    ) -> Result<Option<Self>, ConfigError> {
        let Some(v) = &config.store.valkey else {
            return Ok(None);
        };
        let ca = v.tls_ca.as_ref().map(|ca| ca.pem.as_slice());
        Self::with_tls_ca(&v.url, v.cluster, timeout, ca, iam(v)).map(Some)
    }

    /// Like [`new`](Self::new), but a `rediss://` server must chain to `ca`'s PEM certificates.
    fn with_tls_ca(
        url: &str,
        cluster: bool,
        timeout: Duration,
        ca: Option<&[u8]>,
        iam: Option<IamSigner>,
    ) -> Result<Self, ConfigError> {
        if is_tls_url(url) {
            // aws-lc-rs as the process-wide rustls provider: with more than one compiled in (the
            // AWS SDK brings its own), rustls would panic at the first TLS handshake. Err: one is
            // installed already.
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        }
        let info = url
            .into_connection_info()
            .map_err(|e| ConfigError::new("VALKEY_URL", e.to_string()))?;
        let tls = ca.map(|pem| TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.to_vec()),
        });
        // A bad CA surfaces when the client is built; name the right variable.
        let var = ca.map_or("VALKEY_URL", |_| "VALKEY_TLS_CA");
        let bad = |e: RedisError| ConfigError::new(var, e.to_string());
        let kind = if cluster {
            let mut builder = ClusterClient::builder([info.clone()])
                .connection_timeout(timeout.max(MIN_CONNECT_TIMEOUT))
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
