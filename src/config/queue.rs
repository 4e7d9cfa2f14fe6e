//! Where accepted scans go, and the one grammar of a queue URL (`SCAN_QUEUE_URL`, `--from`).

use serde::Deserialize;

use super::env::Env;
use super::error::ConfigError;
use super::vars::{SCAN_QUEUE_OVER_URL, SCAN_QUEUE_URL};
use crate::rules::hash_tag::has_hash_tag;

/// Where accepted scans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueTarget {
    /// One JSON line per job on standard output (the local default).
    Spool,
    /// `XADD` to this stream key on the quota Valkey.
    ValkeyStream(String),
    Sqs(String),
}

impl QueueTarget {
    /// `valkey-stream:<key>` or an SQS URL (`https://`, `http://` locally); errors omit the name.
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

/// A stream needs the quota Valkey; only an SQS queue takes an over lane beside it.
#[derive(Deserialize)]
pub(super) struct QueueVars {
    #[serde(rename = "SCAN_QUEUE_URL")]
    url: Option<String>,
    #[serde(rename = "SCAN_QUEUE_OVER_URL")]
    over: Option<String>,
}

pub(super) fn read(
    env: &Env,
    has_valkey: bool,
) -> Result<(QueueTarget, Option<String>), ConfigError> {
    let QueueVars { url, over } = env.group()?;
    let queue_err = |problem| ConfigError::new(SCAN_QUEUE_URL.name, problem);
    let queue = match url.as_deref().map(QueueTarget::from_url) {
        None => QueueTarget::Spool,
        Some(Ok(QueueTarget::ValkeyStream(key))) if !has_valkey => {
            return Err(queue_err(format!("{STREAM}{key} needs VALKEY_URL")));
        }
        Some(parsed) => parsed.map_err(queue_err)?,
    };
    let over_err = |problem: &str| ConfigError::new(SCAN_QUEUE_OVER_URL.name, problem);
    let over = match (&queue, over.as_deref().map(QueueTarget::from_url)) {
        (_, None) => None,
        (QueueTarget::Sqs(_), Some(Ok(QueueTarget::Sqs(url)))) => Some(url),
        (QueueTarget::Sqs(_), _) => return Err(over_err("expected an SQS queue URL")),
        _ => {
            return Err(over_err(
                "is for an SQS SCAN_QUEUE_URL only (a stream keeps its lanes apart by itself)",
            ));
        }
    };
    Ok((queue, over))
}

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
            let vars = [("SCAN_QUEUE_URL", queue), ("SCAN_QUEUE_OVER_URL", lane)];
            let env = |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            };
            read(&Env::read(&env).unwrap(), true).map(|(_, over)| over)
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
