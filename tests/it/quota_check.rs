//! `GET /quota` and `quota-gate grant` with real parts: a real
//! Valkey (standalone and cluster), the in-memory store under a paused
//! clock where delays must match to the millisecond, and the operator
//! functions the CLI runs.

use quota_gate_testkit as common;

use common::cluster::{ValkeyCluster, cluster_gate};
use common::*;
use http::Method;
use quota_gate::front::ops::change;
use quota_gate::front::ops::subject::{self, SubjectArg};
use quota_gate::gate::Gate;
use quota_gate::io::clock::Clock;
use quota_gate::io::queue::ScanQueue;
use quota_gate::io::store::QuotaStore;
use quota_gate::io::store::memory::MemoryStore;
use serde_json::Value;

const IP: &str = "198.51.100.23";

/// 3 within, 2 soft (5 s), then hard (60 s); pacing on, nothing slept.
fn limits() -> Vec<(&'static str, &'static str)> {
    small_quota(&[
        ("QUOTA_DELAY_MODE", "defer"),
        ("QUOTA_MAX_BACKLOG_MS", "86400000"),
    ])
}

async fn get_quota<S: QuotaStore, Q: ScanQueue>(gate: &Gate<S, Q>, ip: &str) -> Value {
    let r = gate.handle(quota_from(ip)).await;
    assert_eq!(r.status(), 200, "{:?}", r.body());
    assert_eq!(r.headers()["cache-control"], "no-store");
    assert!(r.headers().contains_key("ratelimit"));
    assert!(r.headers().contains_key("ratelimit-policy"));
    json(&r)
}

async fn scan<S: QuotaStore, Q: ScanQueue>(gate: &Gate<S, Q>, ip: &str) -> Value {
    let r = gate.handle(scan_from(ip)).await;
    assert_eq!(r.status(), 202, "{:?}", r.body());
    json(&r)
}

/// Twenty reads leave `used` unchanged (no counter is even created); after
/// three scans it says 3, with the RateLimit headers of the scans.
#[tokio::test]
async fn reading_never_spends() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &limits());
    for _ in 0..20 {
        let body = get_quota(&gate, IP).await;
        assert_eq!(body["quota"]["used"], 0);
        assert_eq!(body["quota"]["remaining"], 3);
        assert_eq!(
            body["nextScan"],
            serde_json::json!({"tier": "within", "level": "subject", "delayMs": 0})
        );
    }
    let keys = server.keys("quota:*").await;
    assert!(keys.is_empty(), "a read wrote {keys:?}");
    for _ in 0..3 {
        scan(&gate, IP).await;
    }
    for _ in 0..20 {
        let body = get_quota(&gate, IP).await;
        assert_eq!(body["quota"]["used"], 3);
        assert_eq!(body["quota"]["limit"], 3);
        assert_eq!(body["quota"]["scope"], "ip");
        assert_eq!(body["nextScan"]["tier"], "soft");
    }
    let r = gate.handle(quota_from(IP)).await;
    assert_eq!(
        r.headers()["ratelimit"].to_str().unwrap().split(';').nth(1),
        Some("r=0")
    );
    assert_eq!(
        stream_jobs(&server, "jobs").await.len(),
        3,
        "reads queue nothing"
    );
}

/// With a frozen clock, `nextScan.delayMs` is exactly the delay the next
/// `POST /scan` gets: within, soft, hard and paced (the backlog grows).
#[tokio::test(start_paused = true)]
async fn next_scan_is_the_next_scans_delay() {
    let gate = gate(&limits(), MemoryStore::default(), Discard).with_clock(Clock::tokio());
    let mut seen = Vec::new();
    for _ in 0..8 {
        let predicted = get_quota(&gate, IP).await["nextScan"].clone();
        let got = scan(&gate, IP).await;
        assert_eq!(predicted["delayMs"], got["delayMs"], "{predicted} vs {got}");
        seen.push((
            predicted["tier"].as_str().unwrap().to_owned(),
            got["delayMs"].as_u64().unwrap(),
        ));
    }
    let tiers: Vec<&str> = seen.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        tiers,
        [
            "within", "within", "within", "soft", "soft", "hard", "hard", "hard"
        ]
    );
    let delays: Vec<u64> = seen.iter().map(|(_, d)| *d).collect();
    assert_eq!(delays, [0, 0, 0, 5_000, 10_000, 70_000, 130_000, 190_000]);
}

/// On a real Valkey the prediction is the scan's delay, less the time that
/// passed between the read and the scan (the paced slot stands still).
#[tokio::test]
async fn next_scan_matches_on_valkey() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &limits());
    for n in 0..7 {
        let before = std::time::Instant::now();
        let predicted = get_quota(&gate, IP).await["nextScan"]["delayMs"]
            .as_u64()
            .unwrap();
        let got = scan(&gate, IP).await["delayMs"].as_u64().unwrap();
        let passed = before.elapsed().as_millis() as u64 + 1;
        assert!(
            got <= predicted && predicted <= got + passed,
            "scan {n}: predicted {predicted}, got {got} ({passed} ms apart)"
        );
    }
}

/// `/quota` with another method is 405 with `Allow: GET, HEAD`, counting nothing.
#[tokio::test]
async fn other_methods_are_405() {
    let gate = gate(&limits(), MemoryStore::default(), Discard);
    let mut post = scan_from(IP);
    post.path = "/quota".into();
    let r = gate.handle(post).await;
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, HEAD");
    assert_eq!(json(&r)["error"], "method_not_allowed");
    assert_eq!(get_quota(&gate, IP).await["quota"]["used"], 0);
}

/// With the store down the answer is 503 with `Retry-After`, never a guess.
#[tokio::test]
async fn store_down_is_503() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(
        &server,
        &with_vars(
            &limits(),
            &[
                ("QUOTA_STORE_TIMEOUT_MS", "200"),
                ("QUOTA_BREAKER_FAILURES", "0"),
            ],
        ),
    );
    scan(&gate, IP).await;
    drop(server);
    let r = gate.handle(quota_from(IP)).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(json(&r)["error"], "store_unavailable");
    assert!(json(&r).get("quota").is_none());
}

/// A token caller reads its own (token) quota; an invalid token reads the
/// address's, and says why, exactly as a scan would be counted.
#[tokio::test]
async fn identified_as_a_scan_is() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &limits());
    let token = mint(
        jsonwebtoken::Algorithm::EdDSA,
        serde_json::json!({"tid": "t-quota", "iss": "stella-ops.org", "exp": now() + 600}),
    );
    let mut with_token = scan_with_token(IP, &token);
    assert_eq!(gate.handle(with_token.clone()).await.status(), 202);
    with_token.method = Method::GET;
    with_token.path = "/quota".into();
    let body = json(&gate.handle(with_token.clone()).await);
    assert_eq!(body["quota"]["scope"], "tid");
    assert_eq!(body["quota"]["used"], 1);
    assert_eq!(body["token"]["accepted"], true);
    with_token
        .headers
        .insert("authorization", "Bearer not.a.token".parse().unwrap());
    let body = json(&gate.handle(with_token).await);
    assert_eq!(body["quota"]["scope"], "ip");
    assert_eq!(body["quota"]["used"], 0);
    assert_eq!(body["token"]["accepted"], false);
}

/// `grant --scans 5` on a subject whose next scan is soft: the next five
/// are undelayed, the sixth is soft; inspect shows it, revoke and reset
/// take it away. The Valkey is at `url` (`extra` says more of it, pacing
/// is off); `gate` builds the gate from the variables.
async fn grant_five<Q: ScanQueue>(
    url: &str,
    extra: &[(&str, &str)],
    gate: impl FnOnce(&[(&str, &str)]) -> Gate<quota_gate::io::store::valkey::ValkeyStore, Q>,
) {
    let mut vars = with_vars(&limits(), &[("VALKEY_URL", url), ("QUOTA_PACING", "off")]);
    vars.extend_from_slice(extra);
    let store_config = &config(&vars);
    let gate = &gate(&vars);
    for _ in 0..3 {
        scan(gate, IP).await;
    }
    let store = quota_gate::front::ops::valkey_store(store_config).unwrap();
    let who = subject::resolve(store_config, &SubjectArg::Ip(IP.into())).unwrap();
    let before = subject::inspect(&store, store_config, &who).await.unwrap();
    assert_eq!(before.next.tier, "soft");
    let granted = change::grant(&store, &who, 5, store_config.policy.reset)
        .await
        .unwrap();
    assert_eq!(granted.scans, 5);
    assert_eq!(
        granted.expires_at, before.reset_at,
        "the grant expires with the counter"
    );
    let shown = subject::inspect(&store, store_config, &who).await.unwrap();
    assert_eq!(
        (shown.grant, shown.remaining, shown.next.tier),
        (5, 5, "within")
    );
    // One meaning of `limit`: the granted ceiling, as `GET /quota` says.
    assert_eq!((shown.limit, shown.base_limit), (8, 3));
    assert_eq!(shown.grant_expires_at, before.reset_at);
    assert_eq!(get_quota(gate, IP).await["quota"]["limit"], 8);
    for n in 4..=8 {
        let body = scan(gate, IP).await;
        assert_eq!(body["delayMs"], 0, "scan {n}: {body}");
        assert_eq!(body["quota"]["limit"], 8);
    }
    let sixth = scan(gate, IP).await;
    assert_eq!(sixth["delayMs"], 5_000, "{sixth}");
    // Revoke: the ceiling is the limit again; a second revoke finds nothing.
    let revoked = change::grant(&store, &who, 0, store_config.policy.reset)
        .await
        .unwrap();
    assert_eq!(revoked.revoked, Some(true));
    let again = change::grant(&store, &who, 0, store_config.policy.reset)
        .await
        .unwrap();
    assert_eq!(again.revoked, Some(false));
    assert!(
        again.render().starts_with("nothing to revoke"),
        "{}",
        again.render()
    );
    assert_eq!(
        subject::inspect(&store, store_config, &who)
            .await
            .unwrap()
            .grant,
        0
    );
    change::grant(&store, &who, 7, store_config.policy.reset)
        .await
        .unwrap();
    change::reset(&store, &who).await.unwrap();
    let after = subject::inspect(&store, store_config, &who).await.unwrap();
    assert_eq!(
        (after.exists, after.grant),
        (false, 0),
        "reset removes the grant"
    );
}

/// Grants on a standalone Valkey.
#[tokio::test]
async fn grant_on_valkey() {
    let server = ValkeyServer::start();
    grant_five(&server.url(), &[], |vars| valkey_gate(&server, vars)).await;
}

/// Grants through a real Valkey cluster: the grant shares the counter's slot.
#[tokio::test]
async fn grant_on_a_cluster() {
    let cluster = ValkeyCluster::start();
    let gate = |vars: &[(&str, &str)]| cluster_gate(&cluster, vars);
    grant_five(&cluster.url(), &[("VALKEY_CLUSTER", "true")], gate).await;
}

/// A grant made before the period's first scan counts too, and the
/// in-memory store follows the same rule.
#[tokio::test]
async fn grant_before_the_first_scan_and_in_memory() {
    let store = MemoryStore::default();
    let gate = gate(
        &with_vars(&limits(), &[("QUOTA_PACING", "off")]),
        store.clone(),
        Discard,
    );
    let who = subject::resolve(gate.config(), &SubjectArg::Ip(IP.into())).unwrap();
    store.grant(
        &who.key,
        2,
        quota_gate::rules::unix::UnixSecs(now()),
        quota_gate::config::ResetPolicy::UtcDay,
    );
    let delays: Vec<u64> = {
        let mut d = Vec::new();
        for _ in 0..6 {
            d.push(scan(&gate, IP).await["delayMs"].as_u64().unwrap());
        }
        d
    };
    assert_eq!(delays, [0, 0, 0, 0, 0, 5_000]);
}

/// Under `utc-day` the period is the UTC day whether or not the subject
/// has scanned: a grant made before its first scan ends tonight, not with
/// the day of whatever scan comes next.
#[tokio::test]
async fn grant_before_the_first_scan_ends_tonight_under_utc_day() {
    let server = ValkeyServer::start();
    let url = server.url();
    let vars = with_vars(&limits(), &[("VALKEY_URL", url.as_str())]);
    let store_config = &config(&vars);
    let store = quota_gate::front::ops::valkey_store(store_config).unwrap();
    let who = subject::resolve(store_config, &SubjectArg::Ip(IP.into())).unwrap();
    let granted = change::grant(&store, &who, 50, store_config.policy.reset)
        .await
        .unwrap();
    let midnight = now() - now().rem_euclid(86_400) + 86_400;
    let expected = quota_gate::gate::respond::rfc3339(midnight);
    // Unless the test ran across midnight.
    let tomorrow = quota_gate::gate::respond::rfc3339(midnight + 86_400);
    let at = granted.expires_at.expect("a grant with an end");
    assert!(at == expected || at == tomorrow, "{at}");
    let ttl: i64 = server.query(redis::cmd("TTL").arg(&who.key.grant)).await;
    assert!(ttl > 0 && ttl <= 86_400, "{ttl}");
}

/// Under `rolling`, a grant made before the period's first scan has no
/// expiry of its own until that scan's count gives it the counter's: plain
/// and keyed counts alike, on a real Valkey. `inspect` shows a grant-only
/// subject as such (no counter, no "never expires"), and `grant` says
/// until when it lasts.
#[tokio::test]
async fn grant_before_the_first_scan_expires_with_its_counter() {
    let server = ValkeyServer::start();
    let url = server.url();
    let vars = with_vars(
        &limits(),
        &[("VALKEY_URL", url.as_str()), ("QUOTA_RESET", "rolling")],
    );
    let store_config = &config(&vars);
    let gate = valkey_gate(&server, &vars);
    let store = quota_gate::front::ops::valkey_store(store_config).unwrap();
    for (ip, keyed) in [(IP, false), ("198.51.100.24", true)] {
        let who = subject::resolve(store_config, &SubjectArg::Ip(ip.into())).unwrap();
        let granted = change::grant(&store, &who, 50, store_config.policy.reset)
            .await
            .unwrap();
        assert_eq!(granted.expires_at, None, "no counter, no expiry yet");
        assert!(
            granted.render().contains("its next scan opens"),
            "{}",
            granted.render()
        );
        let shown = subject::inspect(&store, store_config, &who).await.unwrap();
        assert_eq!((shown.exists, shown.grant, shown.limit), (false, 50, 53));
        assert!(
            !shown.render().contains("never expires"),
            "{}",
            shown.render()
        );
        let ttl: i64 = server.query(redis::cmd("TTL").arg(&who.key.grant)).await;
        assert_eq!(ttl, -1, "the grant waits for the first scan");
        let mut request = scan_from(ip);
        if keyed {
            request
                .headers
                .insert("idempotency-key", "first-scan".parse().unwrap());
        }
        let r = gate.handle(request).await;
        assert_eq!(json(&r)["quota"]["limit"], 53);
        let expiry = |key: &str| redis::cmd("EXPIRETIME").arg(key).to_owned();
        let counter: i64 = server.query(&expiry(&who.key.counter)).await;
        let grant: i64 = server.query(&expiry(&who.key.grant)).await;
        assert!(
            counter > now() + 86_000,
            "rolling: 24 h from the first scan"
        );
        assert_eq!(
            grant, counter,
            "keyed={keyed}: the grant ends with its counter"
        );
        let shown = subject::inspect(&store, store_config, &who).await.unwrap();
        assert_eq!(shown.grant_expires_at, shown.reset_at);
    }
}
