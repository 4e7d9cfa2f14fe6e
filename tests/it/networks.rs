//! Budgets above the subject, from outside: addresses rotated inside one
//! network get that network's limit, then its tiers, their over-limit
//! scans started one delay apart across the addresses, sequentially and in
//! parallel; another network, a token holder and an exempt address are
//! untouched; the anonymous budget paces anonymous scans across networks;
//! refused and replayed scans are counted at no level. On a real Valkey
//! (standalone and a 3-primary cluster) and the in-memory store.

use quota_gate_testkit as common;

use std::sync::Arc;

use common::cluster::{ValkeyCluster, cluster_gate};
use common::*;
use quota_gate::gate::Gate;
use quota_gate::gate::identity::Identifier;
use quota_gate::io::connection::Valkey;
use quota_gate::io::queue::ScanQueue;
use quota_gate::io::store::valkey::ValkeyStore;
use quota_gate::io::store::{QuotaKey, QuotaStore};
use quota_gate::rules::scope::Scope;
use redis::AsyncCommands;
use serde_json::Value;

/// Subjects never over their own quota (100), networks small: a /24 of 4,
/// then 2 soft scans (1 s), then hard (3 s); nothing slept.
const LEVELS: &[(&str, &str)] = &[
    ("QUOTA_ANON", "100"),
    ("QUOTA_NETWORKS", "v4/24=4,v6/56=3,v6/48=5"),
    ("QUOTA_SOFT_WINDOW", "2"),
    ("QUOTA_SOFT_DELAY_MS", "1000"),
    ("QUOTA_HARD_DELAY_MS", "3000"),
    ("QUOTA_DELAY_MODE", "defer"),
    ("QUOTA_STORE_TIMEOUT_MS", "2000"),
];

fn levels(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    with_vars(LEVELS, extra)
}

/// Address `n` of 198.51.100.0/24.
fn v4(n: usize) -> String {
    format!("198.51.100.{n}")
}

/// The over-limit scans' starts (`notBefore`, unix ms), in order.
fn over_limit_starts(jobs: &[Value]) -> Vec<i64> {
    let mut starts: Vec<i64> = jobs
        .iter()
        .filter(|j| j["tier"] != "within")
        .map(|j| unix_ms(j["notBefore"].as_str().unwrap()))
        .collect();
    starts.sort_unstable();
    starts
}

/// Each start at least `delay_ms` after the one before it.
fn assert_one_delay_apart(starts: &[i64], delay_ms: i64) {
    for pair in starts.windows(2) {
        assert!(pair[1] - pair[0] >= delay_ms, "starts {starts:?}");
    }
}

/// A level counter's value, read through `conn` (0: none).
async fn level_count(
    conn: &mut impl redis::aio::ConnectionLike,
    vars: &[(&str, &str)],
    ip: &str,
    which: usize,
) -> u64 {
    let identifier = Identifier::new(&config(vars)).unwrap();
    let level = &identifier.levels_of(Scope::Ip, ip.parse().unwrap())[which];
    let key = level.key.clone();
    let used: Option<u64> = redis::cmd("GET")
        .arg(&key.counter)
        .query_async(conn)
        .await
        .unwrap();
    used.unwrap_or(0)
}

/// Twelve addresses of one /24, one scan each, one after another: the
/// first four within, two soft, the rest hard, each level-set delay named
/// `v4/24`; their starts one delay apart across the addresses.
async fn rotate_sequentially<S: QuotaStore, Q: ScanQueue>(gate: &Gate<S, Q>) -> Vec<Value> {
    let answers = one_at_a_time(gate, (1..=12).map(|n| scan_from(&v4(n)))).await;
    let bodies: Vec<Value> = answers.iter().map(json).collect();
    for (n, b) in (1..).zip(&bodies) {
        let (delay, level) = (&b["delayMs"], &b["quota"]["level"]);
        match n {
            1..=4 => assert_eq!(delay, 0, "{b}"),
            _ => {
                assert!(delay.as_u64().unwrap() >= 1000, "scan {n}: {b}");
                assert_eq!(level, "v4/24", "scan {n}: {b}");
            }
        }
    }
    bodies
}

#[tokio::test]
async fn a_slash_24_is_one_client_sequentially() {
    let server = ValkeyServer::start();
    let vars = levels(&[]);
    let gate = valkey_gate(&server, &vars);
    rotate_sequentially(&gate).await;
    let jobs = stream_jobs(&server, "jobs").await;
    let tiers: Vec<&str> = jobs.iter().map(|j| j["tier"].as_str().unwrap()).collect();
    assert_eq!(
        tiers,
        [
            "within", "within", "within", "within", "soft", "soft", "hard", "hard", "hard", "hard",
            "hard", "hard"
        ]
    );
    let starts = over_limit_starts(&jobs);
    assert_one_delay_apart(&starts[..2], 1000);
    assert_one_delay_apart(&starts[1..], 3000);
    // Each subject was counted once; the network twelve times.
    let mut conn = server.client().await;
    assert_eq!(level_count(&mut conn, &vars, &v4(1), 0).await, 12);
    // Another network, a token holder, an exempt address: untouched.
    let other = json(&gate.handle(scan_from("198.51.101.1")).await);
    assert_eq!(
        (other["delayMs"].as_u64(), other["quota"]["level"].as_str()),
        (Some(0), Some("subject"))
    );
}

#[tokio::test]
async fn a_slash_24_is_one_client_in_parallel() {
    let server = ValkeyServer::start();
    let vars = levels(&[]);
    let gate = Arc::new(valkey_gate(&server, &vars));
    let answers = all_at_once(&gate, (1..=20).map(|n| scan_from(&v4(n)))).await;
    assert!(answers.iter().all(|r| r.status() == 202));
    let jobs = stream_jobs(&server, "jobs").await;
    assert_eq!(jobs.iter().filter(|j| j["tier"] == "within").count(), 4);
    assert_eq!(jobs.iter().filter(|j| j["tier"] == "soft").count(), 2);
    // Sent at once, the sixteen over-limit scans still start one delay apart.
    let starts = over_limit_starts(&jobs);
    assert_eq!(starts.len(), 16);
    assert_one_delay_apart(&starts, 1000);
    assert!(starts[15] - starts[0] >= 1000 + 13 * 3000, "{starts:?}");
    let mut conn = server.client().await;
    assert_eq!(level_count(&mut conn, &vars, &v4(1), 0).await, 20);
}

/// /64s of one /56 share its limit (3); /56s of one /48 share the /48's (5).
#[tokio::test]
async fn ipv6_networks_are_one_client() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &levels(&[]));
    let slash56 = (0..5).map(|n| scan_from(&format!("2001:db8:7:{n:x}::1")));
    let answers = one_at_a_time(&gate, slash56).await;
    let levels: Vec<Value> = answers
        .iter()
        .map(|r| json(r)["quota"]["level"].clone())
        .collect();
    assert_eq!(levels, ["subject", "subject", "subject", "v6/56", "v6/56"]);
    // Other /56s of the same /48: the /48 has seen 5 already.
    let answers = one_at_a_time(
        &gate,
        (1..4).map(|n| scan_from(&format!("2001:db8:7:{n:x}00::1"))),
    )
    .await;
    for r in &answers {
        let b = json(r);
        assert_eq!(b["quota"]["level"], "v6/48", "{b}");
        assert!(b["delayMs"].as_u64().unwrap() >= 1000, "{b}");
    }
    // Another /48 is a stranger.
    let b = json(&gate.handle(scan_from("2001:db8:8::1")).await);
    assert_eq!(b["delayMs"], 0);
}

/// Token holders and exempt addresses are never counted at a level, however
/// full their network is.
#[tokio::test]
async fn tokens_and_exempt_scans_are_never_counted_at_a_level() {
    let server = ValkeyServer::start();
    let vars = levels(&[("QUOTA_EXEMPT_NETWORKS", "198.51.100.200/32")]);
    let gate = token_gate(&server, &vars);
    one_at_a_time(&gate, (1..=8).map(|n| scan_from(&v4(n)))).await;
    let token = mint(
        jsonwebtoken::Algorithm::EdDSA,
        serde_json::json!({"iss": "stella-ops.org", "tid": "team-1", "exp": now() + 600}),
    );
    let b = json(&gate.handle(scan_with_token(&v4(9), &token)).await);
    assert_eq!(
        (b["delayMs"].as_u64(), b["quota"]["scope"].as_str()),
        (Some(0), Some("tid"))
    );
    let b = json(&gate.handle(scan_from(&v4(200))).await);
    assert_eq!(b["quota"]["scope"], "exempt");
    let mut conn = server.client().await;
    assert_eq!(level_count(&mut conn, &vars, &v4(1), 0).await, 8);
}

/// Beyond `QUOTA_ANON_GLOBAL`, anonymous scans from anywhere start one
/// interval apart; a token holder waits for nothing.
#[tokio::test]
async fn the_anonymous_budget_paces_every_network() {
    let server = ValkeyServer::start();
    let vars = levels(&[
        ("QUOTA_NETWORKS", "off"),
        ("QUOTA_ANON_GLOBAL", "3"),
        ("QUOTA_ANON_GLOBAL_INTERVAL_MS", "2000"),
    ]);
    let gate = Arc::new(token_gate(&server, &vars));
    let answers = all_at_once(&gate, (1..=8).map(|n| scan_from(&format!("10.{n}.0.1")))).await;
    let bodies: Vec<Value> = answers.iter().map(json).collect();
    assert_eq!(bodies.iter().filter(|b| b["delayMs"] == 0).count(), 3);
    assert!(
        bodies
            .iter()
            .filter(|b| b["delayMs"] != 0)
            .all(|b| b["quota"]["level"] == "anon"),
        "{bodies:?}"
    );
    let starts = over_limit_starts(&stream_jobs(&server, "jobs").await);
    assert_eq!(starts.len(), 5);
    assert_one_delay_apart(&starts, 2000);
    let token = mint(
        jsonwebtoken::Algorithm::EdDSA,
        serde_json::json!({"iss": "stella-ops.org", "tid": "team-2", "exp": now() + 600}),
    );
    let b = json(&gate.handle(scan_with_token("10.99.0.1", &token)).await);
    assert_eq!(b["delayMs"], 0);
}

/// A scan refused for a full backlog is counted at no level and moves no
/// slot; a replayed one is counted at no level either.
#[tokio::test]
async fn refused_and_replayed_scans_are_counted_at_no_level() {
    let server = ValkeyServer::start();
    let vars = levels(&[("QUOTA_MAX_BACKLOG_MS", "4000")]);
    let gate = Arc::new(valkey_gate(&server, &vars));
    let answers = all_at_once(&gate, (1..=12).map(|n| scan_from(&v4(n)))).await;
    let accepted = answers.iter().filter(|r| r.status() == 202).count() as u64;
    let refused: Vec<_> = answers.iter().filter(|r| r.status() == 503).collect();
    assert!(
        !refused.is_empty() && accepted < 12,
        "some refused for the backlog"
    );
    assert!(refused.iter().all(|r| json(r)["error"] == "backlog_full"));
    let mut conn = server.client().await;
    assert_eq!(level_count(&mut conn, &vars, &v4(1), 0).await, accepted);
    assert_eq!(stream_jobs(&server, "jobs").await.len() as u64, accepted);
    // A repeat of a key: replayed, counted nowhere.
    let mut keyed = scan_from("198.51.102.1");
    keyed
        .headers
        .insert("idempotency-key", "k-1".parse().unwrap());
    let first = gate.handle(keyed.clone()).await;
    let again = gate.handle(keyed).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(json(&first)["scanId"], json(&again)["scanId"]);
    assert_eq!(level_count(&mut conn, &vars, "198.51.102.1", 0).await, 1);
}

/// The in-memory store (the local default) keeps the same rule.
#[tokio::test]
async fn the_embedded_store_counts_networks_too() {
    let queue = RecordingQueue::default();
    let gate = gate(
        &levels(&[]),
        quota_gate::io::store::memory::MemoryStore::default(),
        queue.clone(),
    );
    rotate_sequentially(&gate).await;
    let jobs: Vec<Value> = queue
        .jobs()
        .iter()
        .map(|j| serde_json::to_value(j).unwrap())
        .collect();
    let starts = over_limit_starts(&jobs);
    assert_eq!(starts.len(), 8);
    assert_one_delay_apart(&starts[1..], 3000);
}

/// Shadow mode decides and reports the level, and nobody waits.
#[tokio::test]
async fn shadow_mode_reports_levels() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &levels(&[("QUOTA_MODE", "shadow")]));
    let answers = one_at_a_time(&gate, (1..=7).map(|n| scan_from(&v4(n)))).await;
    let last = json(&answers[6]);
    assert_eq!(last["delayMs"], 0, "{last}");
    assert_eq!(last["quota"]["level"], "v4/24", "{last}");
    assert_eq!(last["shadow"]["tier"], "hard", "{last}");
}

/// On a 3-primary cluster each network lives in a slot of its own: the same
/// tiers, the same counts.
#[tokio::test]
async fn a_cluster_counts_networks() {
    let cluster = ValkeyCluster::start();
    let vars = levels(&[]);
    let gate = cluster_gate(&cluster, &vars);
    rotate_sequentially(&gate).await;
    let mut conn = cluster.client().await;
    assert_eq!(level_count(&mut conn, &vars, &v4(1), 0).await, 12);
    let starts = over_limit_starts(&jobs_on(&mut conn, "jobs").await);
    assert_one_delay_apart(&starts[1..], 3000);
}

/// A level written wrong stops the start, naming the variable.
#[test]
fn bad_levels_stop_the_start() {
    let bad = [
        ("QUOTA_NETWORKS", "v4/24"),
        ("QUOTA_NETWORKS", "v4/24=3,v4/24=4"),
        ("QUOTA_NETWORKS", "v7/24=3"),
        ("QUOTA_NETWORKS", "v4/32=3"),
        ("QUOTA_NETWORKS", "v4/24=many"),
        ("QUOTA_ANON_GLOBAL_INTERVAL_MS", "0"),
        ("QUOTA_ANON_GLOBAL_INTERVAL_MS", "86400001"),
        ("QUOTA_ANON_GLOBAL", "-1"),
    ];
    for (var, value) in bad {
        let e = quota_gate::config::Config::from_lookup(|k| (k == var).then(|| value.to_owned()))
            .unwrap_err();
        assert!(e.to_string().contains(var), "{var}={value}: {e}");
    }
}

/// Under `QUOTA_RESET=rolling` a level's period is its own (it starts with
/// the network's first scan, so its expiry is read back with every count,
/// not taken from the subject's), and a level left without an expiry heals
/// on its next count.
#[tokio::test]
async fn rolling_levels_keep_their_own_period() {
    let server = ValkeyServer::start();
    let vars = levels(&[("QUOTA_RESET", "rolling")]);
    let gate = valkey_gate(&server, &vars);
    one_at_a_time(&gate, (1..=3).map(|n| scan_from(&v4(n)))).await;
    let identifier = Identifier::new(&config(&vars)).unwrap();
    let level = &identifier.levels_of(Scope::Ip, v4(1).parse().unwrap())[0];
    let counter = level.key.counter.clone();
    let mut c = server.client().await;
    let ttl: i64 = c.ttl(&counter).await.unwrap();
    assert!(ttl > 86_000 && ttl <= 86_400, "ttl {ttl}");
    // Stripped of its expiry, the level gets one on its next count.
    let _: bool = c.persist(&counter).await.unwrap();
    gate.handle(scan_from(&v4(4))).await;
    let ttl: i64 = c.ttl(&counter).await.unwrap();
    assert!(ttl > 86_000 && ttl <= 86_400, "healed: ttl {ttl}");
    // A network whose period ends sooner than a new subject's: the scan it
    // delays reports the network's reset.
    let _: bool = c.expire(&counter, 600).await.unwrap();
    let r = gate.handle(scan_from(&v4(5))).await;
    let body = json(&r);
    assert_eq!(body["quota"]["level"], "v4/24", "{body}");
    let ratelimit = r.headers()["ratelimit"].to_str().unwrap();
    let t: i64 = ratelimit
        .rsplit_once(";t=")
        .and_then(|(_, t)| t.parse().ok())
        .unwrap_or_else(|| panic!("{ratelimit}"));
    // EXPIRE 600 from now: Valkey's whole second may round up by one.
    assert!(t > 500 && t <= 601, "{ratelimit}");
}

/// On a 3-primary cluster the subject and its /24 live on different
/// nodes, and each may fail alone. The subject's node stalls (SIGSTOP)
/// while the /24's answers: the network's count, made on a node that
/// answered, is taken back with the scan's (closed: refused; open: queued
/// unmetered), exactly, not given the subject's fate. The /24's node
/// stalls while the subject's answers: the scan goes on, and the network's
/// count lands when its node resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_settles_each_level_by_its_own_fate() {
    let cluster = ValkeyCluster::start();
    let base = levels(&[
        ("QUOTA_NETWORKS", "v4/24=100"),
        ("QUOTA_STORE_TIMEOUT_MS", "300"),
        ("QUOTA_BREAKER_FAILURES", "0"),
    ]);
    let identifier = Identifier::new(&config(&base)).unwrap();
    let subject_key = |ip: &str| {
        let digest = identifier.ip_digest(ip.parse().unwrap());
        QuotaKey::new(quota_gate::rules::scope::Scope::Ip, &digest).counter
    };
    let level = &identifier.levels_of(Scope::Ip, v4(1).parse().unwrap())[0];
    let level_node = cluster.node_of(&level.key.counter.clone());
    let ip = (1..=250)
        .map(v4)
        .find(|ip| cluster.node_of(&subject_key(ip)) != level_node)
        .expect("an address of the /24 whose subject lives on another node");
    let subject_node = cluster.node_of(&subject_key(&ip));
    // Jobs kept in memory: a stream's own slot could be on the node this
    // test stalls, and the queue's failures are not this test's business.
    let url = cluster.url();
    let gate_on = |vars: &[(&str, &str)]| {
        let vars = with_vars(
            vars,
            &[("VALKEY_URL", url.as_str()), ("VALKEY_CLUSTER", "true")],
        );
        let valkey = Valkey::from_config(&config(&vars)).unwrap().unwrap();
        gate(&vars, ValkeyStore::new(valkey), RecordingQueue::default())
    };
    let mut conn = cluster.client().await;
    let mut used = 0;
    for mode in ["closed", "open"] {
        let vars = with_vars(&base, &[("QUOTA_FAIL_MODE", mode)]);
        let gate = gate_on(&vars);
        // Connected to every node, and counted everywhere once.
        assert_eq!(gate.handle(scan_from(&ip)).await.status(), 202);
        used += 1;
        cluster.nodes[subject_node].signal("STOP");
        let answer = gate.handle(scan_from(&ip)).await;
        cluster.nodes[subject_node].signal("CONT");
        let expected = if mode == "closed" { 503 } else { 202 };
        assert_eq!(answer.status(), expected, "{mode}: {:?}", answer.body());
        // What the resumed node was sent runs now: the count and its refund.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(
            level_count(&mut conn, &vars, &ip, 0).await,
            used,
            "{mode}: the network's count was taken back"
        );
        let subject: Option<u64> = redis::cmd("GET")
            .arg(subject_key(&ip))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(
            subject,
            Some(used),
            "{mode}: the subject's count and refund both landed"
        );
    }
    // The /24's node stalls: the scan goes on, its network count lands late.
    let gate = gate_on(&base);
    assert_eq!(gate.handle(scan_from(&ip)).await.status(), 202);
    used += 1;
    cluster.nodes[level_node].signal("STOP");
    let answer = gate.handle(scan_from(&ip)).await;
    cluster.nodes[level_node].signal("CONT");
    assert_eq!(answer.status(), 202, "{:?}", answer.body());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    used += 1;
    assert_eq!(level_count(&mut conn, &base, &ip, 0).await, used);
    // The subject's node is gone (its count is never sent, or refused),
    // closed mode: the network's count made on its own node goes back.
    let gate = gate_on(&with_vars(&base, &[("QUOTA_FAIL_MODE", "closed")]));
    assert_eq!(gate.handle(scan_from(&ip)).await.status(), 202);
    used += 1;
    cluster.nodes[subject_node].signal("KILL");
    let level = level.key.counter.clone();
    // The first finds its connection broken under it (no answer); the
    // next ones are refused by the store (never sent, or redirected to
    // the dead node): each level's fate, not the subject's, settles it.
    for n in 1..=3 {
        let answer = gate.handle(scan_from(&ip)).await;
        assert_eq!(answer.status(), 503, "{n}: {:?}", answer.body());
        assert_eq!(cluster.get(&level), Some(used as i64), "{n}: taken back");
    }
}
