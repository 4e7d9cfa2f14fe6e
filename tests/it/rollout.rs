//! Turning the gate on without fear: shadow mode and exemptions,
//! on a real Valkey with the jobs on its stream and the EMF lines captured.

use quota_gate_testkit as common;

use std::time::{Duration, Instant};

use common::*;
use quota_gate::io::meter::{self, Meter};
use quota_gate::io::store::QuotaKey;
use quota_gate::io::store::valkey::ValkeyStore;
use serde_json::Value;

const IP: &str = "198.51.100.40";

/// 3 within, 2 soft, then hard, at the real delays (5 s and 60 s), slept
/// in the handler when enforced; pacing on.
fn real_delays() -> Vec<(&'static str, &'static str)> {
    small_quota(&[
        ("QUOTA_SOFT_DELAY_MS", "5000"),
        ("QUOTA_HARD_DELAY_MS", "60000"),
    ])
}

/// A gate on `server` (stream `jobs`) whose EMF lines go to `meter`.
fn metered_valkey_gate(
    server: &ValkeyServer,
    vars: &[(&str, &str)],
    meter: Meter,
) -> quota_gate::Gate<ValkeyStore, quota_gate::io::queue::stream::StreamQueue> {
    let url = server.url();
    let vars = with_vars(
        &[
            ("VALKEY_URL", url.as_str()),
            ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ],
        vars,
    );
    let config = config(&vars);
    let valkey = quota_gate::io::connection::Valkey::from_config(&config)
        .unwrap()
        .unwrap();
    quota_gate::Gate::new(
        config,
        ValkeyStore::new(valkey.clone()),
        quota_gate::io::queue::stream::StreamQueue::new(valkey, "jobs"),
        meter,
    )
    .unwrap()
}

/// The sum of one metric over every EMF line that carries it.
fn emf_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|doc| doc[name].as_u64())
        .sum()
}

/// Shadow mode past the limit: 40 scans from one subject are answered at
/// once, each saying what enforcement would have done, every job undelayed
/// with its decided tier; the shadow counters hold the hits, the real ones
/// stay 0. Switched to enforce on the same Valkey, the very next scan gets
/// its tier's delay and no inherited backlog.
#[tokio::test]
async fn shadow_then_enforce() {
    let server = ValkeyServer::start();
    let sink = Capture::default();
    let shadow = with_vars(&real_delays(), &[("QUOTA_MODE", "shadow")]);
    let gate = metered_valkey_gate(&server, &shadow, sink.meter());
    let started = Instant::now();
    let mut expected = Vec::new();
    for n in 1..=40u64 {
        let r = gate.handle(scan_from(IP)).await;
        assert_eq!(r.status(), 202);
        let (tier, delay) = match n {
            1..=3 => ("within", 0),
            4..=5 => ("soft", 5_000),
            _ => ("hard", 60_000),
        };
        assert_eq!(r.headers()["x-stella-quota-shadow"], tier, "scan {n}");
        let body = json(&r);
        assert_eq!(
            body["shadow"],
            serde_json::json!({"tier": tier, "delayMs": delay})
        );
        assert_eq!(
            (body["delayMs"].as_u64(), body["sleptMs"].as_u64()),
            (Some(0), Some(0))
        );
        assert_eq!(body["quota"]["used"], n);
        expected.push(tier);
    }
    // Nobody waited: forty scans in less than one soft delay.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let jobs = stream_jobs(&server, "jobs").await;
    assert_eq!(jobs.len(), 40);
    for (job, tier) in jobs.iter().zip(&expected) {
        assert_eq!(job["tier"], *tier);
        assert_eq!(job["delayMs"], 0);
        assert_eq!(job["notBefore"], job["receivedAt"]);
    }
    let emf = sink.text();
    assert_eq!(emf_sum(&emf, meter::SHADOW_SOFT_HITS), 2);
    assert_eq!(emf_sum(&emf, meter::SHADOW_HARD_HITS), 35);
    assert_eq!(emf_sum(&emf, meter::SOFT_HITS), 0);
    assert_eq!(emf_sum(&emf, meter::HARD_HITS), 0);
    assert_eq!(emf_sum(&emf, "stella_quota_requests_within_total"), 40);
    let slots = server.keys("quota:*:slot").await;
    assert!(
        slots.is_empty(),
        "shadow mode took a pacing slot: {slots:?}"
    );

    // The same Valkey, enforced (deferred, so the test does not sleep a minute).
    let enforce = with_vars(
        &real_delays(),
        &[("QUOTA_MODE", "enforce"), ("QUOTA_DELAY_MODE", "defer")],
    );
    let gate = metered_valkey_gate(&server, &enforce, sink.meter());
    let r = gate.handle(scan_from(IP)).await;
    assert!(r.headers().get("x-stella-quota-shadow").is_none());
    let body = json(&r);
    assert_eq!(
        (body["quota"]["used"].as_u64(), body["delayMs"].as_u64()),
        (Some(41), Some(60_000))
    );
    assert!(body.get("shadow").is_none());
}

/// A token carrying `quota_exempt: true`, signed with the test key.
fn exempt_token(tid: &str) -> String {
    mint(
        jsonwebtoken::Algorithm::EdDSA,
        serde_json::json!({"tid": tid, "iss": "stella-ops.org", "exp": now() + 600, "quota_exempt": true}),
    )
}

/// Exempt networks and the exempt claim: 100 scans each are queued at
/// once with tier `exempt`, never counted or paced (no key is written),
/// each 202 with the quota headers every 202 carries (the whole limit left);
/// the claim on a token that does not verify exempts nobody.
#[tokio::test]
async fn exempt_networks_and_claims() {
    let server = ValkeyServer::start();
    let sink = Capture::default();
    let key = fixture("ed25519.pub.pem");
    let vars = with_vars(
        &real_delays(),
        &[
            ("QUOTA_JWT_PUBLIC_KEY", key.as_str()),
            ("QUOTA_EXEMPT_NETWORKS", "192.0.2.0/24, 2001:db8:e::/48"),
            ("QUOTA_EXEMPT_CLAIM", "quota_exempt"),
            ("QUOTA_DELAY_MODE", "defer"),
        ],
    );
    let gate = metered_valkey_gate(&server, &vars, sink.meter());
    let token = exempt_token("t-ci");
    for n in 0..100 {
        let from = if n % 2 == 0 {
            "192.0.2.17"
        } else {
            "2001:db8:e:5::9"
        };
        for request in [scan_from(from), scan_with_token("203.0.113.50", &token)] {
            let r = gate.handle(request).await;
            assert_eq!(r.status(), 202);
            // The headers every 202 carries: the caller's own quota, unspent.
            let h = r.headers();
            let limit = h["ratelimit-policy"].to_str().unwrap();
            let limit = limit
                .strip_prefix("\"daily\";q=")
                .unwrap()
                .split(';')
                .next()
                .unwrap();
            assert_eq!(h["x-stella-quota-remaining"].to_str().unwrap(), limit);
            assert!(
                h["ratelimit"]
                    .to_str()
                    .unwrap()
                    .starts_with(&format!("\"daily\";r={limit};t="))
            );
            assert!(
                h["x-stella-reset"]
                    .to_str()
                    .unwrap()
                    .ends_with("T00:00:00Z")
            );
            assert_eq!(h["x-stella-quota-delay-ms"], "0");
            assert!(h.get("x-stella-quota").is_none());
            let body = json(&r);
            assert_eq!(body["quota"], serde_json::json!({"scope": "exempt"}));
            assert_eq!(body["delayMs"], 0);
        }
    }
    let keys = server.keys("quota:*").await;
    assert!(keys.is_empty(), "an exempt scan was counted: {keys:?}");
    let jobs = stream_jobs(&server, "jobs").await;
    assert_eq!(jobs.len(), 200);
    let mut ids: Vec<&str> = jobs.iter().map(|j| j["scanId"].as_str().unwrap()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 200, "one job per scan");
    assert!(
        jobs.iter()
            .all(|j| j["tier"] == "exempt" && j["delayMs"] == 0 && j["count"] == 0)
    );
    assert_eq!(emf_sum(&sink.text(), meter::EXEMPT), 200);

    // The claim on a token signed by another key: not verified, so counted under the IP.
    let forged = mint(
        jsonwebtoken::Algorithm::RS256,
        serde_json::json!({"tid": "t-forged", "iss": "stella-ops.org", "exp": now() + 600, "quota_exempt": true}),
    );
    let body = json(&gate.handle(scan_with_token("203.0.113.51", &forged)).await);
    assert_eq!(body["quota"]["scope"], "ip");
    assert_eq!(body["quota"]["used"], 1);
    assert_eq!(body["token"]["accepted"], false);
    // A claim that is not exactly `true` exempts nobody either.
    let stringly = mint(
        jsonwebtoken::Algorithm::EdDSA,
        serde_json::json!({"tid": "t-str", "iss": "stella-ops.org", "exp": now() + 600, "quota_exempt": "true"}),
    );
    let body = json(
        &gate
            .handle(scan_with_token("203.0.113.52", &stringly))
            .await,
    );
    assert_eq!(body["quota"]["scope"], "tid");
}

/// An exempt scan does not depend on the store: with it down, the scan is
/// still queued and answered 202, its quota headers the whole limit until
/// the period's end, marked `X-Stella-Quota: unavailable` (nothing was read).
#[tokio::test]
async fn exempt_scan_with_the_store_down() {
    let nobody = format!("redis://127.0.0.1:{}", free_port());
    let vars = [
        ("VALKEY_URL", nobody.as_str()),
        ("QUOTA_EXEMPT_NETWORKS", "192.0.2.0/24"),
    ];
    let config = config(&vars);
    let store = ValkeyStore::new(
        quota_gate::io::connection::Valkey::from_config(&config)
            .unwrap()
            .unwrap(),
    );
    let jobs = Capture::default();
    let gate = quota_gate::Gate::new(
        config,
        store,
        quota_gate::io::queue::spool::Spool::new(Box::new(jobs.clone())),
        Meter::new("test", None),
    )
    .unwrap();
    let r = gate.handle(scan_from("192.0.2.17")).await;
    assert_eq!(r.status(), 202, "{:?}", r.body());
    let h = r.headers();
    assert_eq!(h["x-stella-quota"], "unavailable");
    assert_eq!(h["x-stella-quota-remaining"], "33");
    assert_eq!(h["ratelimit-policy"], "\"daily\";q=33;w=86400");
    assert!(
        h["x-stella-reset"]
            .to_str()
            .unwrap()
            .ends_with("T00:00:00Z")
    );
    assert_eq!(json(&r)["quota"]["scope"], "exempt");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        jobs.text().contains("\"tier\":\"exempt\""),
        "{}",
        jobs.text()
    );
}

/// A gate on a store that never answers (nothing listens on its port),
/// failing open, under `vars`.
fn gate_without_a_store(
    vars: &[(&str, &str)],
) -> quota_gate::Gate<ValkeyStore, quota_gate::io::queue::spool::Spool> {
    let nobody = format!("redis://127.0.0.1:{}", free_port());
    let config = config(&with_vars(vars, &[("VALKEY_URL", nobody.as_str())]));
    let store = ValkeyStore::new(
        quota_gate::io::connection::Valkey::from_config(&config)
            .unwrap()
            .unwrap(),
    );
    quota_gate::Gate::new(
        config,
        store,
        quota_gate::io::queue::spool::Spool::new(Box::new(Capture::default())),
        Meter::new("test", None),
    )
    .unwrap()
}

/// Under `QUOTA_RESET=rolling` with the store down, an unmetered 202 and an
/// exempt 202 in the same second report the same reset (now + 24 h, not the
/// next 00:00 UTC): both come from the one period-end rule. `GET /quota` of
/// the exempt caller carries those same quota headers.
#[tokio::test]
async fn one_reset_in_an_outage() {
    // 2026-11-30T10:00:00Z, so the next 00:00 UTC is 14 h away, not 24.
    let at_ms = 1_796_032_800_000;
    let gate = gate_without_a_store(&[
        ("QUOTA_RESET", "rolling"),
        ("QUOTA_EXEMPT_NETWORKS", "192.0.2.0/24"),
    ])
    .with_clock(quota_gate::io::clock::Clock::Tokio {
        wall_ms: at_ms,
        at: tokio::time::Instant::now(),
    });
    let unmetered = gate.handle(scan_from("203.0.113.70")).await;
    let exempt = gate.handle(scan_from("192.0.2.17")).await;
    let exempt_quota = gate
        .handle(quota_gate::gate::GateRequest {
            method: http::Method::GET,
            path: "/quota".into(),
            peer: Some("192.0.2.17".parse().unwrap()),
            ..Default::default()
        })
        .await;
    assert_eq!(
        (unmetered.status().as_u16(), exempt.status().as_u16()),
        (202, 202)
    );
    assert_eq!(exempt_quota.status(), 200, "{:?}", exempt_quota.body());
    assert_eq!(json(&unmetered)["quota"]["unavailable"], true);
    assert_eq!(json(&exempt)["quota"]["scope"], "exempt");
    for r in [&unmetered, &exempt, &exempt_quota] {
        let h = r.headers();
        assert_eq!(h["x-stella-reset"], "2026-12-01T10:00:00Z");
        assert_eq!(h["ratelimit"], "\"daily\";r=33;t=86400");
        assert_eq!(h["ratelimit-policy"], "\"daily\";q=33;w=86400");
        assert_eq!(h["x-stella-quota"], "unavailable");
    }
}

/// An exempt network that covers a trusted proxy exempts only the clients
/// the proxy names in it: a request the proxy forwards with no usable
/// `X-Forwarded-For` (none, `ip:port`, a trailing comma) is counted on the
/// proxy-fallback counter, never exempt.
#[tokio::test]
async fn a_trusted_proxy_is_never_exempt() {
    let server = ValkeyServer::start();
    let gate = proxied_gate(&server, "10.0.0.0/8", "10.0.0.0/24");
    let via_proxy = |xff: Option<&str>| {
        let mut request = scan_from("10.0.0.5");
        request.headers.remove("x-forwarded-for");
        if let Some(v) = xff {
            request
                .headers
                .insert("x-forwarded-for", v.parse().unwrap());
        }
        request
    };
    let body = json(&gate.handle(via_proxy(Some("10.7.7.7"))).await);
    assert_eq!(body["quota"]["scope"], "exempt", "a client in the network");
    for (n, xff) in [None, Some("198.51.100.9:443"), Some("198.51.100.9,")]
        .into_iter()
        .enumerate()
    {
        let body = json(&gate.handle(via_proxy(xff)).await);
        assert_eq!(body["quota"]["scope"], "ip", "{xff:?}");
        assert_eq!(body["quota"]["used"], n + 1, "{xff:?}");
    }
    assert_eq!(
        used_by(&gate, "10.0.0.5").await,
        3,
        "all three on the proxy-fallback counter"
    );
}

/// A gate on `server` with these exempt networks and trusted proxies.
fn proxied_gate(
    server: &ValkeyServer,
    exempt: &'static str,
    trusted: &'static str,
) -> quota_gate::Gate<ValkeyStore, quota_gate::io::queue::stream::StreamQueue> {
    let vars = with_vars(
        &real_delays(),
        &[
            ("QUOTA_EXEMPT_NETWORKS", exempt),
            ("QUOTA_TRUSTED_PROXIES", trusted),
        ],
    );
    valkey_gate(server, &vars)
}

/// The count of the address `ip` in `gate`'s store.
async fn used_by(
    gate: &quota_gate::Gate<ValkeyStore, quota_gate::io::queue::stream::StreamQueue>,
    ip: &str,
) -> u64 {
    let key = QuotaKey::new(
        quota_gate::rules::scope::Scope::Ip,
        &gate.identifier().ip_digest(ip.parse().unwrap()),
    );
    let seen = gate.store().inspect(&key).await.unwrap().unwrap();
    seen.peek.used
}

/// A spoofed `X-Forwarded-For` naming an exempt address exempts nobody;
/// the same header from a trusted proxy does.
#[tokio::test]
async fn forwarded_for_only_through_a_trusted_proxy() {
    let server = ValkeyServer::start();
    let gate = proxied_gate(&server, "192.0.2.0/24", "10.0.0.0/8");
    // A scan from `peer` saying it is forwarded for an exempt address.
    let forwarded = |peer: &str| {
        let mut request = scan_from(peer);
        let exempt = "192.0.2.17".parse().unwrap();
        request.headers.insert("x-forwarded-for", exempt);
        request
    };
    let body = json(&gate.handle(forwarded("203.0.113.60")).await);
    assert_eq!(body["quota"]["scope"], "ip");
    assert_eq!(body["quota"]["used"], 1);
    let body = json(&gate.handle(forwarded("10.1.2.3")).await);
    assert_eq!(body["quota"]["scope"], "exempt");
    assert_eq!(used_by(&gate, "203.0.113.60").await, 1);
}

/// A malformed exempt network stops the start, naming the variable.
#[test]
fn malformed_network_names_the_variable() {
    for bad in ["192.0.2.0/33", "not-a-net", "2001:db8::/129"] {
        let e = quota_gate::Config::from_lookup(|k| {
            (k == "QUOTA_EXEMPT_NETWORKS").then(|| bad.to_owned())
        })
        .unwrap_err();
        assert_eq!(e.var, "QUOTA_EXEMPT_NETWORKS", "{bad}");
    }
    let e = quota_gate::Config::from_lookup(|k| (k == "QUOTA_MODE").then(|| "dry".to_owned()))
        .unwrap_err();
    assert_eq!(e.var, "QUOTA_MODE");
    let out = std::process::Command::new(bin("quota-gate"))
        .arg("serve")
        .env("QUOTA_EXEMPT_NETWORKS", "192.0.2.0/24,192.0.2.300")
        .env("QUOTA_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("QUOTA_EXEMPT_NETWORKS"), "{stderr}");
}

/// The sample events of `GET /quota` and of a shadow-mode scan answer as
/// events/README.md says, through the Lambda adapter.
#[tokio::test]
async fn sample_events_quota_and_shadow() {
    use quota_gate::front::lambda::to_gate_request;
    let server = ValkeyServer::start();
    let gate = valkey_gate(&server, &[]);
    for expected_used in [0, 1] {
        let r = gate
            .handle(to_gate_request(event("http-api-v2-quota.json")))
            .await;
        assert_eq!(r.status(), 200, "{:?}", r.body());
        assert!(r.headers().contains_key("ratelimit"));
        let body = json(&r);
        assert_eq!(body["quota"]["scope"], "ip");
        assert_eq!(body["quota"]["used"], expected_used);
        assert_eq!(
            body["nextScan"],
            serde_json::json!({"tier": "within", "level": "subject", "delayMs": 0})
        );
        // The same address scans once: the next read says 1.
        assert_eq!(
            gate.handle(to_gate_request(event("http-api-v2-ipv4.json")))
                .await
                .status(),
            202
        );
    }
    let shadow = valkey_gate(&server, &[("QUOTA_MODE", "shadow"), ("QUOTA_ANON", "1")]);
    let first = shadow
        .handle(to_gate_request(event("http-api-v2-shadow.json")))
        .await;
    assert_eq!(first.headers()["x-stella-quota-shadow"], "within");
    let second = shadow
        .handle(to_gate_request(event("http-api-v2-shadow.json")))
        .await;
    assert_eq!(second.status(), 202);
    assert_eq!(second.headers()["x-stella-quota-shadow"], "soft");
    let body = json(&second);
    assert_eq!(body["delayMs"], 0);
    assert_eq!(
        body["shadow"],
        serde_json::json!({"tier": "soft", "delayMs": 5000})
    );
}

/// Exempt and shadow-mode jobs validate against docs/job.schema.json and
/// read back as the one job type.
#[tokio::test]
async fn exempt_and_shadow_jobs_match_the_schema() {
    use quota_gate::io::store::memory::MemoryStore;
    let validator = schema::validator(&schema::job_schema());
    let jobs = RecordingQueue::default();
    let vars = with_vars(
        TIERS,
        &[
            ("QUOTA_MODE", "shadow"),
            ("QUOTA_EXEMPT_NETWORKS", "192.0.2.0/24"),
        ],
    );
    let gate = gate(&vars, MemoryStore::default(), jobs.clone());
    for from in ["192.0.2.1", IP, IP, IP, IP, IP, IP] {
        assert_eq!(gate.handle(scan_from(from)).await.status(), 202);
    }
    let written = jobs.json();
    let tiers: Vec<&str> = written
        .iter()
        .map(|j| j["tier"].as_str().unwrap())
        .collect();
    assert_eq!(
        tiers,
        [
            "exempt", "within", "within", "within", "soft", "soft", "hard"
        ]
    );
    schema::assert_valid_jobs(&validator, &written);
}

/// `quota-gate serve` answers `GET /quota` (and `HEAD`), nothing counted.
#[test]
fn serve_answers_get_quota() {
    use common::client::{get_request, http, scan_request};
    use common::serve::spawn_serve;
    let (_serve, addr) = spawn_serve(&[("QUOTA_SERVE_WORKERS", "1")]);
    let body_of = |answer: &str| -> Value {
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap()
    };
    for _ in 0..3 {
        let answer = http(addr, &get_request("/quota"));
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.to_ascii_lowercase().contains("\r\nratelimit: "),
            "{answer}"
        );
        assert_eq!(body_of(&answer)["quota"]["used"], 0);
    }
    assert!(http(addr, &scan_request(None)).starts_with("HTTP/1.1 202"));
    let answer = http(addr, &get_request("/quota"));
    assert_eq!(body_of(&answer)["quota"]["used"], 1);
    let head = http(addr, &get_request("/quota").replacen("GET", "HEAD", 1));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

/// In shadow mode `serve`'s Prometheus counters hold the hits under the
/// shadow names, and the real soft and hard counters stay 0; exempt scans
/// and `GET /quota` answers are counted too.
#[test]
fn shadow_hits_in_prometheus() {
    use common::client::{get_request, http, scan_request};
    use common::serve::spawn_serve;
    let (_serve, addr) = spawn_serve(&[
        ("QUOTA_SERVE_WORKERS", "1"),
        ("QUOTA_MODE", "shadow"),
        ("QUOTA_ANON", "1"),
        ("QUOTA_SOFT_WINDOW", "1"),
    ]);
    for _ in 0..4 {
        assert!(http(addr, &scan_request(None)).starts_with("HTTP/1.1 202"));
    }
    assert!(http(addr, &get_request("/quota")).starts_with("HTTP/1.1 200"));
    let metrics = http(addr, &get_request("/metrics"));
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
    };
    assert_eq!(
        value("stella_quota_shadow_soft_hits_total{scope=\"ip\"}"),
        1.0
    );
    assert_eq!(
        value("stella_quota_shadow_hard_hits_total{scope=\"ip\"}"),
        2.0
    );
    assert_eq!(value("stella_quota_soft_hits_total{scope=\"ip\"}"), 0.0);
    assert_eq!(value("stella_quota_hard_hits_total{scope=\"ip\"}"), 0.0);
    assert_eq!(
        value("stella_quota_requests_within_total{scope=\"ip\"}"),
        4.0
    );
    assert_eq!(value("stella_quota_checks_total{scope=\"ip\"}"), 1.0);
    assert_eq!(value("stella_quota_exempt_total{scope=\"ip\"}"), 0.0);
}
