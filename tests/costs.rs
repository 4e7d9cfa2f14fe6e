//! What a request costs Valkey, counted: the round trips and commands of
//! each path in the README's table ("What the levels cost"), measured here
//! and checked against the table itself, so a change that adds a command
//! to a path must change the README in the same commit. Each request is
//! sent once the answer to the one before is in, through a proxy that
//! counts the gate's writes (one a round trip); Valkey's own `INFO
//! commandstats` counts the commands. These figures do not move between
//! runs (the bench prints them too, beside the ones that do).

use quota_gate_testkit as common;

use std::collections::BTreeMap;

use common::proxy::Proxy;
use common::*;
use quota_gate::gate::GateRequest;

/// Requests per path.
const N: u64 = 10;

/// A README row, its settings, and its `i`-th request.
type Path = (
    &'static str,
    &'static [(&'static str, &'static str)],
    fn(u64) -> GateRequest,
);

const PATHS: [Path; 5] = [
    (
        "within quota, IPv4, `QUOTA_NETWORKS=off`",
        &[("QUOTA_NETWORKS", "off")],
        |i| scan_from(&format!("10.{}.0.1", 1 + i)),
    ),
    ("within quota, IPv4, default levels (its /24)", &[], |i| {
        scan_from(&format!("10.{}.0.1", 1 + i))
    }),
    (
        "within quota, IPv6, default levels (its /56 and /48)",
        &[],
        |i| scan_from(&format!("2001:db8:{:x}::1", 1 + i)),
    ),
    (
        "within quota, IPv4, default levels, `QUOTA_RESET=rolling`",
        &[("QUOTA_RESET", "rolling")],
        |i| scan_from(&format!("10.{}.0.1", 1 + i)),
    ),
    ("`GET /quota`, default levels", &[], |i| {
        quota_from(&format!("10.{}.0.1", 1 + i))
    }),
];

/// One path's round trips and commands per request (each a whole number,
/// or the path is not deterministic).
async fn measure(server: &ValkeyServer, path: &Path) -> (u64, BTreeMap<String, u64>) {
    let (name, vars, request) = path;
    let proxy = Proxy::start(loopback(server.port)).await;
    let url = proxy.url();
    let gate = stream_gate(&with_vars(
        &[
            ("VALKEY_URL", url.as_str()),
            ("QUOTA_STORE_TIMEOUT_MS", "2000"),
        ],
        vars,
    ));
    // Connected, the stream there, the connection's own set-up done.
    assert_eq!(gate.handle(scan_from("10.254.0.1")).await.status(), 202);
    let mut admin = server.client().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .unwrap();
    let before = proxy.bursts();
    for i in 0..N {
        let answer = gate.handle(request(i)).await;
        assert!(answer.status().is_success(), "{name}: {answer:?}");
    }
    let round_trips = proxy.bursts() - before;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut admin)
        .await
        .unwrap();
    let mut commands = BTreeMap::new();
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if matches!(name, "config|resetstat" | "info") {
            continue;
        }
        let calls: u64 = stats
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.parse().ok())
            .unwrap();
        assert_eq!(
            calls % N,
            0,
            "{name}: {calls} {name} calls over {N} requests"
        );
        commands.insert(name.to_uppercase(), calls / N);
    }
    assert_eq!(round_trips % N, 0, "{name}: {round_trips} round trips");
    (round_trips / N, commands)
}

/// The README row `| <name> | <round trips> | <commands> …|`.
fn readme_row(name: &str) -> (u64, u64) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let row = readme
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("| {name} |")))
        .unwrap_or_else(|| panic!("README has no row `| {name} |`"));
    let cells: Vec<&str> = row.trim().split('|').map(str::trim).collect();
    let number = |cell: &str| -> u64 {
        let digits: String = cell.chars().take_while(char::is_ascii_digit).collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {cell}"))
    };
    (number(cells[2]), number(cells[3]))
}

#[tokio::test]
async fn each_path_costs_what_the_readme_says() {
    let server = ValkeyServer::start();
    let mut measured = Vec::new();
    for path in &PATHS {
        let (round_trips, commands) = measure(&server, path).await;
        println!("{}: {round_trips} round trips, {commands:?}", path.0);
        measured.push((path.0, round_trips, commands));
    }
    for (name, round_trips, commands) in &measured {
        let total: u64 = commands.values().sum();
        assert_eq!(
            readme_row(name),
            (*round_trips, total),
            "the README's row `{name}` (round trips, commands); measured {commands:?}"
        );
    }
    // The level itself, spelled out: two plain commands under utc-day (no
    // grant read, no expiry read back), one more under rolling.
    let of = |i: usize| &measured[i].2;
    let level: BTreeMap<&str, u64> = [("EXPIREAT", 1), ("INCR", 1)].into();
    for (name, n) in &level {
        assert_eq!(of(1)[*name], of(0)[*name] + n, "{name}");
    }
    assert_eq!(of(1).values().sum::<u64>(), of(0).values().sum::<u64>() + 2);
    assert_eq!(of(2).values().sum::<u64>(), of(0).values().sum::<u64>() + 4);
    // Under rolling: the level's EXPIRETIME, and the subject's grant expiry.
    assert_eq!(of(3)["EXPIRETIME"], of(1)["EXPIRETIME"] + 1);
    assert_eq!(of(3)["EXPIREAT"], of(1)["EXPIREAT"] + 1);
}
