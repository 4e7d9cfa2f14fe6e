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

/// `SCAN_QUEUE_OVER_URL`: an SQS queue URL, only beside an SQS `queue` (a
/// stream keeps its lanes apart by itself, the spool has one).
pub(super) fn over_lane(env: &Lookup, queue: &QueueTarget) -> Result<Option<String>, ConfigError> {
    let var = &vars::SCAN_QUEUE_OVER_URL;
    let Some(url) = env.optional(var) else {
        return Ok(None);
    };
    match (queue, QueueTarget::from_url(&url)) {
        (QueueTarget::Sqs(_), Ok(QueueTarget::Sqs(url))) => Ok(Some(url)),
        (QueueTarget::Sqs(_), _) => Err(ConfigError::new(var.name(), "expected an SQS queue URL")),
        _ => Err(ConfigError::new(
            var.name(),
            "is for an SQS SCAN_QUEUE_URL only (a stream keeps its lanes apart by itself)",
        )),
    }
}

/// The scheme of a Valkey stream's queue URL.
const STREAM: &str = "valkey-stream:";

#[cfg(test)]
mod tests {
    use super::*;

    /// The over lane's queue is an SQS URL beside an SQS queue, and nothing
    /// else: each refusal names the variable.
    #[test]
    fn over_lanes() {
        let sqs = "https://sqs.us-east-1.amazonaws.com/123456789012/scans";
        let over = "https://sqs.us-east-1.amazonaws.com/123456789012/scans-over";
        let read = |queue: &str, lane: &str| {
            let vars = [("SCAN_QUEUE_OVER_URL", lane.to_owned())];
            let env = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
            let target = QueueTarget::from_url(queue).unwrap();
            over_lane(&Lookup(&env), &target)
        };
        assert_eq!(read(sqs, over).ok().flatten().as_deref(), Some(over));
        for (queue, lane) in [(sqs, "valkey-stream:x"), ("valkey-stream:jobs", over)] {
            let e = read(queue, lane).unwrap_err();
            assert!(e.to_string().contains("SCAN_QUEUE_OVER_URL"), "{e}");
        }
    }

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
