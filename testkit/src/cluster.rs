//! A local 3-primary Valkey cluster of pinned `valkey-server` processes on
//! free ports, killed on drop. The slots are split in three with
//! `CLUSTER ADDSLOTSRANGE` and the nodes joined with `CLUSTER MEET`, which
//! needs nothing but the server itself (no `redis-cli --cluster create`).

use std::time::{Duration, Instant};

use quota_gate::gate::Gate;
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::store::valkey::ValkeyStore;

use crate::{ValkeyServer, free_port, jobs_on, stream_gate, with_vars};

/// The slot ranges of the three primaries.
const SLOTS: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// Three primaries owning every slot between them.
pub struct ValkeyCluster {
    pub nodes: Vec<ValkeyServer>,
}

impl ValkeyCluster {
    /// Starts the cluster and waits until every node reports `cluster_state:ok`
    /// and every node sees the same addresses (an announced port travels by
    /// gossip, so a node may still name a peer by the port it was met on).
    pub fn start() -> Self {
        Self::start_with(|_| Vec::new())
    }

    /// The same, with extra `--option value` arguments for node `i` (0..3).
    pub fn start_with(extra: impl Fn(usize) -> Vec<String>) -> Self {
        let nodes: Vec<ValkeyServer> = (0..SLOTS.len())
            .map(|i| {
                // The bus port is chosen, not port + 10000, which may be taken or out of range.
                let mut args = vec![
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--cluster-port".to_owned(),
                    free_port().to_string(),
                    "--cluster-node-timeout".to_owned(),
                    "5000".to_owned(),
                ];
                args.extend(extra(i));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ValkeyServer::start_with(&args)
            })
            .collect();
        let cluster = Self { nodes };
        for (node, (from, to)) in cluster.nodes.iter().zip(SLOTS) {
            let mut c = sync_client(node);
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(from)
                .arg(to)
                .query(&mut c)
                .expect("ADDSLOTSRANGE");
        }
        let mut first = sync_client(&cluster.nodes[0]);
        for node in &cluster.nodes[1..] {
            let bus: u16 = config_get(&mut sync_client(node), "cluster-port");
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.port)
                .arg(bus)
                .query(&mut first)
                .expect("CLUSTER MEET");
        }
        cluster.wait_ok(Duration::from_secs(30));
        cluster
    }

    fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ready = self.nodes.iter().all(|node| {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut sync_client(node))
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_known_nodes:3")
                    && info.contains("cluster_slots_ok:16384")
            });
            if ready && self.addresses_agree() {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster did not converge");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A seed URL (any node will do: the client discovers the rest).
    /// Whether every node's `CLUSTER NODES` lists the same `ip:port` addresses.
    fn addresses_agree(&self) -> bool {
        let views: Vec<Vec<String>> = self
            .nodes
            .iter()
            .map(|node| {
                let table: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut sync_client(node))
                    .unwrap_or_default();
                let mut addresses: Vec<String> = table
                    .lines()
                    .filter_map(|line| line.split(' ').nth(1))
                    .map(|field| field.split('@').next().unwrap_or(field).to_owned())
                    .collect();
                addresses.sort();
                addresses
            })
            .collect();
        views.len() == self.nodes.len() && views.windows(2).all(|pair| pair[0] == pair[1])
    }

    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    /// Every key matching `pattern` on every node, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .nodes
            .iter()
            .flat_map(|node| {
                redis::cmd("KEYS")
                    .arg(pattern)
                    .query::<Vec<String>>(&mut sync_client(node))
                    .unwrap()
            })
            .collect();
        keys.sort();
        keys
    }

    /// The index of the node that serves `key`'s slot (the others answer
    /// a plain `EXISTS` with a redirection).
    pub fn node_of(&self, key: &str) -> usize {
        self.nodes
            .iter()
            .position(|node| {
                redis::cmd("EXISTS")
                    .arg(key)
                    .query::<i64>(&mut sync_client(node))
                    .is_ok()
            })
            .expect("one node serves every slot")
    }

    /// `GET key` on the node that serves it, as a number (`None`: no key).
    pub fn get(&self, key: &str) -> Option<i64> {
        redis::cmd("GET")
            .arg(key)
            .query(&mut sync_client(&self.nodes[self.node_of(key)]))
            .unwrap()
    }

    /// How many of the nodes hold at least one key matching `pattern`.
    pub fn nodes_holding(&self, pattern: &str) -> usize {
        self.nodes
            .iter()
            .filter(|node| {
                !redis::cmd("KEYS")
                    .arg(pattern)
                    .query::<Vec<String>>(&mut sync_client(node))
                    .unwrap()
                    .is_empty()
            })
            .count()
    }

    /// A cluster client connection for assertions.
    pub async fn client(&self) -> redis::cluster_async::ClusterConnection {
        redis::cluster::ClusterClient::new(vec![self.url()])
            .unwrap()
            .get_async_connection()
            .await
            .unwrap()
    }

    /// Every job on the stream `key`, oldest first.
    pub async fn stream_jobs(&self, key: &str) -> Vec<serde_json::Value> {
        jobs_on(&mut self.client().await, key).await
    }
}

fn sync_client(node: &ValkeyServer) -> redis::Connection {
    redis::Client::open(node.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

fn config_get<T: redis::FromRedisValue>(c: &mut redis::Connection, name: &str) -> T {
    let (_, value): (String, T) = redis::cmd("CONFIG").arg("GET").arg(name).query(c).unwrap();
    value
}

/// A gate in cluster mode on `cluster`, queueing to the stream `jobs` on the same cluster.
pub fn cluster_gate(
    cluster: &ValkeyCluster,
    vars: &[(&str, &str)],
) -> Gate<ValkeyStore, StreamQueue> {
    let url = cluster.url();
    stream_gate(&with_vars(
        &[("VALKEY_URL", url.as_str()), ("VALKEY_CLUSTER", "true")],
        vars,
    ))
}
