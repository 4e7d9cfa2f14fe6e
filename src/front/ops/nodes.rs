//! The nodes of the quota Valkey, for operator commands that must `SCAN` every primary.

use std::collections::BTreeSet;

use redis::{ConnectionAddr, ErrorKind, RedisError, RedisResult, Value};

use crate::io::connection::{Connection, Valkey, client_for};

/// The address of every primary that serves slots; a standalone server is its own only primary.
pub async fn primaries(valkey: &Valkey) -> RedisResult<Vec<(String, u16)>> {
    if !valkey.is_cluster() {
        return Ok(match valkey.info().addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                vec![(host.clone(), *port)]
            }
            _ => Vec::new(),
        });
    }
    let mut conn = valkey.connection().await?;
    let shards: Value = redis::cmd("CLUSTER")
        .arg("SHARDS")
        .query_async(&mut conn)
        .await?;
    let tls = matches!(valkey.info().addr(), ConnectionAddr::TcpTls { .. });
    primaries_from_shards(&shards, tls)
}

/// A connection to one node, with the credentials, TLS trust and timeouts of the configured URL.
pub async fn node_connection(valkey: &Valkey, host: &str, port: u16) -> RedisResult<Connection> {
    let addr = match valkey.info().addr() {
        ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: None,
        },
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    };
    let client = client_for(valkey.info().clone().set_addr(addr), valkey.tls())?;
    let config = valkey.signed_in(
        redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(valkey.timeout()))
            .set_response_timeout(Some(valkey.timeout())),
    );
    let conn = client.get_multiplexed_async_connection_with_config(&config);
    Ok(Connection::Standalone(conn.await?))
}

/// A reply that is a map in RESP3 or a flat key/value array in RESP2, as pairs.
fn pairs(v: &Value) -> Vec<(String, &Value)> {
    let key = |k: &Value| text(k).unwrap_or_default();
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| (key(k), v)).collect(),
        Value::Array(a) => a.chunks_exact(2).map(|p| (key(&p[0]), &p[1])).collect(),
        _ => Vec::new(),
    }
}

fn field<'a>(fields: &[(String, &'a Value)], name: &str) -> Option<&'a Value> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        _ => &[],
    }
}

/// Per shard that owns slots in a `CLUSTER SHARDS` reply, its healthy `master`; a shard without one
/// is an error, as skipping it would leave keys behind.
pub fn primaries_from_shards(shards: &Value, tls: bool) -> RedisResult<Vec<(String, u16)>> {
    let mut found = BTreeSet::new();
    for shard in items(shards) {
        let fields = pairs(shard);
        if field(&fields, "slots").is_none_or(|s| items(s).is_empty()) {
            continue;
        }
        let nodes = field(&fields, "nodes").map(items).unwrap_or_default();
        let primary = nodes.iter().find_map(|node| healthy_primary(node, tls));
        found.insert(primary.ok_or_else(|| {
            RedisError::from((
                ErrorKind::ClusterConnectionNotFound,
                "a shard that owns slots has no healthy primary",
            ))
        })?);
    }
    Ok(found.into_iter().collect())
}

/// The address of a `CLUSTER SHARDS` node that is a healthy `master`: its preferred host, and its
/// TLS port first when `tls`.
fn healthy_primary(node: &Value, tls: bool) -> Option<(String, u16)> {
    let fields = pairs(node);
    let get = |name: &str| field(&fields, name).and_then(text);
    if get("role").as_deref() != Some("master") || get("health").as_deref() == Some("fail") {
        return None;
    }
    let host = ["endpoint", "hostname", "ip"]
        .iter()
        .filter_map(|k| get(k))
        .find(|h| !h.is_empty() && h != "?")?;
    let mut ports = ["port", "tls-port"];
    if tls {
        ports.reverse();
    }
    let port = ports
        .iter()
        .filter_map(|k| get(k))
        .find_map(|p| p.parse::<u16>().ok().filter(|p| *p != 0))?;
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// A node of `CLUSTER SHARDS`: its port, IP, role and health, plus `extra` fields.
    fn node(port: i64, ip: &str, role: &str, health: &str, extra: &[(&str, Value)]) -> Value {
        let fields = [
            ("port", Value::Int(port)),
            ("ip", bulk(ip)),
            ("role", bulk(role)),
            ("health", bulk(health)),
        ];
        Value::Array(
            fields
                .iter()
                .chain(extra)
                .flat_map(|(k, v)| [bulk(k), v.clone()])
                .collect(),
        )
    }

    fn shard(slots: Vec<Value>, nodes: Vec<Value>) -> Value {
        Value::Array(vec![
            bulk("slots"),
            Value::Array(slots),
            bulk("nodes"),
            Value::Array(nodes),
        ])
    }

    /// Primaries come from shards that own slots, by preferred endpoint, TLS port when TLS.
    #[test]
    fn primaries_from_a_shards_reply() {
        let primary = node(
            7001,
            "10.0.0.1",
            "master",
            "online",
            &[
                ("tls-port", Value::Int(7101)),
                ("endpoint", bulk("node-1.cache.example")),
            ],
        );
        let replica = node(
            7002,
            "10.0.0.2",
            "replica",
            "online",
            &[("endpoint", bulk("10.0.0.2"))],
        );
        let empty = node(7003, "10.0.0.3", "master", "online", &[]);
        let reply = Value::Array(vec![
            shard(
                vec![Value::Int(0), Value::Int(16383)],
                vec![replica, primary],
            ),
            shard(vec![], vec![empty]),
        ]);
        assert_eq!(
            primaries_from_shards(&reply, false).unwrap(),
            [("node-1.cache.example".to_owned(), 7001)]
        );
        assert_eq!(
            primaries_from_shards(&reply, true).unwrap(),
            [("node-1.cache.example".to_owned(), 7101)]
        );
    }

    /// A shard owning slots with its primary failed is an error, not a silent skip.
    #[test]
    fn failed_primary_is_an_error() {
        let failed = node(7001, "10.0.0.1", "master", "fail", &[]);
        let reply = Value::Array(vec![shard(
            vec![Value::Int(0), Value::Int(1)],
            vec![failed],
        )]);
        assert!(primaries_from_shards(&reply, false).is_err());
    }
}
