//! Token holders: JWTs verified locally against configured public keys ([`keys`]). The header's
//! `alg` must be the key's one algorithm before any signature work, so neither `alg: none` nor an
//! HMAC token "signed" with the public key passes. `iss` must equal ours, `exp` and `nbf` hold with
//! no leeway, `aud` is required when configured; a token without a `kid` tries every key.

pub mod cache;
pub mod keys;

use std::num::NonZeroU32;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde::Deserialize;
use serde_json::Value;

use crate::config::{ConfigError, JwtConfig};
use cache::VerifiedCache;
use keys::VerificationKey;

/// Tokens longer than this are not parsed at all.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSubject {
    /// The token id claim: the counting material.
    pub tid: String,
    /// The token's own daily ceiling, from a numeric `tier` claim.
    pub tier: Option<NonZeroU32>,
    /// Its `QUOTA_EXEMPT_CLAIM` claim is `true`: never counted, delayed or paced.
    pub exempt: bool,
    /// Its `QUOTA_JWT_ACCOUNT_CLAIM` claim: the account all its tokens are counted as.
    pub account: Option<String>,
}

/// Why a presented token was not used; the string forms are part of the response contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    NotBearer,
    TooLarge,
    Malformed,
    AlgorithmNotAllowed,
    UnknownKid,
    NoVerificationKey,
    BadSignature,
    Expired,
    NotYetValid,
    WrongIssuer,
    WrongAudience,
    MissingTid,
    /// A claim the gate counts by is not a non-empty string (`malformed`, naming `token.claim`).
    MalformedClaim(Claim),
}

crate::rules::words! {
    /// The claims a token is counted by.
    Claim {
        Tid = "tid",
        /// The claim `QUOTA_JWT_ACCOUNT_CLAIM` names.
        Account = "account",
    }
}

impl Rejection {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotBearer => "not_bearer",
            Self::TooLarge => "too_large",
            Self::Malformed | Self::MalformedClaim(_) => "malformed",
            Self::AlgorithmNotAllowed => "algorithm_not_allowed",
            Self::UnknownKid => "unknown_kid",
            Self::NoVerificationKey => "no_verification_key",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongIssuer => "wrong_issuer",
            Self::WrongAudience => "wrong_audience",
            Self::MissingTid => "missing_tid",
        }
    }

    /// The claim at fault, for a [`Self::MalformedClaim`].
    pub fn claim(self) -> Option<Claim> {
        match self {
            Self::MalformedClaim(claim) => Some(claim),
            _ => None,
        }
    }
}

pub struct Verifier {
    keys: Vec<VerificationKey>,
    /// The issuer, audience and claim names tokens are checked and read by.
    jwt: JwtConfig,
    verified: VerifiedCache<TokenSubject>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("keys", &self.keys.len())
            .finish()
    }
}

#[derive(Deserialize)]
struct Claims {
    tid: Option<Value>,
    tier: Option<Value>,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
    /// Required by the validation, so present once decoded (a number, possibly fractional).
    exp: Option<Value>,
}

/// A claim the gate counts by: a non-empty JSON string. A number is refused, not read as its
/// digits, or any issuer's 12345 would share a counter.
fn counting_claim(v: &Value, claim: Claim) -> Result<String, Rejection> {
    match v {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        _ => Err(Rejection::MalformedClaim(claim)),
    }
}

/// A positive whole `tier`, as a number or numeric string (API Gateway's claims are strings).
pub fn tier_from_claim(v: &Value) -> Option<NonZeroU32> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .and_then(NonZeroU32::new),
        Value::String(s) => s.trim().parse::<u32>().ok().and_then(NonZeroU32::new),
        _ => None,
    }
}

impl Verifier {
    /// Loads the keys `jwt` names; `None` when no key is set.
    pub fn from_config(jwt: &JwtConfig) -> Result<Option<Self>, ConfigError> {
        let keys = keys::load(jwt.public_key.as_deref(), jwt.jwks.as_deref())?;
        if keys.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            keys,
            jwt: jwt.clone(),
            verified: VerifiedCache::default(),
        }))
    }

    /// Verifies `token` (the part after `Bearer `).
    pub fn verify(&self, token: &str) -> Result<TokenSubject, Rejection> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Rejection::TooLarge);
        }
        let cache_key = cache::key(token);
        if let Some(subject) = self.verified.get(&cache_key) {
            return Ok(subject);
        }
        let header = parse_header(token)?;
        let algorithm = allowed_algorithm(&header)?;
        let kid = header.get("kid").and_then(Value::as_str);
        let mut candidates = self
            .keys
            .iter()
            .filter(|k| kid.is_none() || k.kid.is_none() || k.kid.as_deref() == kid)
            .peekable();
        if candidates.peek().is_none() {
            return Err(Rejection::UnknownKid);
        }
        // With a JWKS configured, a `kid` none of its keys carries is unknown, as with the JWKS
        // alone, unless a key-less PEM key verifies the token.
        let kid_unknown = kid.is_some_and(|kid| {
            self.keys.iter().any(|k| k.kid.is_some())
                && !self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
        });
        let mut rejection = if kid_unknown {
            Rejection::UnknownKid
        } else {
            Rejection::AlgorithmNotAllowed
        };
        for key in candidates.filter(|k| k.algorithm == algorithm) {
            match jsonwebtoken::decode::<Claims>(token, &key.key, &self.validation(algorithm)) {
                Ok(data) => {
                    let subject = self.subject(&data.claims)?;
                    if let Some(exp) = data.claims.exp.as_ref().and_then(Value::as_f64) {
                        self.verified.put(cache_key, &subject, exp as i64);
                    }
                    return Ok(subject);
                }
                Err(e) => match map_error(e.kind()) {
                    Rejection::BadSignature if !kid_unknown => rejection = Rejection::BadSignature,
                    Rejection::BadSignature => {}
                    // The signature held: the claims are at fault, whatever other key we try.
                    other => return Err(other),
                },
            }
        }
        Err(rejection)
    }

    fn subject(&self, claims: &Claims) -> Result<TokenSubject, Rejection> {
        // RFC 7519 makes `iss` one string; `jsonwebtoken` would also take an array holding ours.
        if claims.rest.get("iss").and_then(Value::as_str) != Some(self.jwt.issuer.as_str()) {
            return Err(Rejection::WrongIssuer);
        }
        let tid = claims.tid.as_ref().ok_or(Rejection::MissingTid)?;
        let tid = counting_claim(tid, Claim::Tid)?;
        // A token's `tier`: a positive whole JSON number; anything else is ignored.
        let tier = claims.tier.as_ref().filter(|v| v.is_number());
        let tier = tier.and_then(tier_from_claim);
        let claim = |name: &Option<String>| claims.rest.get(name.as_deref()?);
        // Only a JSON `true` exempts: a string "true" or a 1 is a claim meant differently.
        let exempt = claim(&self.jwt.exempt_claim) == Some(&Value::Bool(true));
        // Absent, the token is counted by its `tid`; present, read by the same rule.
        let account = claim(&self.jwt.account_claim).map(|v| counting_claim(v, Claim::Account));
        let account = account.transpose()?;
        Ok(TokenSubject {
            tid,
            tier,
            exempt,
            account,
        })
    }

    fn validation(&self, algorithm: Algorithm) -> Validation {
        let mut v = Validation::new(algorithm);
        v.leeway = 0;
        v.validate_nbf = true;
        v.set_issuer(&[&self.jwt.issuer]);
        // A configured audience is required: a token without `aud` is not for us.
        match &self.jwt.audience {
            Some(aud) => {
                v.set_audience(&[aud]);
                v.set_required_spec_claims(&["exp", "iss", "aud"]);
            }
            None => {
                v.validate_aud = false;
                v.set_required_spec_claims(&["exp", "iss"]);
            }
        }
        v
    }
}

fn allowed_algorithm(header: &serde_json::Map<String, Value>) -> Result<Algorithm, Rejection> {
    match header.get("alg").and_then(Value::as_str) {
        Some("RS256") => Ok(Algorithm::RS256),
        Some("ES256") => Ok(Algorithm::ES256),
        Some("EdDSA") => Ok(Algorithm::EdDSA),
        Some(_) => Err(Rejection::AlgorithmNotAllowed),
        None => Err(Rejection::Malformed),
    }
}

fn parse_header(token: &str) -> Result<serde_json::Map<String, Value>, Rejection> {
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Rejection::Malformed);
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| Rejection::Malformed)?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Rejection::Malformed),
    }
}

fn map_error(kind: &ErrorKind) -> Rejection {
    match kind {
        ErrorKind::InvalidSignature => Rejection::BadSignature,
        ErrorKind::ExpiredSignature => Rejection::Expired,
        ErrorKind::ImmatureSignature => Rejection::NotYetValid,
        ErrorKind::InvalidIssuer => Rejection::WrongIssuer,
        ErrorKind::InvalidAudience => Rejection::WrongAudience,
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => Rejection::WrongIssuer,
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => Rejection::WrongAudience,
        ErrorKind::InvalidAlgorithm => Rejection::AlgorithmNotAllowed,
        _ => Rejection::Malformed,
    }
}
