//! What the quota Valkey says of its memory, read off the request path: every primary's
//! `maxmemory_policy` (`INFO`, as `CONFIG` is disabled on ElastiCache) and `evicted_keys`. On a
//! cluster the shared connection sends `INFO` to every primary and answers one text per node.

use std::time::Duration;

use redis::Value;

use super::connector::Valkey;
use super::send::SendError;
use crate::rules::eviction::NodePolicy;

/// One node's `INFO` text and address (the configured one for a standalone server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub node: String,
    pub text: String,
}

impl NodeInfo {
    /// The value of `field` (`field:value` on a line of its own).
    pub fn field(&self, field: &str) -> Option<&str> {
        self.text.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            (name == field).then(|| value.trim())
        })
    }
}

impl Valkey {
    /// `INFO <section>` from every primary, waiting at most `within`.
    pub async fn read_info(
        &self,
        section: &str,
        within: Duration,
    ) -> Result<Vec<NodeInfo>, SendError> {
        let mut cmd = redis::cmd("INFO");
        cmd.arg(section);
        let reply: Value = self.send(cmd, within).await?;
        // A standalone server's text is named by its configured `host:port`.
        let texts = node_texts(&reply, &self.info().addr().to_string());
        if texts.is_empty() {
            return Err(SendError::Refused(format!("INFO {section}: no text")));
        }
        Ok(texts)
    }

    /// Every primary's `maxmemory_policy` (`None` where `INFO memory` names none).
    pub async fn eviction_policies(&self, within: Duration) -> Result<Vec<NodePolicy>, SendError> {
        let nodes = self.read_info("memory", within).await?;
        Ok(nodes
            .iter()
            .map(|n| NodePolicy {
                node: n.node.clone(),
                policy: n.field("maxmemory_policy").map(str::to_owned),
            })
            .collect())
    }

    /// The keys every primary evicted since it started, summed.
    pub async fn evicted_keys(&self, within: Duration) -> Result<u64, SendError> {
        let nodes = self.read_info("stats", within).await?;
        Ok(nodes
            .iter()
            .filter_map(|n| n.field("evicted_keys")?.parse::<u64>().ok())
            .sum())
    }
}

/// The texts of an `INFO` reply: one for a server, one per node for a cluster (a map by address).
fn node_texts(reply: &Value, standalone: &str) -> Vec<NodeInfo> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match reply {
        Value::Map(pairs) => pairs
            .iter()
            .filter_map(|(node, v)| {
                Some(NodeInfo {
                    node: text(node)?,
                    text: text(v)?,
                })
            })
            .collect(),
        other => text(other)
            .map(|text| NodeInfo {
                node: standalone.to_owned(),
                text,
            })
            .into_iter()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// A server's one text, or a cluster's text per primary; fields read
    /// from their own lines only.
    #[test]
    fn texts_and_fields() {
        let one = node_texts(
            &bulk("# Memory\r\nused_memory:100\r\nmaxmemory_policy:noeviction\r\n"),
            "cache:6379",
        );
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].node, "cache:6379");
        assert_eq!(one[0].field("maxmemory_policy"), Some("noeviction"));
        assert_eq!(one[0].field("policy"), None);
        let cluster = node_texts(
            &Value::Map(vec![
                (bulk("10.0.0.1:6379"), bulk("evicted_keys:3\r\n")),
                (bulk("10.0.0.2:6379"), bulk("evicted_keys:4\r\n")),
            ]),
            "unused",
        );
        let nodes: Vec<&str> = cluster.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(nodes, ["10.0.0.1:6379", "10.0.0.2:6379"]);
        assert_eq!(cluster[1].field("evicted_keys"), Some("4"));
        assert!(node_texts(&Value::Nil, "x").is_empty());
    }
}
