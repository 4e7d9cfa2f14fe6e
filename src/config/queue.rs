//! Where accepted scans go, and the one grammar of a queue URL
//! (`SCAN_QUEUE_URL`, `quota-gate consume --from`).

use super::error::ConfigError;
use super::lookup::Lookup;
use super::vars;
use crate::rules::hash_tag::has_hash_tag;

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

impl QueueTarget {
    /// `SCAN_QUEUE_URL`: unset (the spool) or a queue URL ([`Self::from_url`]);
    /// a Valkey stream needs `has_valkey`.
    pub(super) fn from_vars(env: &Lookup, has_valkey: bool) -> Result<Self, ConfigError> {
        let var = &vars::SCAN_QUEUE_URL;
        let Some(url) = env.optional(var) else {
            return Ok(Self::Spool);
        };
        match Self::from_url(&url) {
            Ok(Self::ValkeyStream(key)) if !has_valkey => Err(ConfigError::new(
                var.name(),
                format!("{STREAM}{key} needs VALKEY_URL"),
            )),
            parsed => parsed.map_err(|problem| ConfigError::new(var.name(), problem)),
        }
    }

    /// A queue URL: `valkey-stream:<key>` or an SQS queue URL (`https://`,
    /// or `http://` for a local endpoint). The one grammar of
    /// `SCAN_QUEUE_URL` and of `quota-gate consume --from`; the problem, if
    /// any, is said without the variable's name.
    pub fn from_url(url: &str) -> Result<Self, String> {
        match url.strip_prefix(STREAM) {
            Some("") => Err(format!("{STREAM} needs a key")),
            // Braces in a key are a cluster hash tag: they must enclose something.
            Some(key) if key.contains(['{', '}']) && !has_hash_tag(key) => Err(format!(
                "{STREAM}{key}: braces in a stream key must form a non-empty hash tag ({{tag}})"
            )),
            Some(key) => Ok(Self::ValkeyStream(key.to_owned())),
            None if url.starts_with("https://") || url.starts_with("http://") => {
                Ok(Self::Sqs(url.to_owned()))
            }
            None => Err(format!(
                "expected an SQS queue URL (https://…) or {STREAM}<key>"
            )),
        }
    }
}

/// The scheme of a Valkey stream's queue URL.
const STREAM: &str = "valkey-stream:";

#[cfg(test)]
mod tests {
    use super::*;

    /// Every queue URL is told apart by its prefix, and a stream key's
    /// braces must form a hash tag.
    #[test]
    fn queue_urls() {
        let url = "https://sqs.us-east-1.amazonaws.com/123456789012/scans";
        assert_eq!(QueueTarget::from_url(url), Ok(QueueTarget::Sqs(url.into())));
        assert_eq!(
            QueueTarget::from_url("valkey-stream:a{b}"),
            Ok(QueueTarget::ValkeyStream("a{b}".into()))
        );
        for bad in [
            "valkey-stream:",
            "valkey-stream:a}{",
            "valkey-stream:a{}",
            "ftp://q",
            "-",
        ] {
            assert!(QueueTarget::from_url(bad).is_err(), "{bad}");
        }
    }
}
