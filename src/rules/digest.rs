//! The keyed digest that names a subject in Valkey: an HMAC under a secret, since a plain hash of
//! an IP is reversed by trying every address, so Valkey and the logs hold no personal data.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::rules::scope::Scope;

/// The lowercase hex HMAC-SHA256 of a subject. Only [`Hasher::digest`] makes one.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Digest(String);

impl Digest {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({}…)", &self.0[..12])
    }
}

/// Computes subject digests under one secret.
#[derive(Clone)]
pub struct Hasher {
    mac: Hmac<Sha256>,
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hasher(<secret>)")
    }
}

impl Hasher {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"),
        }
    }

    /// hex(HMAC-SHA256(secret, scope ‖ ":" ‖ material)): an IP and an equal token id differ.
    pub fn digest(&self, scope: Scope, material: &str) -> Digest {
        self.keyed(scope.as_str(), material)
    }

    /// The digest of a level above the subject: hex(HMAC-SHA256(secret, "net:" ‖ material)).
    pub fn level_digest(&self, material: &str) -> Digest {
        self.keyed("net", material)
    }

    /// An account's digest (`QUOTA_JWT_ACCOUNT_CLAIM`), in a domain apart from every `tid`'s.
    pub fn account_digest(&self, account: &str) -> Digest {
        self.keyed("account", account)
    }

    fn keyed(&self, domain: &str, material: &str) -> Digest {
        let mut mac = self.mac.clone();
        mac.update(domain.as_bytes());
        mac.update(b":");
        mac.update(material.as_bytes());
        Digest(hex::encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest is keyed: another secret gives another digest.
    #[test]
    fn keyed() {
        let a = Hasher::new(b"secret-one-0123456789").digest(Scope::Ip, "203.0.113.7");
        let b = Hasher::new(b"secret-two-0123456789").digest(Scope::Ip, "203.0.113.7");
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 64);
        assert!(
            a.as_str()
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }

    /// Scope is part of the message.
    #[test]
    fn scope_separates() {
        let h = Hasher::new(b"secret-one-0123456789");
        assert_ne!(h.digest(Scope::Ip, "x"), h.digest(Scope::Tid, "x"));
        assert_eq!(h.digest(Scope::Tid, "x"), h.digest(Scope::Tid, "x"));
    }

    /// Matches `openssl dgst -sha256 -hmac key` over "ip:<material>".
    #[test]
    fn known_vector() {
        let d =
            Hasher::new(b"key").digest(Scope::Ip, "The quick brown fox jumps over the lazy dog");
        assert_eq!(
            d.as_str(),
            "cd81badb9d3c5d53320852debf45d2b5ed684ae602ef59566cb7467bc8b2fe2d"
        );
    }
}
