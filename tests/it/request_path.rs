//! The whole request path against a real Valkey server: tiers, keys, TTLs,
//! concurrency, identity and the no-loss rules.

use quota_gate_testkit as common;

use std::time::Duration;

use common::*;
use jsonwebtoken::Algorithm;
use quota_gate::front::lambda::to_gate_request;
use quota_gate::gate::Gate;
use quota_gate::io::connection::Valkey;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::store::valkey::ValkeyStore;
use redis::AsyncCommands;
use serde_json::json;

/// Requests 1–3 get no delay, 4–5 the soft delay, 6+ the hard delay; headers follow.
#[tokio::test]
async fn tiers_against_valkey() {
    let server = ValkeyServer::start();
    // The subject's tiers alone: with the default levels its 202s would
    // also list the /24's policy (tests/it/levels_client.rs covers that).
    let vars = with_vars(TIERS, &[("QUOTA_NETWORKS", "off")]);
    assert_tiers(&valkey_gate(&server, &vars)).await;
    let jobs = stream_jobs(&server, "jobs").await;
    assert_eq!(jobs.len(), 8, "one job per 202");
    let tiers: Vec<_> = jobs
        .iter()
        .map(|j| j["tier"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        tiers,
        [
            "within", "within", "within", "soft", "soft", "hard", "hard", "hard"
        ]
    );
    // Defer mode: nothing slept, everything deferred onto the job.
    assert_eq!(jobs[5]["deferredMs"], 60000);
}

/// Every quota key has a TTL no later than the next 00:00 UTC, and the first-seen key holds ISO 8601.
#[tokio::test]
async fn utc_day_ttl_and_first_seen() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    let r = gate.handle(scan_from("198.51.100.20")).await;
    assert_eq!(r.status(), 202);
    let mut c = server.client().await;
    let (server_now, _): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let to_midnight = 86_400 - server_now.rem_euclid(86_400);
    let keys: Vec<String> = c.keys("quota:*").await.unwrap();
    // The counter, its first-seen key, and the /24's counter.
    assert_eq!(keys.len(), 3, "{keys:?}");
    for key in &keys {
        let ttl: i64 = c.ttl(key).await.unwrap();
        assert!(
            ttl > 0 && ttl <= to_midnight,
            "{key}: ttl {ttl}, {to_midnight} s to midnight"
        );
        assert!(
            (key.starts_with("quota:ip:{") || key.starts_with("quota:net:{"))
                && (key.ends_with('}') || key.ends_with("}:ts")),
            "{key}"
        );
    }
    let ts_key = keys.iter().find(|k| k.ends_with(":ts")).unwrap();
    let ts: String = c.get(ts_key).await.unwrap();
    let parsed =
        time::OffsetDateTime::parse(&ts, &time::format_description::well_known::Rfc3339).unwrap();
    assert!((parsed.unix_timestamp() - server_now).abs() <= 2, "{ts}");
    // The reset instant in the response is that midnight.
    let body = json(&r);
    let reset = time::OffsetDateTime::parse(
        body["quota"]["resetAt"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert_eq!(reset.unix_timestamp().rem_euclid(86_400), 0);
}

/// In rolling mode the TTL is at most 24 h, and a counter left without expiry heals.
#[tokio::test]
async fn rolling_ttl_and_healing() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[("QUOTA_RESET", "rolling")]);
    gate.handle(scan_from("198.51.100.21")).await;
    let mut c = server.client().await;
    let keys: Vec<String> = c.keys("quota:*").await.unwrap();
    let counter = keys.iter().find(|k| !k.ends_with(":ts")).unwrap().clone();
    let ttl: i64 = c.ttl(&counter).await.unwrap();
    assert!(ttl > 86_000 && ttl <= 86_400, "ttl {ttl}");
    // A counter stripped of its expiry (by an old client, say) gets one on the next scan.
    let _: () = c.persist(&counter).await.unwrap();
    gate.handle(scan_from("198.51.100.21")).await;
    let ttl: i64 = c.ttl(&counter).await.unwrap();
    assert!(ttl > 0, "ttl {ttl}");
}

/// A counter created by hand without an expiry (a crash between INCR and
/// EXPIRE in an older client, say) gets the next 00:00 UTC on the subject's
/// next scan: EXPIREAT … NX rides along with every count.
#[tokio::test]
async fn counter_without_expiry_heals_on_next_scan() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    let key = quota_gate::io::store::QuotaKey::new(
        quota_gate::rules::scope::Scope::Ip,
        &gate
            .identifier()
            .ip_digest("198.51.100.22".parse().unwrap()),
    );
    let mut c = server.client().await;
    let _: () = c.set(&key.counter, 5).await.unwrap();
    assert_eq!(c.ttl::<_, i64>(&key.counter).await.unwrap(), -1);
    let body = json(&gate.handle(scan_from("198.51.100.22")).await);
    assert_eq!(body["quota"]["used"], 6);
    let ttl: i64 = c.ttl(&key.counter).await.unwrap();
    let to_midnight = 86_400 - now().rem_euclid(86_400);
    assert!(
        ttl > 0 && ttl <= to_midnight,
        "ttl {ttl}, midnight in {to_midnight}"
    );
    assert_eq!(
        body["quota"]["resetAt"],
        quota_gate::gate::respond::rfc3339(now() + to_midnight)
    );
}

/// 400 concurrent scans from one subject over many connections count 1…400 exactly once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_counts_are_exact() {
    let server = ValkeyServer::start();
    assert_400_concurrent_scans_count_exactly(|vars| valkey_gate(&server, vars)).await;
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 400);
}

/// A forged X-Forwarded-For does not change the key; one IPv6 /64 shares a counter.
#[tokio::test]
async fn identity_is_not_forgeable() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    let plain = json(&gate.handle(scan_from("203.0.113.7")).await);
    // The sample event: sourceIp 203.0.113.7/32 plus a forged x-forwarded-for.
    let forged = json(
        &gate
            .handle(to_gate_request(event("http-api-v2-ipv4.json")))
            .await,
    );
    assert_eq!(plain["quota"]["used"], 1);
    assert_eq!(
        forged["quota"]["used"], 2,
        "same subject despite x-forwarded-for"
    );
    let v6a = json(&gate.handle(scan_from("2001:db8:abcd:12:1:2:3:4")).await);
    let v6b = json(
        &gate
            .handle(scan_from("2001:db8:abcd:12:ffff:ffff:0:9"))
            .await,
    );
    let v6c = json(&gate.handle(scan_from("2001:db8:abcd:13::1")).await);
    assert_eq!(
        (v6a["quota"]["used"].as_u64(), v6b["quota"]["used"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(v6c["quota"]["used"], 1);
    let jobs = stream_jobs(&server, "jobs").await;
    assert_eq!(jobs[0]["digest"], jobs[1]["digest"]);
    // No address anywhere in what was stored.
    let mut c = server.client().await;
    let keys: Vec<String> = c.keys("*").await.unwrap();
    assert!(
        keys.iter()
            .all(|k| !k.contains("203.0.113") && !k.contains("2001:db8")),
        "{keys:?}"
    );
}

/// A valid token is counted under quota:tid:{…}, separately from its IP, with its tier as limit.
#[tokio::test]
async fn token_holders_counted_separately() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &[]);
    let anon = json(
        &gate
            .handle(to_gate_request(event("http-api-v2-ipv4.json")))
            .await,
    );
    let token = json(
        &gate
            .handle(to_gate_request(event("http-api-v2-token.json")))
            .await,
    );
    assert_eq!(anon["quota"]["scope"], "ip");
    assert_eq!(token["quota"]["scope"], "tid");
    assert_eq!(token["quota"]["used"], 1);
    assert_eq!(token["quota"]["limit"], 500, "the token's tier claim");
    assert_eq!(token["token"], json!({"accepted": true}));
    let mut c = server.client().await;
    let tid_keys: Vec<String> = c.keys("quota:tid:{*}").await.unwrap();
    assert_eq!(tid_keys.len(), 1);
    // A token without a tier gets QUOTA_TOKEN.
    let t = mint(
        Algorithm::EdDSA,
        json!({"iss": "stella-ops.org", "tid": "t-2", "exp": now() + 600}),
    );
    let body = json(&gate.handle(scan_with_token("203.0.113.7", &t)).await);
    assert_eq!(body["quota"]["limit"], 333);
}

/// alg none, HS256 signed with the public key, expired and wrong-issuer tokens all fall back to
/// the anonymous quota, with the reason given.
#[tokio::test]
async fn bad_tokens_fall_back_to_anonymous() {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &[]);

    let claims =
        json!({"iss": "stella-ops.org", "tid": "evil", "tier": 100000, "exp": now() + 600});
    let payload = B64.encode(claims.to_string());
    let none = format!("{}.{payload}.", B64.encode(r#"{"alg":"none","typ":"JWT"}"#));
    let public_pem = std::fs::read(fixture("ed25519.pub.pem")).unwrap();
    let hs256 = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(&public_pem),
    )
    .unwrap();
    let wrong_iss = mint(
        Algorithm::EdDSA,
        json!({"iss": "evil.example", "tid": "t", "exp": now() + 600}),
    );
    let other_key = mint(
        Algorithm::ES256,
        json!({"iss": "stella-ops.org", "tid": "t", "exp": now() + 600}),
    );
    let no_tid = mint(
        Algorithm::EdDSA,
        json!({"iss": "stella-ops.org", "exp": now() + 600}),
    );
    let not_yet = mint(
        Algorithm::EdDSA,
        json!({"iss": "stella-ops.org", "tid": "t", "nbf": now() + 600, "exp": now() + 1200}),
    );

    for (token, reason) in [
        (none.as_str(), "algorithm_not_allowed"),
        (hs256.as_str(), "algorithm_not_allowed"),
        (
            event_token("http-api-v2-token-expired.json").as_str(),
            "expired",
        ),
        (wrong_iss.as_str(), "wrong_issuer"),
        (other_key.as_str(), "algorithm_not_allowed"),
        (no_tid.as_str(), "missing_tid"),
        (not_yet.as_str(), "not_yet_valid"),
        ("garbage", "malformed"),
    ] {
        let body = json(&gate.handle(scan_with_token("192.0.2.9", token)).await);
        assert_eq!(body["quota"]["scope"], "ip", "{reason}");
        assert_eq!(body["quota"]["limit"], 33, "{reason}");
        assert_eq!(body["token"], json!({"accepted": false, "reason": reason}));
    }
    let mut c = server.client().await;
    let tid_keys: Vec<String> = c.keys("quota:tid:*").await.unwrap();
    assert!(
        tid_keys.is_empty(),
        "no bad token was counted as a token: {tid_keys:?}"
    );
}

/// A failed enqueue answers 503 with Retry-After and refunds the count.
#[tokio::test]
async fn failed_enqueue_refunds() {
    let server = ValkeyServer::start();
    let queue_server = ValkeyServer::start();
    let config = config(&[
        ("VALKEY_URL", &server.url()),
        ("QUOTA_STORE_TIMEOUT_MS", "200"),
    ]);
    let store = ValkeyStore::new(Valkey::new(&server.url(), false, config.store.timeout).unwrap());
    let queue_valkey = Valkey::new(&queue_server.url(), false, Duration::from_millis(200)).unwrap();
    let gate = Gate::new(
        config,
        store,
        StreamQueue::new(queue_valkey, "jobs"),
        Meter::new("t", None),
    )
    .unwrap();

    assert_eq!(gate.handle(scan_from("203.0.113.9")).await.status(), 202);
    drop(queue_server);
    for _ in 0..3 {
        let r = gate.handle(scan_from("203.0.113.9")).await;
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
        assert_eq!(json(&r)["error"], "queue_unavailable");
    }
    let mut c = server.client().await;
    let keys: Vec<String> = c.keys("quota:ip:{*}").await.unwrap();
    let counter = keys.iter().find(|k| !k.ends_with(":ts")).unwrap();
    let used: u64 = c.get(counter).await.unwrap();
    assert_eq!(used, 1, "only the accepted scan is counted");
}

/// Every sample event answers what events/README.md says.
#[tokio::test]
async fn sample_events() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &[]);
    for (name, status, scope) in [
        ("http-api-v2-ipv4.json", 202, Some("ip")),
        ("http-api-v2-ipv6.json", 202, Some("ip")),
        ("http-api-v2-token.json", 202, Some("tid")),
        ("http-api-v2-token-expired.json", 202, Some("ip")),
        ("rest-v1.json", 202, Some("ip")),
        ("function-url.json", 202, Some("ip")),
        ("http-api-v2-bad-body.json", 400, None),
    ] {
        let r = gate.handle(to_gate_request(event(name))).await;
        assert_eq!(r.status(), status, "{name}: {:?}", r.body());
        if let Some(scope) = scope {
            assert_eq!(json(&r)["quota"]["scope"], scope, "{name}");
        }
    }
    // The keyed event, twice: the second is the first's 202 again, not counted.
    let first = gate
        .handle(to_gate_request(event("http-api-v2-idempotent.json")))
        .await;
    assert_eq!(first.status(), 202);
    let again = gate
        .handle(to_gate_request(event("http-api-v2-idempotent.json")))
        .await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(json(&again)["scanId"], json(&first)["scanId"]);
    assert_eq!(json(&again)["quota"]["used"], 1);
}
