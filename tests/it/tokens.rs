//! Token verification end to end: each key type, JWKS key selection by
//! `kid`, claims from an API Gateway JWT authorizer, and keys refused at start.

use quota_gate_testkit as common;

use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use quota_gate::front::lambda::to_gate_request;
use quota_gate::gate::Gate;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::spool::Spool;
use quota_gate::io::store::memory::MemoryStore;
use serde_json::json;

/// A gate on the in-memory store that throws its jobs away.
fn memory_gate(vars: &[(&str, &str)]) -> Gate<MemoryStore, Spool> {
    gate(
        vars,
        MemoryStore::default(),
        Spool::new(Box::new(std::io::sink())),
    )
}

fn claims(tid: &str) -> serde_json::Value {
    json!({"iss": "stella-ops.org", "tid": tid, "tier": 50, "exp": now() + 600})
}

async fn token_answer(gate: &Gate<MemoryStore, Spool>, token: &str) -> serde_json::Value {
    json(&gate.handle(scan_with_token("203.0.113.7", token)).await)
}

/// RS256, ES256 and EdDSA tokens each verify against their own PEM key, and only that one.
#[tokio::test]
async fn each_key_type_verifies_its_own_algorithm() {
    let algs = [
        (Algorithm::RS256, "rs256.pub.pem"),
        (Algorithm::ES256, "es256.pub.pem"),
        (Algorithm::EdDSA, "ed25519.pub.pem"),
    ];
    for (key_alg, pem) in algs {
        let gate = memory_gate(&[("QUOTA_JWT_PUBLIC_KEY", &fixture(pem))]);
        for (token_alg, _) in algs {
            let body = token_answer(&gate, &mint(token_alg, claims("t-1"))).await;
            if token_alg == key_alg {
                assert_eq!(body["token"], json!({"accepted": true}), "{pem}");
                assert_eq!(body["quota"]["limit"], 50, "the tier claim");
            } else {
                assert_eq!(
                    body["token"]["reason"], "algorithm_not_allowed",
                    "{pem} vs {token_alg:?}"
                );
            }
        }
    }
}

/// Keys may be given inline, as PEM or JWKS text, instead of a path.
#[tokio::test]
async fn inline_keys() {
    for (var, file, alg) in [
        ("QUOTA_JWT_PUBLIC_KEY", "ed25519.pub.pem", Algorithm::EdDSA),
        ("QUOTA_JWT_JWKS", "jwks.json", Algorithm::ES256),
    ] {
        let text = std::fs::read_to_string(fixture(file)).unwrap();
        let gate = memory_gate(&[(var, &text)]);
        let body = token_answer(&gate, &mint(alg, claims("t-1"))).await;
        assert_eq!(body["token"], json!({"accepted": true}), "{var}");
    }
}

/// An EdDSA token for `tid` signed with the test key, its header's `kid` set to `kid`.
fn ed_token(kid: Option<&str>, tid: &str) -> String {
    let pem = std::fs::read(fixture("ed25519.key.pem")).unwrap();
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(
        &header,
        &claims(tid),
        &EncodingKey::from_ed_pem(&pem).unwrap(),
    )
    .unwrap()
}

/// With a JWKS, each token is checked against the key its `kid` names.
#[tokio::test]
async fn jwks_picks_the_key_by_kid() {
    let gate = memory_gate(&[("QUOTA_JWT_JWKS", &fixture("jwks.json"))]);
    for alg in [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA] {
        let body = token_answer(&gate, &mint(alg, claims("t-1"))).await;
        assert_eq!(body["token"], json!({"accepted": true}), "{alg:?}");
    }
    // A kid nobody published, and a kid naming a key of another type.
    let unknown = token_answer(&gate, &ed_token(Some("ed-9"), "t-2")).await;
    assert_eq!(unknown["token"]["reason"], "unknown_kid");
    let mismatched = token_answer(&gate, &ed_token(Some("es-1"), "t-2")).await;
    assert_eq!(mismatched["token"]["reason"], "algorithm_not_allowed");
    // No kid: any key of the token's algorithm may verify it.
    let no_kid = token_answer(&gate, &ed_token(None, "t-2")).await;
    assert_eq!(no_kid["token"], json!({"accepted": true}));
}

/// Symmetric JWKS keys, unreadable files and non-keys stop the start, naming the variable.
#[test]
fn bad_keys_fail_at_start() {
    let symmetric = r#"{"keys":[{"kty":"oct","kid":"h","k":"c2VjcmV0LXNlY3JldC1zZWNyZXQ"}]}"#;
    let not_a_key = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
    for (var, value) in [
        ("QUOTA_JWT_JWKS", symmetric),
        ("QUOTA_JWT_JWKS", "{not json"),
        ("QUOTA_JWT_JWKS", "/nonexistent/jwks.json"),
        ("QUOTA_JWT_PUBLIC_KEY", not_a_key),
        ("QUOTA_JWT_PUBLIC_KEY", "/nonexistent/key.pem"),
    ] {
        let err = Gate::new(
            config(&[(var, value)]),
            MemoryStore::default(),
            Spool::new(Box::new(std::io::sink())),
            Meter::new("t", None),
        )
        .err()
        .unwrap_or_else(|| panic!("{var}={value} was accepted"));
        assert_eq!(err.var, var, "{err}");
    }
}

/// The HTTP API v2 sample event with claims from a JWT authorizer added.
fn authorized_event(claims: serde_json::Value) -> lambda_http::Request {
    let mut event: serde_json::Value =
        serde_json::from_str(&event_text("http-api-v2-ipv4.json")).unwrap();
    event["requestContext"]["authorizer"] = json!({"jwt": {"claims": claims, "scopes": null}});
    lambda_http::request::from_str(&event.to_string()).unwrap()
}

/// Authorizer claims are used only when QUOTA_TRUST_GATEWAY_CLAIMS is true, tier included.
#[tokio::test]
async fn gateway_claims_only_when_trusted() {
    let claims = json!({"tid": "tenant-7", "tier": "1000", "iss": "stella-ops.org"});
    let trusting = memory_gate(&[("QUOTA_TRUST_GATEWAY_CLAIMS", "true")]);
    let body = json(
        &trusting
            .handle(to_gate_request(authorized_event(claims.clone())))
            .await,
    );
    assert_eq!(body["quota"]["scope"], "tid");
    assert_eq!(body["quota"]["limit"], 1000);

    let default = memory_gate(&[]);
    let body = json(
        &default
            .handle(to_gate_request(authorized_event(claims)))
            .await,
    );
    assert_eq!(
        body["quota"]["scope"], "ip",
        "claims are ignored unless trusted"
    );

    // Trusted, but the authorizer's claims carry no tid: the anonymous quota.
    let body = json(
        &trusting
            .handle(to_gate_request(authorized_event(json!({"sub": "x"}))))
            .await,
    );
    assert_eq!(body["quota"]["scope"], "ip");
}

/// A gate with no key configured says so when a token is presented.
#[tokio::test]
async fn no_key_configured() {
    let gate = memory_gate(&[]);
    let body = token_answer(&gate, &mint(Algorithm::EdDSA, claims("t"))).await;
    assert_eq!(
        body["token"],
        json!({"accepted": false, "reason": "no_verification_key"})
    );
    assert_eq!(body["quota"]["scope"], "ip");
}

/// The auth scheme is case-insensitive: `BEARER` and `bearer` carry tokens too.
#[tokio::test]
async fn scheme_is_case_insensitive() {
    let gate = memory_gate(&[("QUOTA_JWT_PUBLIC_KEY", &fixture("ed25519.pub.pem"))]);
    let token = mint(Algorithm::EdDSA, claims("t-1"));
    for scheme in ["BEARER", "bearer", "Bearer"] {
        let mut request = scan_from("203.0.113.7");
        request.headers.insert(
            http::header::AUTHORIZATION,
            http::HeaderValue::from_str(&format!("{scheme} {token}")).unwrap(),
        );
        let body = json(&gate.handle(request).await);
        assert_eq!(body["token"], json!({"accepted": true}), "{scheme}");
    }
}

/// With a PEM key beside the JWKS, a `kid` nobody published is still
/// `unknown_kid`, as with the JWKS alone (not `algorithm_not_allowed` from
/// the PEM key of another type).
#[tokio::test]
async fn unknown_kid_with_pem_and_jwks() {
    let gate = memory_gate(&[
        ("QUOTA_JWT_PUBLIC_KEY", &fixture("rs256.pub.pem")),
        ("QUOTA_JWT_JWKS", &fixture("jwks.json")),
    ]);
    let body = token_answer(&gate, &ed_token(Some("ed-9"), "t-3")).await;
    assert_eq!(body["token"]["reason"], "unknown_kid", "{body}");
    // Known kids still verify, and the PEM key still verifies its own tokens.
    for alg in [Algorithm::RS256, Algorithm::EdDSA] {
        let body = token_answer(&gate, &mint(alg, claims("t-4"))).await;
        assert_eq!(body["token"], json!({"accepted": true}), "{alg:?}");
    }
}

/// The `tier` claim overrides the ceiling only as a JSON number; a string
/// (`"999999"`) is ignored, as the README says.
#[tokio::test]
async fn tier_claim_must_be_numeric() {
    let gate = memory_gate(&[("QUOTA_JWT_PUBLIC_KEY", &fixture("ed25519.pub.pem"))]);
    let numeric = json!({"iss": "stella-ops.org", "tid": "t-5", "tier": 50, "exp": now() + 600});
    let body = token_answer(&gate, &mint(Algorithm::EdDSA, numeric)).await;
    assert_eq!(body["quota"]["limit"], 50, "{body}");
    let string =
        json!({"iss": "stella-ops.org", "tid": "t-6", "tier": "999999", "exp": now() + 600});
    let body = token_answer(&gate, &mint(Algorithm::EdDSA, string)).await;
    assert_eq!(body["token"], json!({"accepted": true}), "{body}");
    assert_eq!(
        body["quota"]["limit"], 333,
        "a string tier is ignored: {body}"
    );
}
