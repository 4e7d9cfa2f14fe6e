//! The keys tokens are verified with (`QUOTA_JWT_PUBLIC_KEY`, `QUOTA_JWT_JWKS`; inline or a file),
//! each pinned to the one algorithm its type allows; symmetric keys and other curves are refused.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};

use crate::config::ConfigError;

/// One key, with the one algorithm it verifies and its `kid`, if any.
pub struct VerificationKey {
    /// The JWKS's `kid`; `None` for the PEM key, which any `kid` may try.
    pub kid: Option<String>,
    pub algorithm: Algorithm,
    pub key: DecodingKey,
}

/// The keys of both settings, the PEM key first; none when neither is set.
pub fn load(
    public_key: Option<&str>,
    jwks: Option<&str>,
) -> Result<Vec<VerificationKey>, ConfigError> {
    let mut keys = Vec::new();
    if let Some(value) = public_key {
        let pem = inline_or_file("QUOTA_JWT_PUBLIC_KEY", value, "-----BEGIN")?;
        keys.push(pem_key(&pem)?);
    }
    if let Some(value) = jwks {
        let json = inline_or_file("QUOTA_JWT_JWKS", value, "{")?;
        keys.extend(jwks_keys(&json)?);
    }
    Ok(keys)
}

/// Reads `value` as inline text when it starts like one, else as a file path.
fn inline_or_file(var: &'static str, value: &str, starts: &str) -> Result<String, ConfigError> {
    if value.trim_start().starts_with(starts) {
        return Ok(value.to_owned());
    }
    std::fs::read_to_string(value)
        .map_err(|e| ConfigError::new(var, format!("cannot read {value:?}: {e}")))
}

/// One PEM public key, its algorithm fixed by its type.
fn pem_key(pem: &str) -> Result<VerificationKey, ConfigError> {
    let bytes = pem.as_bytes();
    let (algorithm, key) = if let Ok(k) = DecodingKey::from_rsa_pem(bytes) {
        (Algorithm::RS256, k)
    } else if let Ok(k) = DecodingKey::from_ec_pem(bytes) {
        (Algorithm::ES256, k)
    } else if let Ok(k) = DecodingKey::from_ed_pem(bytes) {
        (Algorithm::EdDSA, k)
    } else {
        return Err(ConfigError::new(
            "QUOTA_JWT_PUBLIC_KEY",
            "not an RSA, P-256 or Ed25519 public key in PEM form",
        ));
    };
    Ok(VerificationKey {
        kid: None,
        algorithm,
        key,
    })
}

/// The usable keys of a JWKS; symmetric and unsupported keys are refused.
fn jwks_keys(json: &str) -> Result<Vec<VerificationKey>, ConfigError> {
    let err = |p: String| ConfigError::new("QUOTA_JWT_JWKS", p);
    let set: JwkSet = serde_json::from_str(json).map_err(|e| err(format!("not a JWKS: {e}")))?;
    set.keys
        .iter()
        .map(|jwk| {
            let kid = jwk.common.key_id.clone();
            let algorithm = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => Algorithm::RS256,
                AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                    Algorithm::ES256
                }
                AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                    Algorithm::EdDSA
                }
                AlgorithmParameters::OctetKey(_) => {
                    return Err(err(format!(
                        "key {kid:?} is symmetric; only public keys are accepted"
                    )));
                }
                _ => return Err(err(format!("key {kid:?} uses an unsupported curve"))),
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| err(format!("key {kid:?}: {e}")))?;
            Ok(VerificationKey {
                kid,
                algorithm,
                key,
            })
        })
        .collect()
}
