//! The bad-input catalogue: every way a client can get a request wrong, with
//! the status and body it must get and proof (against a real Valkey) that
//! nothing was counted or queued. Token rejections fall back to the anonymous
//! quota by design: for those the proof is that no token counter exists.
//! `tests/it/request_path.rs` covers `alg: none`, HS256 with the public key,
//! expired, not yet valid, wrong issuer, missing `tid` and garbage tokens;
//! the cases here extend it. Property tests end the file: random events
//! through parsing, identity and the whole gate never panic and get only
//! the documented answers, and each must really reach the gate often enough.

use quota_gate_testkit as common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderValue, Method, header};
use jsonwebtoken::Algorithm;
use quota_gate::front::lambda::to_gate_request;
use quota_gate::gate::{Gate, GateRequest};
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::store::QuotaKey;
use quota_gate::io::store::valkey::ValkeyStore;
use quota_gate::rules::scope::Scope;
use redis::AsyncCommands;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type ValkeyGate = Gate<ValkeyStore, StreamQueue>;

/// Nothing under quota:* and nothing queued.
async fn assert_nothing_counted(server: &ValkeyServer) {
    let mut c = server.client().await;
    let keys: Vec<String> = c.keys("quota:*").await.unwrap();
    assert!(keys.is_empty(), "counted: {keys:?}");
    let jobs: u64 = c.xlen("jobs").await.unwrap();
    assert_eq!(jobs, 0, "queued");
}

/// The request answers `status` with `{"error": code, "detail": …}` (and
/// `Allow: POST` with a 405).
async fn assert_refused(gate: &ValkeyGate, request: GateRequest, status: u16, code: &str) {
    let r = gate.handle(request).await;
    assert_eq!(r.status(), status, "{code}: {:?}", r.body());
    assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
    if status == 405 {
        assert_eq!(r.headers()[header::ALLOW], "POST");
    }
    let body = json(&r);
    assert_eq!(body["error"], code);
    assert!(
        body["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{body}"
    );
}

/// A valid scan, but for its body.
fn with_body(body: impl Into<Bytes>) -> GateRequest {
    let mut r = scan_from("203.0.113.7");
    r.body = body.into();
    r
}

/// A valid scan, but for its `Content-Type` (`None`: no such header).
fn with_content_type(value: Option<&[u8]>) -> GateRequest {
    let mut r = scan_from("203.0.113.7");
    match value {
        Some(v) => {
            r.headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_bytes(v).unwrap());
        }
        None => {
            r.headers.remove(header::CONTENT_TYPE);
        }
    }
    r
}

/// A valid scan, but for its method and path.
fn with_route(method: Method, path: &str) -> GateRequest {
    let mut r = scan_from("203.0.113.7");
    r.method = method;
    r.path = path.into();
    r
}

/// The catalogue, through one gate on a real Valkey: malformed or non-object
/// JSON, an empty body, a missing, empty, non-string or over-long image, a
/// body over 64 KiB, bytes that are not UTF-8, a wrong Content-Type, method
/// or path, and a source address the gateway should never send (a
/// deployment fault: 500). Each gets its status and code, and nothing is
/// counted or queued. Images of exactly 1024 bytes are still accepted.
#[tokio::test]
async fn refusals_are_never_counted() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    let mut cases: Vec<(GateRequest, u16, &str)> = vec![
        (with_body(r#"{"image": "a:1""#), 400, "invalid_json"),
        (with_body(""), 400, "empty_body"),
        (
            with_body(&b"{\"image\":\"a\xff\xfe\"}"[..]),
            400,
            "invalid_utf8",
        ),
        (
            with_body(json!({"image": "a".repeat(1025)}).to_string()),
            400,
            "image_too_long",
        ),
        (
            with_body(json!({"image": "a:1", "pad": "x".repeat(64 * 1024)}).to_string()),
            413,
            "payload_too_large",
        ),
    ];
    for body in [r#"["image"]"#, r#""image""#, "42", "null", "true"] {
        cases.push((with_body(body), 400, "not_an_object"));
    }
    for (body, code) in [
        (r#"{}"#, "missing_image"),
        (r#"{"Image":"a:1"}"#, "missing_image"),
        (r#"{"image":""}"#, "empty_image"),
        (r#"{"image":"   "}"#, "empty_image"),
        (r#"{"image":null}"#, "invalid_image"),
        (r#"{"image":["a:1"]}"#, "invalid_image"),
        (
            r#"{"image":"alpine\u0000:3.20"}"#,
            "image_control_character",
        ),
        (
            r#"{"image":"alpine:3.20\r\nX-Evil: 1"}"#,
            "image_control_character",
        ),
        (r#"{"image":"\u001b[2Jalpine"}"#, "image_control_character"),
    ] {
        cases.push((with_body(body), 400, code));
    }
    for content_type in [
        Some(&b"text/plain"[..]),
        Some(b"application/x-www-form-urlencoded"),
        Some(b"application/jsonp"),
        Some(b"application/\xffjson"),
        None,
    ] {
        cases.push((
            with_content_type(content_type),
            415,
            "unsupported_media_type",
        ));
    }
    for method in [Method::GET, Method::PUT, Method::DELETE, Method::PATCH] {
        cases.push((with_route(method, "/scan"), 405, "method_not_allowed"));
    }
    for path in [
        "/",
        "/scans",
        "/scan/extra",
        "/a/b/scan",
        "/admin",
        "//scan",
        "",
    ] {
        cases.push((with_route(Method::POST, path), 404, "not_found"));
    }
    for ip in ["203.0.113.0/24", "not-an-ip", ""] {
        cases.push((event_from(ip), 500, "no_source_address"));
    }
    for (request, status, code) in cases {
        assert_refused(&gate, request, status, code).await;
    }
    assert_nothing_counted(&server).await;
    let longest = json!({"image": "a".repeat(1024)}).to_string();
    assert_eq!(gate.handle(with_body(longest)).await.status(), 202);
}

/// The token is refused for `reason`; the scan is counted once, as its IP, never as a token.
async fn assert_token_refused(gate: &ValkeyGate, server: &ValkeyServer, auth: &str, reason: &str) {
    let mut r = scan_from("192.0.2.44");
    r.headers
        .insert(header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
    let response = gate.handle(r).await;
    assert_eq!(response.status(), 202);
    let body = json(&response);
    assert_eq!(body["token"], json!({"accepted": false, "reason": reason}));
    assert_eq!(body["quota"]["scope"], "ip", "{reason}");
    let mut c = server.client().await;
    let tid: Vec<String> = c.keys("quota:tid:*").await.unwrap();
    assert!(tid.is_empty(), "{reason}: counted as a token: {tid:?}");
}

fn claims() -> Value {
    json!({"iss": "stella-ops.org", "tid": "t-1", "exp": now() + 600})
}

/// A token for another audience is refused when QUOTA_JWT_AUDIENCE is set.
#[tokio::test]
async fn wrong_audience() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &[("QUOTA_JWT_AUDIENCE", "scanner-api")]);
    let mut c = claims();
    c["aud"] = json!("billing-api");
    let t = mint(Algorithm::EdDSA, c);
    assert_token_refused(&gate, &server, &format!("Bearer {t}"), "wrong_audience").await;
    // A token with no `aud` at all is not for this audience either.
    let t = mint(Algorithm::EdDSA, claims());
    assert_token_refused(&gate, &server, &format!("Bearer {t}"), "wrong_audience").await;
    // The right audience is accepted, so the refusal was about the audience.
    let mut c = claims();
    c["aud"] = json!("scanner-api");
    let body = json(
        &gate
            .handle(scan_with_token("192.0.2.44", &mint(Algorithm::EdDSA, c)))
            .await,
    );
    assert_eq!(body["token"]["accepted"], true);
}

/// `iss` is one string equal to QUOTA_JWT_ISSUER: an array holding it, or
/// another issuer, is refused, signature valid or not.
#[tokio::test]
async fn issuer_is_one_string() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &[]);
    for iss in [json!(["stella-ops.org"]), json!("other.org"), json!(null)] {
        let mut c = claims();
        c["iss"] = iss;
        let t = mint(Algorithm::EdDSA, c);
        assert_token_refused(&gate, &server, &format!("Bearer {t}"), "wrong_issuer").await;
    }
}

/// `token` with its payload changed (a higher tier) but its signature kept.
fn tampered(token: &str) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    let parts: Vec<&str> = token.split('.').collect();
    let mut payload: Value = serde_json::from_slice(&B64.decode(parts[1]).unwrap()).unwrap();
    payload["tier"] = json!(1_000_000);
    let payload = B64.encode(payload.to_string());
    format!("{}.{payload}.{}", parts[0], parts[2])
}

/// Authorization headers refused with a reason: a token over 8 KiB is not
/// even parsed (too_large), a valid token with its payload changed fails its
/// signature (bad_signature), and Basic auth, an empty bearer, two-part and
/// non-base64 tokens are no bearer token at all.
#[tokio::test]
async fn refused_authorization() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &[]);
    let mut padded = claims();
    padded["pad"] = json!("p".repeat(8 * 1024));
    let cases = [
        (mint(Algorithm::EdDSA, padded), "too_large"),
        (tampered(&mint(Algorithm::EdDSA, claims())), "bad_signature"),
    ];
    for (token, reason) in cases {
        assert_token_refused(&gate, &server, &format!("Bearer {token}"), reason).await;
    }
    for (auth, reason) in [
        ("Basic dXNlcjpwYXNz", "not_bearer"),
        ("Bearer", "not_bearer"),
        ("Bearer ", "malformed"),
        ("Bearer a.b", "malformed"),
        ("Bearer !!!.@@@.###", "malformed"),
        ("Bearer e30.e30.e30", "malformed"),
    ] {
        assert_token_refused(&gate, &server, auth, reason).await;
    }
}

/// The anonymous digest `gate` gives `ip`'s counter key.
fn ip_key(gate: &ValkeyGate, ip: &str) -> String {
    let digest = gate.identifier().ip_digest(ip.parse().unwrap());
    QuotaKey::new(Scope::Ip, &digest).counter
}

/// The counter keys that exist, sorted.
async fn counters(server: &ValkeyServer) -> Vec<String> {
    let mut c = server.client().await;
    let mut keys: Vec<String> = c.keys("quota:ip:*").await.unwrap();
    keys.retain(|k| !k.ends_with(":ts"));
    keys.sort();
    keys
}

/// X-Forwarded-For, Forwarded and X-Real-IP from an untrusted peer are ignored: the peer
/// is counted, never the address the client claims.
#[tokio::test]
async fn forged_client_address_headers() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    for (name, value) in [
        ("x-forwarded-for", "198.51.100.1"),
        ("x-forwarded-for", "198.51.100.1, 198.51.100.2"),
        ("forwarded", "for=198.51.100.1;proto=https"),
        ("forwarded", "for=\"[2001:db8::1]\""),
        ("x-real-ip", "198.51.100.1"),
        ("true-client-ip", "198.51.100.1"),
        ("cf-connecting-ip", "198.51.100.1"),
    ] {
        let mut r = scan_from("203.0.113.7");
        r.headers.insert(name, HeaderValue::from_static(value));
        assert_eq!(gate.handle(r).await.status(), 202, "{name}");
    }
    assert_eq!(counters(&server).await, [ip_key(&gate, "203.0.113.7")]);
    let mut c = server.client().await;
    let used: u64 = c.get(ip_key(&gate, "203.0.113.7")).await.unwrap();
    assert_eq!(
        used, 7,
        "all seven forged requests counted against the peer"
    );
}

/// A lambda event with `sourceIp` replaced.
fn event_from(source_ip: &str) -> GateRequest {
    let mut v: Value = serde_json::from_str(&event_text("http-api-v2-ipv4.json")).unwrap();
    v["requestContext"]["http"]["sourceIp"] = json!(source_ip);
    to_gate_request(lambda_http::request::from_str(&v.to_string()).unwrap())
}

/// Source IPs with and without /32 or /128, and IPv4-mapped IPv6, are one subject each.
#[tokio::test]
async fn source_ip_forms() {
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    for ip in [
        "203.0.113.7",
        "203.0.113.7/32",
        "::ffff:203.0.113.7",
        "::ffff:203.0.113.7/128",
    ] {
        assert_eq!(gate.handle(event_from(ip)).await.status(), 202, "{ip}");
    }
    for ip in [
        "2001:db8:1:2::1",
        "2001:db8:1:2::1/128",
        "2001:db8:1:2:ffff::9",
    ] {
        assert_eq!(gate.handle(event_from(ip)).await.status(), 202, "{ip}");
    }
    let mut c = server.client().await;
    let v4: u64 = c.get(ip_key(&gate, "203.0.113.7")).await.unwrap();
    let v6: u64 = c.get(ip_key(&gate, "2001:db8:1:2::1")).await.unwrap();
    assert_eq!((v4, v6), (4, 3));
    assert_eq!(counters(&server).await.len(), 2);
}

/// The local server on a free port, stopped on drop.
struct LocalServer {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl LocalServer {
    async fn start(gate: ValkeyGate) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(quota_gate::front::serve::serve(
            listener,
            Arc::new(gate),
            None,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            addr,
            stop: Some(stop),
        }
    }

    /// Sends `head` then `body_len` bytes of `{`-padding, concurrently reading the
    /// answer; returns the status and the body, once the response is complete.
    async fn raw(&self, head: String, body: Vec<u8>) -> (u16, Value) {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        // The server may answer and close before the upload ends: write errors are expected.
        let writer = tokio::spawn(async move {
            if write.write_all(head.as_bytes()).await.is_ok() {
                for chunk in body.chunks(64 * 1024) {
                    if write.write_all(chunk).await.is_err() {
                        break;
                    }
                }
            }
            // Returned, not dropped: dropping would half-close the socket, and hyper
            // drops a request whose client hung up before the answer.
            write
        });
        let mut response = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        let parsed = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let n = read.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                response.extend_from_slice(&buf[..n]);
                if let Some(parsed) = parse_response(&response) {
                    return Some(parsed);
                }
            }
            parse_response(&response)
        })
        .await
        .expect("an answer within 20 s");
        writer.abort();
        parsed.unwrap_or_else(|| panic!("no response: {:?}", String::from_utf8_lossy(&response)))
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The status and JSON body of the response in `raw`, once it is complete.
fn parse_response(raw: &[u8]) -> Option<(u16, Value)> {
    let head = common::client::parse_response(raw).ok()??;
    let body = raw.get(head.body)?;
    Some((
        head.status,
        serde_json::from_slice(body).unwrap_or(Value::Null),
    ))
}

/// A 10 MiB upload to the local server: 413 after reading at most 64 KiB + 1, nothing counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_mib_body_over_http() {
    let server = ValkeyServer::start();
    let local = LocalServer::start(valkey_gate(&server, &[])).await;
    let size = 10 * 1024 * 1024;
    let head = format!(
        "POST /scan HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {size}\r\n\r\n"
    );
    let mut body = br#"{"image":"a:1","pad":""#.to_vec();
    body.resize(size, b'x');
    let (status, json) = local.raw(head, body).await;
    assert_eq!(status, 413);
    assert_eq!(json["error"], "payload_too_large");
    // Chunked, with no length announced: the same limit applies.
    let head = "POST /scan HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\n\r\n"
        .to_owned();
    let mut chunked = Vec::new();
    for _ in 0..160 {
        chunked.extend_from_slice(format!("{:x}\r\n", 64 * 1024).as_bytes());
        chunked.extend(std::iter::repeat_n(b'x', 64 * 1024));
        chunked.extend_from_slice(b"\r\n");
    }
    let (status, json) = local.raw(head, chunked).await;
    assert_eq!(status, 413);
    assert_eq!(json["error"], "payload_too_large");
    assert_nothing_counted(&server).await;
}

/// 16 KiB headers over HTTP: a 16 KiB Content-Type is 415, a 16 KiB bearer token is
/// refused as too_large (counted only as the peer), and the server stays up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_kib_headers_over_http() {
    let server = ValkeyServer::start();
    let local = LocalServer::start(token_gate(&server, &[])).await;
    let big = "a".repeat(16 * 1024);
    let body = br#"{"image":"a:1"}"#.to_vec();
    let head = format!(
        "POST /scan HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/{big}\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let (status, json) = local.raw(head, body.clone()).await;
    assert_eq!(
        (status, json["error"].as_str()),
        (415, Some("unsupported_media_type"))
    );
    assert_nothing_counted(&server).await;

    let head = format!(
        "POST /scan HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Authorization: Bearer {big}\r\nX-Padding: {big}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let (status, json) = local.raw(head, body).await;
    assert_eq!(status, 202);
    assert_eq!(json["token"]["reason"], "too_large");
    let mut c = server.client().await;
    let tid: Vec<String> = c.keys("quota:tid:*").await.unwrap();
    assert!(tid.is_empty());
}

mod random_events {
    //! Random events through Lambda parsing, identity and the whole gate.

    use super::*;
    use proptest::prelude::*;
    use proptest::strategy::Union;
    use proptest::string::string_regex;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    use quota_gate::io::store::memory::MemoryStore;
    use std::cell::Cell;

    /// The least share, in percent, of generated events that must reach the
    /// gate in each property, well below what reaches it (about 35 %: random
    /// methods and headers are often no valid HTTP; every source address;
    /// about 55 % of the mutated events).
    const MIN_CLIENT_PARTS: u32 = 20;
    const MIN_SOURCES: u32 = 90;
    const MIN_MUTATED: u32 = 33;

    fn gate() -> Gate<MemoryStore, Discard> {
        let key = fixture("ed25519.pub.pem");
        common::gate(
            &[
                ("QUOTA_JWT_PUBLIC_KEY", key.as_str()),
                ("QUOTA_DELAY_MODE", "defer"),
                ("QUOTA_PACING", "off"),
            ],
            MemoryStore::default(),
            Discard,
        )
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            ".{0,40}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                prop::collection::btree_map("(image|[a-z]{1,8}|.{0,8})", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn body() -> impl Strategy<Value = String> {
        prop_oneof![
            json_value().prop_map(|v| v.to_string()),
            ".{0,200}",
            ".{0,64}".prop_map(|image| json!({"image": image}).to_string()),
        ]
    }

    /// Each of `known` as often as a string matching each of `patterns`.
    fn known_or_matching(
        known: &'static [&'static str],
        patterns: &[&str],
    ) -> impl Strategy<Value = String> + use<> {
        let matching = Union::new(patterns.iter().map(|p| string_regex(p).unwrap()));
        prop_oneof![
            known.len() as u32 => proptest::sample::select(known).prop_map(str::to_owned),
            patterns.len() as u32 => matching,
        ]
    }

    fn method() -> impl Strategy<Value = String> {
        known_or_matching(&["POST", "GET"], &["[A-Z]{1,8}", ".{0,10}"])
    }

    fn path() -> impl Strategy<Value = String> {
        // API Gateway's paths always start with a slash (lambda_http panics on one
        // that does not, before any handler runs).
        known_or_matching(&["/scan", "/prod/scan"], &["/[a-z/]{0,20}", "/.{0,30}"])
    }

    fn headers() -> impl Strategy<Value = Vec<(String, String)>> {
        let name = known_or_matching(
            &[
                "content-type",
                "authorization",
                "x-forwarded-for",
                "forwarded",
                "x-real-ip",
            ],
            &[".{0,12}"],
        );
        let value = known_or_matching(
            &["application/json"],
            &["Bearer [A-Za-z0-9._-]{0,80}", ".{0,60}"],
        );
        prop::collection::vec((name, value), 0..6)
    }

    /// An HTTP API v2 event with the given parts; `source` is the gateway's sourceIp.
    fn event(
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: &str,
        base64: bool,
        source: &str,
    ) -> String {
        use base64::Engine;
        let headers: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        let body = if base64 {
            base64::engine::general_purpose::STANDARD.encode(body)
        } else {
            body.to_owned()
        };
        json!({
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": path,
            "rawQueryString": "",
            "headers": headers,
            "requestContext": {
                "accountId": "123456789012", "apiId": "api", "domainName": "example.com",
                "domainPrefix": "api", "requestId": "r", "routeKey": "$default",
                "stage": "$default", "time": "20/Nov/2026:08:30:12 +0000",
                "timeEpoch": 1795163412417_u64,
                "http": {"method": method, "path": path, "protocol": "HTTP/1.1",
                         "sourceIp": source, "userAgent": "proptest"}
            },
            "body": body,
            "isBase64Encoded": base64
        })
        .to_string()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// Runs 300 events that `events` generates (as the Lambda runtime's
    /// JSON) through the runtime's parser and the whole gate, and `check`s
    /// each answer's status and JSON body. An event the runtime cannot parse
    /// (lambda_http 1.3.2 itself panics on some paths and host headers:
    /// invalid URI, IDNA; API Gateway never sends those) never reaches the
    /// gate; at least `min_percent` of the events must, so the property is
    /// really exercised.
    fn through_the_gate(
        events: impl Strategy<Value = String>,
        min_percent: u32,
        check: impl Fn(u16, &Value) -> Result<(), TestCaseError>,
    ) {
        let mut runner = TestRunner::new(Config::with_cases(300));
        let (reached, total) = (Cell::new(0u32), Cell::new(0u32));
        runner
            .run(&events, |text| {
                total.set(total.get() + 1);
                let parsed = std::panic::catch_unwind(|| lambda_http::request::from_str(&text));
                let Ok(Ok(request)) = parsed else {
                    return Ok(());
                };
                reached.set(reached.get() + 1);
                let r = runtime().block_on(gate().handle(to_gate_request(request)));
                let answer: Value = serde_json::from_slice(r.body()).unwrap();
                check(r.status().as_u16(), &answer)
            })
            .unwrap();
        let (reached, total) = (reached.get(), total.get());
        println!("{reached} of {total} generated events reached the gate");
        assert!(
            reached * 100 >= total * min_percent,
            "only {reached} of {total} generated events reached the gate"
        );
    }

    /// Whatever the client sends (method, path, headers, body), the answer
    /// is a 202 or a JSON 4xx: never a panic, never a 5xx.
    #[test]
    fn client_parts_never_cause_a_5xx() {
        let events = (method(), path(), headers(), body(), any::<bool>()).prop_map(
            |(method, path, headers, body, base64)| {
                event(&method, &path, &headers, &body, base64, "203.0.113.7")
            },
        );
        through_the_gate(events, MIN_CLIENT_PARTS, |status, answer| {
            prop_assert!(
                status == 202 || ((400..500).contains(&status) && answer["error"].is_string()),
                "{status}: {answer}"
            );
            Ok(())
        });
    }

    /// Random source addresses from the platform: a 202, or the documented
    /// 500 for an unusable one; never a panic.
    #[test]
    fn any_source_ip_is_handled() {
        let sources = prop_oneof![
            ".{0,45}",
            "[0-9a-f:./]{0,45}",
            any::<std::net::IpAddr>().prop_map(|ip| ip.to_string()),
        ];
        let content_type = [("content-type".to_owned(), "application/json".to_owned())];
        let events = sources.prop_map(move |source| {
            event(
                "POST",
                "/scan",
                &content_type,
                r#"{"image":"a:1"}"#,
                false,
                &source,
            )
        });
        through_the_gate(events, MIN_SOURCES, |status, answer| {
            prop_assert!(
                status == 202 || (status == 500 && answer["error"] == "no_source_address"),
                "{status}: {answer}"
            );
            Ok(())
        });
    }

    /// Where a mutation lands in the sample event.
    const EVENT_PATHS: &[&[&str]] = &[
        &["body"],
        &["isBase64Encoded"],
        &["rawPath"],
        &["headers"],
        &["headers", "content-type"],
        &["headers", "authorization"],
        &["headers", "idempotency-key"],
        &["requestContext", "http", "method"],
        &["requestContext", "http", "path"],
        &["requestContext", "http", "sourceIp"],
        &["requestContext", "authorizer"],
    ];

    /// The sample event with the value at `path` replaced by `value`, or removed.
    fn mutated(path: &[&str], value: Option<Value>) -> String {
        let mut event: Value = serde_json::from_str(&event_text("http-api-v2-ipv4.json")).unwrap();
        let (last, parents) = path.split_last().unwrap();
        let mut at = &mut event;
        for p in parents {
            at = &mut at[*p];
        }
        if let Some(map) = at.as_object_mut() {
            match value {
                Some(v) => {
                    map.insert((*last).to_owned(), v);
                }
                None => {
                    map.remove(*last);
                }
            }
        }
        event.to_string()
    }

    /// The sample event with one part replaced by random JSON (or removed):
    /// the gate answers with one of the documented statuses and a JSON body.
    #[test]
    fn mutated_sample_events() {
        // Strings half the time: most fields of an event are strings.
        let value = prop_oneof![json_value(), ".{0,40}".prop_map(Value::from)];
        let events = (0..EVENT_PATHS.len(), proptest::option::of(value))
            .prop_map(|(path, value)| mutated(EVENT_PATHS[path], value));
        through_the_gate(events, MIN_MUTATED, |status, answer| {
            prop_assert!(
                [202, 400, 404, 405, 413, 415].contains(&status)
                    || (status == 500 && answer["error"] == "no_source_address"),
                "{status}: {answer}"
            );
            prop_assert!(status == 202 || answer["error"].is_string(), "{answer}");
            Ok(())
        });
    }
}
