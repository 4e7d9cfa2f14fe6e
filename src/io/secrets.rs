//! Secrets by reference, read once at start: [`crate::config::Config::from_lookup`] gets the
//! environment with every reference ([`crate::config::secret_ref`]) replaced by its secret. A
//! `file:` secret loses its trailing newline (editors and `echo` add one; a key never means one). A
//! reference that cannot be read, or holds an empty or binary secret, stops the start with the
//! variable, the reference and the reason, never the value.

use std::collections::HashMap;
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use aws_sdk_secretsmanager::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_ssm::types::ParameterType;

use crate::config::secret_ref::{SecretRef, references};
use crate::config::{Config, ConfigError};

/// The SDK retries within this bound, well inside Lambda's 10 s init.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A slower connect means a broken network path (a VPC without a route to the service).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The environment `base` gives, with each reference replaced by its secret.
pub struct Resolved<F> {
    base: F,
    secrets: HashMap<&'static str, String>,
}

impl<F: Fn(&str) -> Option<String>> Resolved<F> {
    /// The variable's value: its secret if it was a reference.
    pub fn get(&self, name: &str) -> Option<String> {
        self.secrets
            .get(name)
            .cloned()
            .or_else(|| (self.base)(name))
    }

    /// The variables read from a secret store, by name.
    pub fn from_store(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = self.secrets.keys().copied().collect();
        names.sort_unstable();
        names
    }
}

impl<F> std::fmt::Debug for Resolved<F> {
    /// Names only: the values are secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.secrets.keys()).finish()
    }
}

/// The process environment, references read, parsed; logs the names of variables from a store.
pub async fn config_from_env() -> Result<Config, ConfigError> {
    let resolved = resolve(|k: &str| std::env::var(k).ok()).await?;
    for variable in resolved.from_store() {
        tracing::info!(variable, "read from its secret store");
    }
    Config::from_lookup(|k| resolved.get(k))
}

/// `base` with its references read; the SDK is loaded only when one names an AWS store.
pub async fn resolve<F>(base: F) -> Result<Resolved<F>, ConfigError>
where
    F: Fn(&str) -> Option<String>,
{
    let sdk = if references(&base)?.iter().any(|(_, r)| r.in_aws()) {
        aws_config::load_defaults(BehaviorVersion::latest()).await
    } else {
        SdkConfig::builder().build()
    };
    resolve_with(base, &sdk).await
}

/// `base` with its references read through `sdk`.
pub async fn resolve_with<F>(base: F, sdk: &SdkConfig) -> Result<Resolved<F>, ConfigError>
where
    F: Fn(&str) -> Option<String>,
{
    let wanted = references(&base)?;
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_timeout(READ_TIMEOUT)
        .build();
    let sdk = &sdk.to_builder().timeout_config(timeouts).build();
    let reads = wanted.iter().map(|(var, reference)| async move {
        match read(reference, sdk).await.and_then(usable) {
            Ok(secret) => Ok((*var, secret)),
            Err(reason) => Err(ConfigError::new(var, format!("{reference}: {reason}"))),
        }
    });
    let secrets = futures_util::future::try_join_all(reads).await?;
    Ok(Resolved {
        base,
        secrets: secrets.into_iter().collect(),
    })
}

/// Refuses a blank secret (it would parse as unset) and a reference or ARN (the parser prints it).
fn usable(secret: String) -> Result<String, String> {
    if secret.trim().is_empty() {
        Err("the secret is empty".to_owned())
    } else if !matches!(SecretRef::parse(&secret), Ok(None)) {
        Err("the secret holds a reference or an ARN, not a value".to_owned())
    } else {
        Ok(secret)
    }
}

/// The secret `reference` names, or why it cannot be had; a store's client is built for its read.
async fn read(reference: &SecretRef, sdk: &SdkConfig) -> Result<String, String> {
    match reference {
        SecretRef::File(path) => read_file(path),
        SecretRef::SecretsManager(id) => {
            let client = aws_sdk_secretsmanager::Client::new(sdk);
            let got = client.get_secret_value().secret_id(id).send().await;
            let got = got.map_err(|e| reason(&e))?;
            match (got.secret_string, got.secret_binary) {
                (Some(secret), _) => Ok(secret),
                (None, Some(_)) => Err("the secret is binary; a string is expected".to_owned()),
                (None, None) => Err("the secret has no value".to_owned()),
            }
        }
        SecretRef::Parameter(name) => {
            let client = aws_sdk_ssm::Client::new(sdk);
            let got = client
                .get_parameter()
                .name(name)
                .with_decryption(true)
                .send();
            let parameter = got.await.map_err(|e| reason(&e))?.parameter;
            let parameter = parameter.ok_or("the store returned no parameter")?;
            match parameter.r#type {
                Some(ParameterType::SecureString) => parameter
                    .value
                    .ok_or_else(|| "the parameter has no value".to_owned()),
                other => Err(format!(
                    "a {} parameter, not a SecureString: a secret is kept encrypted",
                    other.as_ref().map_or("typeless", |t| t.as_str())
                )),
            }
        }
    }
}

/// A secret file's text less its trailing newline (`\n` or `\r\n`); errors never show the content.
fn read_file(path: &str) -> Result<String, String> {
    // Once, at start: a blocking read is what the start wants.
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read the file: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| "the file is not UTF-8 text".to_owned())?;
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

/// What the store said, in one line: a service error's code and message (not the raw response the
/// SDK's display appends), or why no answer came.
fn reason<E, R>(e: &SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match (e.code(), e.message()) {
        (Some(code), Some(message)) => {
            let words: Vec<_> = message.split_whitespace().collect();
            format!("{code}: {}", words.join(" "))
        }
        (Some(code), None) => code.to_owned(),
        _ => DisplayErrorContext(e).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain values pass through untouched and load no SDK; a malformed
    /// reference names its variable before any request.
    #[tokio::test]
    async fn plain_values_need_no_store() {
        let base = |k: &str| (k == "VALKEY_URL").then(|| "redis://127.0.0.1:1".to_owned());
        let resolved = resolve(base).await.unwrap();
        assert_eq!(
            resolved.get("VALKEY_URL").as_deref(),
            Some("redis://127.0.0.1:1")
        );
        assert!(resolved.from_store().is_empty());
        let bad = |k: &str| (k == "QUOTA_HASH_SECRET").then(|| "ssm:".to_owned());
        assert_eq!(resolve(bad).await.unwrap_err().var, "QUOTA_HASH_SECRET");
    }

    /// A `file:` reference is the file's text less its trailing newline,
    /// read without AWS; a missing or empty file stops the start naming
    /// the variable and the path, never the content.
    #[tokio::test]
    async fn files_are_read_here() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("hash");
        std::fs::write(&key, "s3cret-key-0123456789\r\n").unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let at = |path: &std::path::Path| format!("file:{}", path.display());
        let (key_ref, empty_ref) = (at(&key), at(&empty));
        let base = |k: &str| (k == "QUOTA_HASH_SECRET").then(|| key_ref.clone());
        let resolved = resolve(base).await.unwrap();
        assert_eq!(
            resolved.get("QUOTA_HASH_SECRET").as_deref(),
            Some("s3cret-key-0123456789")
        );
        let missing = dir.path().join("missing");
        let missing_ref = at(&missing);
        for (reference, why) in [(&missing_ref, "cannot read"), (&empty_ref, "empty")] {
            let base = |k: &str| (k == "VALKEY_URL").then(|| reference.clone());
            let e = resolve(base).await.unwrap_err();
            let line = e.to_string();
            assert_eq!(e.var, "VALKEY_URL");
            assert!(
                line.contains(reference.as_str()) && line.contains(why),
                "{line}"
            );
            assert!(!line.contains('\n'), "{line}");
        }
    }

    /// Blanks are an empty secret; a reference held in a secret is not
    /// followed, and the error does not show it.
    #[test]
    fn usable_secrets() {
        assert_eq!(usable(" \n".into()).unwrap_err(), "the secret is empty");
        assert!(!usable("ssm:/hidden".into()).unwrap_err().contains("hidden"));
        assert_eq!(usable("x".into()).as_deref(), Ok("x"));
    }
}
