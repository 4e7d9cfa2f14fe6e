//! What a client sees of the levels above its subject ("Clients
//! see it"): `quota.level`, a `RateLimit-Policy` per level, `RateLimit` for
//! the fewest remaining, the reminder that a token lifts a network's
//! limit, and `GET /quota`'s `levels` and `nextScan`; on the in-memory store
//! and on a real Valkey.

use quota_gate_testkit as common;

use bytes::Bytes;
use common::cluster::{ValkeyCluster, cluster_gate};
use common::*;
use quota_gate::front::ops::network;
use quota_gate::gate::{Gate, GateRequest};
use quota_gate::io::queue::ScanQueue;
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::store::QuotaStore;
use quota_gate::io::store::memory::MemoryStore;
use quota_gate::io::store::valkey::ValkeyStore;
use serde_json::json;

/// 2 scans within per address, a /24 of 4, a /56 of 3 and a /48 of 5;
/// 2 soft (5 s) then hard; pacing on, nothing slept.
fn vars() -> Vec<(&'static str, &'static str)> {
    vec![
        ("QUOTA_ANON", "2"),
        ("QUOTA_SOFT_WINDOW", "2"),
        ("QUOTA_NETWORKS", "v4/24=4,v6/56=3,v6/48=5"),
        ("QUOTA_DELAY_MODE", "defer"),
        ("QUOTA_MAX_BACKLOG_MS", "86400000"),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
    ]
}

fn header(r: &http::Response<Bytes>, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

async fn scan<S: QuotaStore, Q: ScanQueue>(
    gate: &Gate<S, Q>,
    request: GateRequest,
) -> http::Response<Bytes> {
    let r = gate.handle(request).await;
    assert_eq!(r.status(), 202, "{:?}", r.body());
    r
}

/// Five addresses of one /24, one scan each: the fifth is delayed by the
/// /24, says so, and `GET /quota` from a sixth address sees the level.
async fn a_rotated_v4_24<S: QuotaStore, Q: ScanQueue>(gate: &Gate<S, Q>) {
    for host in 1..=4 {
        let r = scan(gate, scan_from(&format!("203.0.113.{host}"))).await;
        let body = json(&r);
        assert_eq!(body["quota"]["level"], "subject", "scan {host}: {body}");
        assert_eq!(body["delayMs"], 0);
        assert_eq!(
            header(&r, "ratelimit-policy"),
            "\"daily\";q=2;w=86400, \"v4-24\";q=4;w=86400"
        );
        assert!(header(&r, "x-stella-quota-reminder").is_empty());
    }
    let r = scan(gate, scan_from("203.0.113.5")).await;
    let body = json(&r);
    assert_eq!(body["quota"]["level"], "v4/24", "{body}");
    assert_eq!(body["quota"]["used"], 1);
    assert_eq!(body["delayMs"], 5_000);
    assert!(header(&r, "ratelimit").starts_with("\"v4-24\";r=0;t="));
    assert_eq!(header(&r, "x-stella-quota-remaining"), "1");
    let reminder = header(&r, "x-stella-quota-reminder");
    assert!(
        reminder.contains("network (v4/24)") && reminder.contains("token"),
        "{reminder}"
    );
    assert_eq!(body["reminder"], reminder.as_str());

    let r = gate.handle(quota_from("203.0.113.6")).await;
    assert_eq!(r.status(), 200);
    let body = json(&r);
    assert_eq!(
        body["levels"],
        json!([{"level": "v4/24", "limit": 4, "used": 5, "remaining": 0}])
    );
    assert_eq!(body["nextScan"]["level"], "v4/24");
    assert_eq!(body["nextScan"]["tier"], "soft");
    // Paced behind the fifth scan's slot: more than the tier's 5 s.
    let delay = body["nextScan"]["delayMs"].as_u64().unwrap();
    assert!(delay > 5_000 && delay <= 10_000, "{body}");
    assert!(header(&r, "ratelimit").starts_with("\"v4-24\";r=0;"));
    assert_eq!(
        header(&r, "ratelimit-policy"),
        "\"daily\";q=2;w=86400, \"v4-24\";q=4;w=86400"
    );
    // Another /24 is untouched.
    let other = json(&scan(gate, scan_from("198.51.100.9")).await);
    assert_eq!(
        (other["quota"]["level"].clone(), other["delayMs"].clone()),
        (json!("subject"), json!(0))
    );
}

/// /64s rotated in one /56, then /56s in one /48: each network's level
/// sets the delay in turn.
async fn a_rotated_v6<S: QuotaStore, Q: ScanQueue>(gate: &Gate<S, Q>) {
    let level = |r: &http::Response<Bytes>| json(r)["quota"]["level"].clone();
    for n in 0..3 {
        let r = scan(gate, scan_from(&format!("2001:db8:7:1{n}::1"))).await;
        assert_eq!(level(&r), "subject");
        let policy = header(&r, "ratelimit-policy");
        assert_eq!(
            policy,
            "\"daily\";q=2;w=86400, \"v6-56\";q=3;w=86400, \"v6-48\";q=5;w=86400"
        );
    }
    let r = scan(gate, scan_from("2001:db8:7:13::1")).await;
    assert_eq!(level(&r), "v6/56");
    assert!(header(&r, "x-stella-quota-reminder").contains("network (v6/56)"));
    // Another /56 of the /48: the 5th in the /48 is within, the 6th is not.
    let r = scan(gate, scan_from("2001:db8:7:200::1")).await;
    assert_eq!(level(&r), "subject");
    let r = scan(gate, scan_from("2001:db8:7:300::1")).await;
    assert_eq!(level(&r), "v6/48");
    assert!(header(&r, "ratelimit").starts_with("\"v6-48\";r=0;"));
    let body = json(&gate.handle(quota_from("2001:db8:7:400::1")).await);
    let levels: Vec<&str> = body["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["v6/56", "v6/48"]);
    assert_eq!(body["nextScan"]["level"], "v6/48");
}

/// In memory: the /24, the /56 and the /48.
#[tokio::test]
async fn levels_in_memory() {
    let gate = gate(&vars(), MemoryStore::default(), Discard);
    a_rotated_v4_24(&gate).await;
    a_rotated_v6(&gate).await;
}

/// On a real Valkey: the same, and a token holder of the crowded /24 sees
/// only its network's token level, which the anonymous crowd never touched.
#[tokio::test]
async fn levels_on_valkey() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &vars());
    a_rotated_v4_24(&gate).await;
    a_rotated_v6(&gate).await;

    let claims = json!({"iss": "stella-ops.org", "tid": "t-1", "tier": 50, "exp": now() + 600});
    let token = mint(jsonwebtoken::Algorithm::EdDSA, claims);
    let r = scan(&gate, scan_with_token("203.0.113.7", &token)).await;
    let body = json(&r);
    assert_eq!(body["quota"]["level"], "subject");
    assert_eq!(body["delayMs"], 0);
    assert_eq!(
        header(&r, "ratelimit-policy"),
        "\"daily\";q=50;w=86400, \"tid-v4-24\";q=3330;w=86400"
    );
    let mut check = quota_from("203.0.113.7");
    check.headers = scan_with_token("203.0.113.7", &token).headers;
    let body = json(&gate.handle(check).await);
    let levels = body["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 1, "{body}");
    assert_eq!(
        (levels[0]["level"].as_str(), levels[0]["used"].as_u64()),
        (Some("tid:v4/24"), Some(1))
    );
    assert_eq!(body["nextScan"]["level"], "subject");
}

/// A network grant lifts the network's limit on the request path, for a
/// plain scan and a keyed one, and a revoke takes it back: the counter
/// holds used − granted (the count reads no grant key), and `GET /quota`
/// and `inspect --network` add the grant back.
async fn a_network_grant(
    gate: &Gate<ValkeyStore, StreamQueue>,
    ops: &quota_gate::Config,
    conn: &mut impl redis::aio::ConnectionLike,
) {
    let cidr = "203.0.113.0/24";
    let counter = network::resolve(ops, cidr).unwrap().key.counter;
    let held = async |conn: &mut _| -> i64 {
        redis::cmd("GET")
            .arg(&counter)
            .query_async(conn)
            .await
            .unwrap()
    };
    for host in 1..=4 {
        scan(gate, scan_from(&format!("203.0.113.{host}"))).await;
    }
    let granted = network::grant(ops, cidr, 3).await.unwrap();
    assert!(
        granted
            .expires_at
            .is_some_and(|at| at.ends_with("T00:00:00Z"))
    );
    assert_eq!(held(conn).await, 1, "4 used, 3 granted");
    let mut keyed = scan_from("203.0.113.7");
    keyed
        .headers
        .insert("idempotency-key", "grant-1".parse().unwrap());
    let scans = [scan_from("203.0.113.5"), scan_from("203.0.113.6"), keyed];
    let mut last = None;
    for request in scans {
        let r = scan(gate, request).await;
        let body = json(&r);
        assert_eq!(
            (body["quota"]["level"].clone(), body["delayMs"].clone()),
            (json!("subject"), json!(0)),
            "within the granted scans: {body}"
        );
        last = Some(r);
    }
    // The seventh of 4 + 3: none left on the network.
    assert!(header(&last.unwrap(), "ratelimit").starts_with("\"v4-24\";r=0;t="));
    assert_eq!(held(conn).await, 4);
    let body = json(&gate.handle(quota_from("203.0.113.8")).await);
    assert_eq!(
        body["levels"],
        json!([{"level": "v4/24", "limit": 7, "used": 7, "remaining": 0}])
    );
    let report = network::inspect_network(ops, cidr).await.unwrap();
    assert_eq!(
        (report.used, report.limit, report.grant, report.remaining),
        (7, 7, 3, 0)
    );

    let revoked = network::grant(ops, cidr, 0).await.unwrap();
    assert_eq!(revoked.revoked, Some(true));
    assert_eq!(held(conn).await, 7);
    let body = json(&scan(gate, scan_from("203.0.113.9")).await);
    assert_eq!(body["quota"]["level"], "v4/24", "{body}");
    assert!(body["delayMs"].as_u64().unwrap() > 0, "{body}");
    let report = network::inspect_network(ops, cidr).await.unwrap();
    assert_eq!(
        (report.used, report.limit, report.grant, report.remaining),
        (8, 4, 0, 0)
    );
    let again = network::grant(ops, cidr, 0).await.unwrap();
    assert_eq!(again.revoked, Some(false), "nothing left to revoke");
    assert_eq!(held(conn).await, 8);
}

#[tokio::test]
async fn a_network_grant_on_valkey() {
    let server = ValkeyServer::start();
    let url = server.url();
    let vars = with_vars(&vars(), &[("VALKEY_URL", url.as_str())]);
    let mut conn = server.client().await;
    a_network_grant(&valkey_gate(&server, &vars), &config(&vars), &mut conn).await;
}

/// On a 3-primary cluster, where each level is counted in a request of its
/// own.
#[tokio::test]
async fn a_network_grant_on_a_cluster() {
    let cluster = ValkeyCluster::start();
    let url = cluster.url();
    let vars = with_vars(
        &vars(),
        &[("VALKEY_URL", url.as_str()), ("VALKEY_CLUSTER", "true")],
    );
    let mut conn = cluster.client().await;
    a_network_grant(&cluster_gate(&cluster, &vars), &config(&vars), &mut conn).await;
}
