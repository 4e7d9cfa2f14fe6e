//! What a request costs Valkey, counted: the round trips and commands of
//! each path in docs/benchmarks.md's table ("What the levels cost"), measured here
//! and checked against the table itself, so a change that adds a command
//! to a path must change the docs in the same commit. Each request is
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

/// A row of docs/benchmarks.md's table, its settings, and its `i`-th request.
type Path = (
    &'static str,
    &'static [(&'static str, &'static str)],
    fn(u64) -> GateRequest,
);

/// The Ed25519 test key that verifies [`token_scan`]'s tokens.
const KEY: (&str, &str) = (
    "QUOTA_JWT_PUBLIC_KEY",
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/jwt/ed25519.pub.pem"
    ),
);

/// The `i`-th token holder's scan, each from its own /24.
fn token_scan(i: u64) -> GateRequest {
    let claims =
        serde_json::json!({"iss": "stella-ops.org", "tid": format!("t-{i}"), "exp": now() + 600});
    let token = mint(jsonwebtoken::Algorithm::EdDSA, claims);
    scan_with_token(&format!("10.{}.0.1", 1 + i), &token)
}

const PATHS: [Path; 7] = [
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
    (
        "within quota, token, `QUOTA_TOKEN_NETWORKS=off`",
        &[KEY, ("QUOTA_TOKEN_NETWORKS", "off")],
        token_scan,
    ),
    (
        "within quota, token, default token levels (its /24)",
        &[KEY],
        token_scan,
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
    let gate = proxied_gate(&proxy, vars, 0).await;
    let counted = Counted::start(server, &proxy).await;
    for i in 0..N {
        let answer = gate.handle(request(i)).await;
        assert!(answer.status().is_success(), "{name}: {answer:?}");
    }
    counted.per_request(name).await
}

/// A gate on `server` through `proxy`, with `vars`, connected: the stream
/// there, the connection's own set-up done (by a scan from `10.254.<k>.1`,
/// a network no path uses).
async fn proxied_gate(
    proxy: &Proxy,
    vars: &[(&str, &str)],
    k: u8,
) -> quota_gate::gate::Gate<
    quota_gate::io::store::valkey::ValkeyStore,
    quota_gate::io::queue::stream::StreamQueue,
> {
    let url = proxy.url();
    let base = [
        ("VALKEY_URL", url.as_str()),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
    ];
    let gate = stream_gate(&with_vars(&base, vars));
    let warm_up = scan_from(&format!("10.254.{k}.1"));
    assert_eq!(gate.handle(warm_up).await.status(), 202);
    gate
}

/// What Valkey runs from now on: `INFO commandstats` (reset here) and the
/// proxy's round trips.
struct Counted<'p> {
    admin: redis::aio::MultiplexedConnection,
    proxy: &'p Proxy,
    before: u64,
}

impl<'p> Counted<'p> {
    async fn start(server: &ValkeyServer, proxy: &'p Proxy) -> Self {
        let mut admin = server.client().await;
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut admin)
            .await
            .unwrap();
        Self {
            admin,
            proxy,
            before: proxy.bursts(),
        }
    }

    /// The round trips and each command's calls since the start, per
    /// request of `N`.
    async fn per_request(mut self, name: &str) -> (u64, BTreeMap<String, u64>) {
        let round_trips = self.proxy.bursts() - self.before;
        let mut commands = command_calls(&mut self.admin).await;
        for (command, calls) in &mut commands {
            assert_eq!(
                *calls % N,
                0,
                "{name}: {calls} {command} calls over {N} requests"
            );
            *calls /= N;
        }
        assert_eq!(round_trips % N, 0, "{name}: {round_trips} round trips");
        (round_trips / N, commands)
    }
}

/// A network's flood: every scan a new /64 of one /48, whose line (10
/// within, then 5 hard-tier scans paced a minute apart) is full.
const FLOOD: &[(&str, &str)] = &[
    ("QUOTA_ANON", "1"),
    ("QUOTA_NETWORKS", "v6/48=10"),
    ("QUOTA_SOFT_WINDOW", "0"),
    ("QUOTA_MAX_BACKLOG_MS", "300000"),
    ("QUOTA_DELAY_MODE", "defer"),
];

/// The `i`-th /64 of the flooding /48.
fn flooder(i: u64) -> GateRequest {
    scan_from(&format!("2001:db8:77:{i:x}::1"))
}

/// A refused scan's cost: the first of its line in a gate (count, pacing
/// step, refund), as in each of `N` Lambda environments; and every later
/// one in the same gate, answered from its memory of the refusal.
async fn measure_refusals(server: &ValkeyServer) -> [(u64, BTreeMap<String, u64>); 2] {
    let proxy = Proxy::start(loopback(server.port)).await;
    let mut gates = Vec::new();
    for k in 1..=N {
        gates.push(proxied_gate(&proxy, FLOOD, u8::try_from(k).unwrap()).await);
    }
    let filler = proxied_gate(&proxy, FLOOD, 99).await;
    for i in 0..16 {
        let _ = filler.handle(flooder(i)).await;
    }
    let counted = Counted::start(server, &proxy).await;
    for (i, gate) in (100..).zip(&gates) {
        assert_eq!(
            gate.handle(flooder(i)).await.status(),
            503,
            "the line is full"
        );
    }
    let first = counted.per_request("a first refusal").await;
    let counted = Counted::start(server, &proxy).await;
    for i in 0..N {
        assert_eq!(gates[0].handle(flooder(200 + i)).await.status(), 503);
    }
    [first, counted.per_request("a known refusal").await]
}

/// docs/benchmarks.md's row `| <name> | <round trips> | <commands> …|`.
fn readme_row(name: &str) -> (u64, u64) {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md"))
            .unwrap();
    let row = readme
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("| {name} |")))
        .unwrap_or_else(|| panic!("docs/benchmarks.md has no row `| {name} |`"));
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
    let refusals = [
        "refused (`backlog_full`), the first of its line in a gate",
        "refused (`backlog_full`), its line already refused",
    ];
    for (name, (round_trips, commands)) in refusals.into_iter().zip(measure_refusals(&server).await)
    {
        println!("{name}: {round_trips} round trips, {commands:?}");
        measured.push((name, round_trips, commands));
    }
    for (name, round_trips, commands) in &measured {
        let total: u64 = commands.values().sum();
        assert_eq!(
            readme_row(name),
            (*round_trips, total),
            "docs/benchmarks.md's row `{name}` (round trips, commands); measured {commands:?}"
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

/// Valkey's `used_memory`, its tables settled.
async fn used_memory(server: &ValkeyServer) -> i64 {
    // Valkey rehashes a growing table a step at a time (each command, and
    // 1 ms every 100 ms): while both tables are held, `used_memory` is the
    // old one's higher. Read it once the rehash is done.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let info: String = server.query(redis::cmd("INFO").arg("memory")).await;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("used_memory")
}

/// docs/benchmarks.md's figure before `what`: `**<n> bytes** <what>`.
fn readme_bytes(what: &str) -> i64 {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/benchmarks.md"))
            .unwrap();
    let (before, _) = readme
        .split_once(&format!(" bytes** {what}"))
        .unwrap_or_else(|| panic!("docs/benchmarks.md has no `**<n> bytes** {what}`"));
    let digits = before.rsplit("**").next().unwrap().replace(',', "");
    digits
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {digits}"))
}

/// What a subject holds in Valkey's memory until its period ends, and what
/// each network it is the first of adds, measured over 10,000 new
/// addresses (each of its own /24), within 15 % of docs/benchmarks.md's figures.
#[tokio::test]
async fn a_subject_costs_the_memory_the_readme_says() {
    const SUBJECTS: i64 = 10_000;
    let mut per_subject = Vec::new();
    for networks in ["off", "v4/24=8x"] {
        let server = ValkeyServer::start();
        let url = server.url();
        let vars = [("VALKEY_URL", url.as_str()), ("QUOTA_NETWORKS", networks)];
        let config = config(&vars);
        let valkey = quota_gate::io::connection::Valkey::from_config(&config)
            .unwrap()
            .unwrap();
        let store = quota_gate::io::store::valkey::ValkeyStore::new(valkey);
        let gate = gate(&vars, store, Discard);
        assert_eq!(gate.handle(scan_from("10.255.255.1")).await.status(), 202);
        let before = used_memory(&server).await;
        for i in 0..SUBJECTS {
            let ip = format!("10.{}.{}.1", i / 256, i % 256);
            assert_eq!(gate.handle(scan_from(&ip)).await.status(), 202);
        }
        per_subject.push((used_memory(&server).await - before) / SUBJECTS);
    }
    let (subject, level) = (per_subject[0], per_subject[1] - per_subject[0]);
    println!("a subject: {subject} bytes; a level it is the first of: {level} bytes");
    for (measured, stated) in [
        (subject, readme_bytes("for the rest of its period")),
        (level, readme_bytes("more")),
    ] {
        assert!(
            (measured - stated).abs() * 100 <= stated * 15,
            "measured {measured} bytes, docs/benchmarks.md says {stated}"
        );
    }
}
