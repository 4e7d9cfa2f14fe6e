//! Tokens are free too: a network's token holders share a ceiling
//! (`QUOTA_TOKEN_NETWORKS`), on counters apart from the anonymous ones, and
//! with `QUOTA_JWT_ACCOUNT_CLAIM` one account's tokens share one budget.
//! Real Valkey, real tokens (Ed25519), the library gate, nothing slept
//! (`defer`): what each answer and each queued job says.

use quota_gate_testkit as common;

use std::sync::Arc;

use common::*;
use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

/// Tokens never over their own quota (100); a /24's token holders share 6,
/// then 2 soft scans (1 s), then hard (3 s). The anonymous levels are the
/// defaults' shape, with room.
const TOKENS: &[(&str, &str)] = &[
    ("QUOTA_TOKEN", "100"),
    ("QUOTA_TOKEN_NETWORKS", "v4/24=6,v6/48=6"),
    ("QUOTA_NETWORKS", "v4/24=50"),
    ("QUOTA_SOFT_WINDOW", "2"),
    ("QUOTA_SOFT_DELAY_MS", "1000"),
    ("QUOTA_HARD_DELAY_MS", "3000"),
    ("QUOTA_DELAY_MODE", "defer"),
    ("QUOTA_MAX_BACKLOG_MS", "3600000"),
    ("QUOTA_EXEMPT_CLAIM", "quota_exempt"),
    ("QUOTA_STORE_TIMEOUT_MS", "5000"),
];

/// A verified token for `tid`, with `extra` claims.
fn token(tid: &str, extra: Value) -> String {
    let mut claims = json!({"iss": "stella-ops.org", "tid": tid, "exp": now() + 600});
    if let (Some(c), Value::Object(more)) = (claims.as_object_mut(), extra) {
        c.extend(more);
    }
    mint(Algorithm::EdDSA, claims)
}

/// The answer's delay and the level that set it.
fn delay_and_level(body: &Value) -> (u64, String) {
    let level = body["quota"]["level"].as_str().unwrap_or_default();
    (body["delayMs"].as_u64().unwrap(), level.to_owned())
}

/// One hundred tokens from one address, one scan each: the first six
/// undelayed, then the network's soft and hard tiers, named `tid:v4/24`,
/// their starts one delay apart across the tokens. Another network's
/// token, an anonymous client of the same network and an exempt token
/// wait for nothing; the anonymous level never saw a token scan.
#[tokio::test]
async fn a_networks_token_holders_share_a_ceiling() {
    let server = ValkeyServer::start();
    let gate = Arc::new(token_gate(&server, TOKENS));
    let requests =
        (0..100).map(|i| scan_with_token("203.0.113.9", &token(&format!("t-{i}"), json!({}))));
    let answers = all_at_once(&gate, requests).await;
    assert!(answers.iter().all(|r| r.status() == 202));
    let bodies: Vec<Value> = answers.iter().map(json).collect();
    let undelayed = bodies.iter().filter(|b| b["delayMs"] == 0).count();
    assert_eq!(undelayed, 6, "at most the level's limit goes undelayed");
    for b in bodies.iter().filter(|b| b["delayMs"] != 0) {
        assert_eq!(b["quota"]["level"], "tid:v4/24", "{b}");
        assert_eq!(b["quota"]["scope"], "tid", "{b}");
    }
    let jobs = stream_jobs(&server, "jobs").await;
    let tiers = |t: &str| jobs.iter().filter(|j| j["tier"] == t).count();
    assert_eq!((tiers("within"), tiers("soft"), tiers("hard")), (6, 2, 92));
    let mut starts: Vec<i64> = jobs
        .iter()
        .filter(|j| j["tier"] != "within")
        .map(|j| unix_ms(j["notBefore"].as_str().unwrap()))
        .collect();
    starts.sort_unstable();
    for pair in starts[1..].windows(2) {
        assert!(
            pair[1] - pair[0] >= 3000,
            "paced across the tokens: {starts:?}"
        );
    }

    // Untouched: a token from another network, an anonymous client of the
    // same network (its own level counted no token scan), an exempt token.
    let other = json(
        &gate
            .handle(scan_with_token(
                "198.51.100.7",
                &token("t-other", json!({})),
            ))
            .await,
    );
    assert_eq!(delay_and_level(&other), (0, "subject".into()));
    let anon = json(&gate.handle(scan_from("203.0.113.50")).await);
    assert_eq!(delay_and_level(&anon), (0, "subject".into()));
    let anon_view = json(&gate.handle(quota_from("203.0.113.50")).await);
    let anon_level = &anon_view["levels"][0];
    assert_eq!(
        (anon_level["level"].as_str(), anon_level["used"].as_u64()),
        (Some("v4/24"), Some(1)),
        "{anon_view}"
    );
    let exempt = token("t-exempt", json!({"quota_exempt": true}));
    let exempt = json(&gate.handle(scan_with_token("203.0.113.9", &exempt)).await);
    assert_eq!(exempt["quota"]["scope"], "exempt", "{exempt}");
    assert_eq!(exempt["delayMs"], 0, "{exempt}");

    // GET /quota and the headers name the level.
    let mut check = quota_from("203.0.113.9");
    check.headers = scan_with_token("203.0.113.9", &token("t-0", json!({}))).headers;
    let answer = gate.handle(check).await;
    assert!(
        answer.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("\"tid-v4-24\";q=6"),
        "{:?}",
        answer.headers()
    );
    let view = json(&answer);
    let level = &view["levels"][0];
    assert_eq!(
        (level["level"].as_str(), level["used"].as_u64()),
        (Some("tid:v4/24"), Some(100))
    );
    assert_eq!(view["nextScan"]["tier"], "hard", "{view}");
}

/// `QUOTA_TOKEN_NETWORKS=off`: a token holder is counted at no level, as
/// before.
#[tokio::test]
async fn token_levels_off() {
    let server = ValkeyServer::start();
    let vars = with_vars(TOKENS, &[("QUOTA_TOKEN_NETWORKS", "off")]);
    let gate = token_gate(&server, &vars);
    for i in 0..10 {
        let answer = gate
            .handle(scan_with_token(
                "203.0.113.9",
                &token(&format!("t-{i}"), json!({})),
            ))
            .await;
        assert_eq!(delay_and_level(&json(&answer)), (0, "subject".into()));
    }
}

/// A gate with a token quota of 3, no token levels, and the account read
/// from `claim`.
fn account_gate(
    server: &ValkeyServer,
    claim: &str,
) -> quota_gate::Gate<
    quota_gate::io::store::valkey::ValkeyStore,
    quota_gate::io::queue::stream::StreamQueue,
> {
    let vars = with_vars(
        TOKENS,
        &[
            ("QUOTA_TOKEN", "3"),
            ("QUOTA_TOKEN_NETWORKS", "off"),
            ("QUOTA_JWT_ACCOUNT_CLAIM", claim),
        ],
    );
    token_gate(server, &vars)
}

/// One scan each of `tokens`, the `i`-th from `198.51.<i>.7`: each answer's
/// delay.
async fn delays<S: quota_gate::io::store::QuotaStore, Q: quota_gate::io::queue::ScanQueue>(
    gate: &quota_gate::Gate<S, Q>,
    tokens: &[String],
) -> Vec<u64> {
    let mut delays = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ip = format!("198.51.{i}.7");
        let body = json(&gate.handle(scan_with_token(&ip, t)).await);
        delays.push(body["delayMs"].as_u64().unwrap());
    }
    delays
}

/// With the account claim set, ten tokens of one account share its one
/// budget (the fourth scan is over a quota of 3); a token without the
/// claim, or with an empty one, is counted by its `tid`, and metered.
#[tokio::test]
async fn one_account_one_budget() {
    let server = ValkeyServer::start();
    let gate = account_gate(&server, "account");
    let tokens: Vec<String> = (0..10)
        .map(|i| token(&format!("t-{i}"), json!({"account": "acct-1"})))
        .collect();
    let delays = delays(&gate, &tokens).await;
    assert_eq!(&delays[..3], [0, 0, 0]);
    assert!(delays[3..].iter().all(|d| *d >= 1000), "{delays:?}");
    // Another account and a token without the claim: each counted on its own.
    for claims in [json!({"account": "acct-2"}), json!({})] {
        let t = token("t-0", claims.clone());
        let body = json(&gate.handle(scan_with_token("192.0.2.1", &t)).await);
        assert_eq!(body["delayMs"], 0, "{claims}: {body}");
        assert_eq!(body["quota"]["scope"], "tid", "{claims}: {body}");
    }
    // A claim that is there but not a non-empty string: the token is
    // malformed, named in the answer, and the scan counted by its address.
    for claims in [
        json!({"account": ""}),
        json!({"account": 7}),
        json!({"account": []}),
        json!({"account": {}}),
    ] {
        let t = token("t-0", claims.clone());
        let body = json(&gate.handle(scan_with_token("192.0.2.2", &t)).await);
        let refused = json!({"accepted": false, "reason": "malformed", "claim": "account"});
        assert_eq!(body["token"], refused, "{claims}: {body}");
        assert_eq!(body["quota"]["scope"], "ip", "{claims}: {body}");
    }
}

/// A `tid` must be a non-empty string: a number (which every issuer's
/// token 12345 would share), an empty string, an array or an object makes
/// the token malformed, named in the answer; the scan is counted by its
/// address, never on a shared token counter.
#[tokio::test]
async fn a_tid_is_a_non_empty_string() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, TOKENS);
    for tid in [json!(12345), json!(""), json!([]), json!({}), json!(true)] {
        let t = token("replaced", json!({"tid": tid}));
        let body = json(&gate.handle(scan_with_token("192.0.2.3", &t)).await);
        let refused = json!({"accepted": false, "reason": "malformed", "claim": "tid"});
        assert_eq!(body["token"], refused, "{tid}: {body}");
        assert_eq!(body["quota"]["scope"], "ip", "{tid}: {body}");
    }
    let mut c = server.client().await;
    let tid: Vec<String> = redis::AsyncCommands::keys(&mut c, "quota:tid:*")
        .await
        .unwrap();
    assert!(tid.is_empty(), "counted as a token: {tid:?}");
}

/// A token without the account claim is metered: one
/// `stella_quota_tokens_without_account_total` per such scan.
#[tokio::test]
async fn tokens_without_the_account_are_metered() {
    let sink = Capture::default();
    let key = fixture("ed25519.pub.pem");
    let vars = with_vars(
        TOKENS,
        &[
            ("QUOTA_JWT_PUBLIC_KEY", key.as_str()),
            ("QUOTA_JWT_ACCOUNT_CLAIM", "account"),
        ],
    );
    let gate = metered_gate(
        &vars,
        quota_gate::io::store::memory::MemoryStore::default(),
        Discard,
        sink.meter(),
    );
    gate.handle(scan_with_token("192.0.2.1", &token("t-1", json!({}))))
        .await;
    gate.handle(scan_with_token(
        "192.0.2.1",
        &token("t-2", json!({"account": "a"})),
    ))
    .await;
    let text = sink.text();
    let missing = text
        .lines()
        .filter(|l| l.contains("\"stella_quota_tokens_without_account_total\":1"))
        .count();
    assert_eq!(missing, 1, "{text}");
}

/// What the README warns of: StellaOps' own tokens carry `sub:
/// "free-tier"` for every holder, so `QUOTA_JWT_ACCOUNT_CLAIM=sub` puts
/// every holder on one counter: strangers' fourth scan is over a quota
/// of 3.
#[tokio::test]
async fn a_claim_the_same_for_everyone_is_one_budget_for_all() {
    let server = ValkeyServer::start();
    let gate = account_gate(&server, "sub");
    let tokens: Vec<String> = ["alice", "bob", "carol", "dave"]
        .into_iter()
        .map(|who| token(who, json!({"sub": "free-tier"})))
        .collect();
    let delays = delays(&gate, &tokens).await;
    assert_eq!(&delays[..3], [0, 0, 0]);
    assert!(
        delays[3] >= 1000,
        "dave waits for alice, bob and carol: {delays:?}"
    );
}
