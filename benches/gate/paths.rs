//! The deterministic figures: Valkey commands and round trips per request
//! on each path of the gate (within quota, with and without the network
//! levels, IPv6, paced, over a network, keyed, `GET /quota`). Unlike the
//! throughput lines they do not move between runs: each request is sent
//! once the answer to the one before is in, through a proxy that counts the
//! gate's writes (one a round trip, on loopback), and Valkey's own
//! `INFO commandstats` counts the commands.

use std::collections::BTreeMap;

use quota_gate::gate::GateRequest;
use quota_gate::io::store::valkey::ValkeyStore;
use quota_gate_testkit::{self as common, proxy::Proxy};

use super::{commandstats, reset_commandstats, sink_gate};
use quota_gate::io::connection::Valkey;
use quota_gate::io::queue::stream::StreamQueue;

/// One path's figures: per request, the commands by name, and round trips.
pub struct PathFigures {
    pub name: &'static str,
    pub commands: BTreeMap<String, f64>,
    pub round_trips: f64,
}

/// Requests per path.
const N: usize = 20;

/// A path: its name, its settings, and its `i`-th request.
type Path = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    fn(usize) -> GateRequest,
);

fn scan_keyed(i: usize) -> GateRequest {
    let mut r = common::scan_from(&format!("10.{}.0.1", 1 + i));
    let key = format!("bench-key-{i}");
    r.headers
        .insert("idempotency-key", key.parse().expect("a header"));
    r
}

fn quota_read(i: usize) -> GateRequest {
    common::quota_from(&format!("10.{}.0.1", 1 + i))
}

fn paths() -> Vec<Path> {
    let defer = ("QUOTA_DELAY_MODE", "defer");
    vec![
        ("within quota, IPv4, default levels (a /24)", vec![], |i| {
            common::scan_from(&format!("10.{}.0.1", 1 + i))
        }),
        (
            "within quota, IPv4, QUOTA_NETWORKS=off",
            vec![("QUOTA_NETWORKS", "off")],
            |i| common::scan_from(&format!("10.{}.0.1", 1 + i)),
        ),
        (
            "within quota, IPv6, default levels (a /56 and a /48)",
            vec![],
            |i| common::scan_from(&format!("2001:db8:{:x}::1", 1 + i)),
        ),
        (
            "paced: the subject over its limit",
            vec![("QUOTA_ANON", "1"), defer],
            |_| common::scan_from("10.250.0.1"),
        ),
        (
            "paced: a /24 over its limit, rotated addresses",
            vec![("QUOTA_NETWORKS", "v4/24=1"), defer],
            |i| common::scan_from(&format!("10.251.0.{}", 1 + i)),
        ),
        ("keyed (Idempotency-Key), within quota", vec![], scan_keyed),
        ("GET /quota, default levels", vec![], quota_read),
    ]
}

/// Measures every path on a Valkey at `url` (`addr` its socket).
pub async fn figures(url: &str, addr: std::net::SocketAddr) -> Result<Vec<PathFigures>, String> {
    let mut out = Vec::new();
    for (name, vars, request) in paths() {
        let proxy = Proxy::start(addr).await;
        let mut all = vec![
            ("VALKEY_URL", proxy.url()),
            ("SCAN_QUEUE_URL", "valkey-stream:jobs".into()),
            ("QUOTA_STORE_TIMEOUT_MS", "2000".into()),
            ("QUOTA_HARD_DELAY_MS", "2000".into()),
            ("QUOTA_SOFT_DELAY_MS", "1000".into()),
        ];
        all.extend(vars.iter().map(|(k, v)| (*k, (*v).to_owned())));
        let pairs: Vec<(&str, &str)> = all.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let config = common::config(&pairs);
        let valkey =
            Valkey::new(&proxy.url(), false, config.store.timeout).map_err(|e| e.to_string())?;
        let gate = sink_gate(
            config,
            ValkeyStore::new(valkey.clone()),
            StreamQueue::new(valkey, "jobs"),
        )?;
        // Each path on an empty Valkey (the lines before leave counts that
        // put some of these addresses over quota), connected, and the
        // connection's own set-up commands done.
        super::flush_all(url).await;
        let _ = gate.handle(common::scan_from("10.254.0.1")).await;
        reset_commandstats(url).await;
        let before = proxy.bursts();
        for i in 0..N {
            let answer = gate.handle(request(i)).await;
            if !answer.status().is_success() {
                return Err(format!("{name}: request {i} answered {}", answer.status()));
            }
        }
        let round_trips = (proxy.bursts() - before) as f64 / N as f64;
        let commands = commandstats(url)
            .await
            .into_iter()
            .filter(|(c, _)| !(c.starts_with("config") || c.starts_with("client") || c == "info"))
            .map(|(c, (calls, _))| (c.to_uppercase(), calls as f64 / N as f64))
            .collect();
        out.push(PathFigures {
            name,
            commands,
            round_trips,
        });
    }
    Ok(out)
}

/// Prints the figures, one line a path.
pub fn print(figures: &[PathFigures]) {
    println!(
        "\nper request, sequential, deterministic (INFO commandstats; round trips through a counting proxy):"
    );
    for f in figures {
        let total: f64 = f.commands.values().sum();
        let list: Vec<String> = f
            .commands
            .iter()
            .map(|(c, n)| format!("{c} {n:.2}"))
            .collect();
        println!(
            "  {:<52} {:>5.2} round trips, {:>5.2} commands: {}",
            f.name,
            f.round_trips,
            total,
            list.join(", ")
        );
    }
}
