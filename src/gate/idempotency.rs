//! `Idempotency-Key` (IETF httpapi draft) on `POST /scan`. The gate keeps one record per key beside
//! the subject's counter for 24 h, and compares bodies by SHA-256, so a retry must resend the same
//! bytes. A repeated key is answered from its record: done with the same body, the saved 202 again
//! (`Idempotent-Replayed: true`), nothing counted or queued; another body, 422; still in flight,
//! 409 with `Retry-After`; left pending by an attempt that gave up, its job queued once more.

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::gate::error::GateError;

pub const HEADER: &str = "idempotency-key";

pub const MAX_KEY_LEN: usize = 255;

/// The `Idempotency-Key`: `None` when absent, 400 when sent twice or not 1–255 visible ASCII.
pub fn key(headers: &HeaderMap) -> Result<Option<&str>, GateError> {
    let mut values = headers.get_all(HEADER).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let count = headers.get_all(HEADER).iter().count();
    if count > 1 {
        return Err(GateError::RepeatedIdempotencyKey { count });
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_KEY_LEN || !bytes.iter().all(u8::is_ascii_graphic) {
        return Err(GateError::InvalidIdempotencyKey);
    }
    // Visible ASCII only, so this cannot fail.
    value
        .to_str()
        .map(Some)
        .map_err(|_| GateError::InvalidIdempotencyKey)
}

/// The body's fingerprint: SHA-256, hex.
pub fn fingerprint(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(values: &[&[u8]]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(HEADER, HeaderValue::from_bytes(v).unwrap());
        }
        h
    }

    /// Visible ASCII of 1–255 characters passes; anything else is 400.
    #[test]
    fn validation() {
        assert_eq!(key(&HeaderMap::new()).unwrap(), None);
        let long = "k".repeat(255);
        for good in [
            "a",
            "retry-1",
            "8e03978e-40d5-43e8-bc93-6894a57f9324",
            "\"quoted\"",
            &long,
        ] {
            assert_eq!(key(&headers(&[good.as_bytes()])).unwrap(), Some(good));
        }
        let too_long = "k".repeat(256);
        for bad in [
            &b""[..],
            b"with space",
            b"tab\there",
            b"caf\xc3\xa9",
            too_long.as_bytes(),
        ] {
            let err = key(&headers(&[bad])).unwrap_err();
            assert_eq!(err.code(), "invalid_idempotency_key", "{bad:?}");
            assert_eq!(err.status(), 400);
        }
        let twice = key(&headers(&[b"a", b"a"])).unwrap_err();
        assert_eq!(twice.status(), 400);
        assert!(twice.to_string().contains("sent 2 times"), "{twice}");
    }

    /// The same bytes give the same fingerprint; any change another.
    #[test]
    fn fingerprints() {
        assert_eq!(
            fingerprint(b"{\"image\":\"a\"}"),
            fingerprint(b"{\"image\":\"a\"}")
        );
        assert_ne!(
            fingerprint(b"{\"image\":\"a\"}"),
            fingerprint(b"{\"image\":\"b\"}")
        );
        assert_eq!(fingerprint(b"").len(), 64);
    }
}
