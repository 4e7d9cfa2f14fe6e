//! The operator commands against a real Valkey (inspect, reset, purge) and a
//! real moto server (stats), through the library and through the binary.

use quota_gate_testkit as common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use aws_sdk_cloudwatch::primitives::DateTime;
use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit};
use common::moto::MotoServer;
use common::*;
use jsonwebtoken::Algorithm;
use quota_gate::Gate;
use quota_gate::front::ops::change;
use quota_gate::front::ops::network;
use quota_gate::front::ops::progress::Progress;
use quota_gate::front::ops::subject::{self, Basis, SubjectArg};
use quota_gate::front::ops::{OpsError, purge, stats, valkey_store};
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::store::valkey::ValkeyStore;
use redis::AsyncCommands;
use serde_json::{Value, json};
use time::OffsetDateTime;

/// The seed's tiers at small limits, and 5 scans a day for a token without
/// a tier claim.
fn ops_tiers() -> Vec<(&'static str, &'static str)> {
    with_vars(TIERS, &[("QUOTA_TOKEN", "5")])
}

/// What the operator commands read for `server`: the gate's configuration.
fn ops_config(server: &ValkeyServer) -> quota_gate::Config {
    let (url, key) = (server.url(), fixture("ed25519.pub.pem"));
    let extra = [("VALKEY_URL", url.as_str()), ("QUOTA_JWT_PUBLIC_KEY", &key)];
    config(&with_vars(&ops_tiers(), &extra))
}

/// The gate on `server` whose keys the operator commands look at.
fn gate_on(server: &ValkeyServer) -> Gate<ValkeyStore, StreamQueue> {
    token_gate(server, &ops_tiers())
}

/// How many of `keys` there are, all of them a level's (`quota:net:`).
fn only_levels(keys: &[String]) -> usize {
    assert!(
        keys.iter().all(|k| k.starts_with("quota:net:{")),
        "{keys:?}"
    );
    keys.len()
}

fn token(tid: &str, extra: Value) -> String {
    let mut claims = json!({"iss": "stella-ops.org", "tid": tid, "exp": now() + 600});
    if let (Some(c), Some(e)) = (claims.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    mint(Algorithm::EdDSA, claims)
}

/// `inspect --ip` shows the count, TTL, first-seen and next tier after N requests, for any spelling of the address.
#[tokio::test]
async fn inspect_ip_after_requests() {
    let server = ValkeyServer::start();
    let gate = gate_on(&server);
    for r in one_at_a_time(&gate, vec![scan_from("203.0.113.7"); 4]).await {
        assert_eq!(r.status(), 202);
    }
    let config = ops_config(&server);
    let store = valkey_store(&config).unwrap();
    for spelling in ["203.0.113.7", "203.0.113.7/32", "::ffff:203.0.113.7"] {
        let s = subject::resolve(&config, &SubjectArg::Ip(spelling.into())).unwrap();
        let i = subject::inspect(&store, &config, &s).await.unwrap();
        assert!(i.exists, "{spelling}");
        assert_eq!((i.count, i.limit, i.remaining), (4, 3, 0), "{spelling}");
        assert_eq!(
            (i.next.count, i.next.tier, i.next.delay_ms),
            (5, "soft", 5000)
        );
        assert!(i.ttl_seconds.is_some_and(|t| t > 0 && t <= 86_400));
        assert!(i.first_seen.as_deref().is_some_and(|f| f.contains('T')));
        assert!(i.reset_at.as_deref().is_some_and(|r| r.ends_with('Z')));
    }
    // One more request lands in the tier inspect predicted.
    let body = json(&gate.handle(scan_from("203.0.113.7")).await);
    assert_eq!(body["delayMs"], 5000);
    // An address never seen: no counter, the full quota ahead.
    let s = subject::resolve(&config, &SubjectArg::Ip("198.51.100.99".into())).unwrap();
    let i = subject::inspect(&store, &config, &s).await.unwrap();
    assert_eq!(
        (i.exists, i.count, i.remaining, i.next.tier),
        (false, 0, 3, "within")
    );
}

/// `inspect --token` finds the tid counter from a verified JWT or a bare tid; an invalid JWT is refused.
#[tokio::test]
async fn inspect_token() {
    let server = ValkeyServer::start();
    let gate = gate_on(&server);
    let t = token("tid-ops-1", json!({"tier": 7}));
    for _ in 0..2 {
        let r = gate.handle(scan_with_token("203.0.113.8", &t)).await;
        assert_eq!(json(&r)["quota"]["scope"], "tid");
    }
    let config = ops_config(&server);
    let store = valkey_store(&config).unwrap();

    let s = subject::resolve(&config, &SubjectArg::Token(format!("Bearer {t}"))).unwrap();
    assert_eq!(s.basis, Basis::VerifiedToken);
    let i = subject::inspect(&store, &config, &s).await.unwrap();
    assert_eq!((i.scope, i.count, i.limit, i.remaining), ("tid", 2, 7, 5));

    let bare = subject::resolve(&config, &SubjectArg::Token("tid-ops-1".into())).unwrap();
    assert_eq!(bare.key, s.key);
    assert_eq!(bare.basis, Basis::BareTid);
    assert_eq!(bare.limit.get(), 5, "a bare tid cannot know the tier claim");

    let expired = mint(
        Algorithm::EdDSA,
        json!({"iss": "stella-ops.org", "tid": "tid-ops-1", "exp": now() - 60}),
    );
    let err = subject::resolve(&config, &SubjectArg::Token(expired)).unwrap_err();
    assert!(matches!(err, OpsError::Usage(_)));
    assert!(err.to_string().contains("expired"), "{err}");
}

/// The handler and `--token` derive the subject through the same function:
/// a scan sent with `Authorization: BEARER <jwt>` (any case of the scheme)
/// counts under the key `--token "BEARER <jwt>"` finds.
#[tokio::test]
async fn token_subject_is_derived_once() {
    let server = ValkeyServer::start();
    let gate = gate_on(&server);
    let t = token("tid-ops-case", json!({}));
    let mut request = scan_from("203.0.113.9");
    request.headers.insert(
        http::header::AUTHORIZATION,
        format!("BEARER {t}").parse().unwrap(),
    );
    assert_eq!(json(&gate.handle(request).await)["quota"]["scope"], "tid");
    let config = ops_config(&server);
    let s = subject::resolve(&config, &SubjectArg::Token(format!("BEARER {t}"))).unwrap();
    let i = subject::inspect(&valkey_store(&config).unwrap(), &config, &s)
        .await
        .unwrap();
    assert_eq!((i.scope, i.count), ("tid", 1));
}

/// `reset` removes the counter and first-seen key; the next request counts 1.
#[tokio::test]
async fn reset_then_next_counts_one() {
    let server = ValkeyServer::start();
    let gate = gate_on(&server);
    one_at_a_time(&gate, vec![scan_from("2001:db8:5:6::1"); 6]).await;
    let config = ops_config(&server);
    let store = valkey_store(&config).unwrap();
    // Another host in the same /64 names the same client.
    let s = subject::resolve(&config, &SubjectArg::Ip("2001:db8:5:6::beef".into())).unwrap();
    let removal = change::reset(&store, &s).await.unwrap();
    assert_eq!(removal.removed, 2);
    assert!(removal.render().contains(&s.key.counter));
    let mut c = server.client().await;
    let left: Vec<String> = c.keys("quota:*").await.unwrap();
    assert_eq!(
        only_levels(&left),
        2,
        "its /56 and /48 keep their counts: {left:?}"
    );
    // Its /56 (limit 6) is still over: the next scan is its 7th.
    let body = json(&gate.handle(scan_from("2001:db8:5:6::1")).await);
    assert_eq!(body["quota"]["used"], 1);
    assert_eq!(body["delayMs"], 5000);
    let removal = network::reset(&config, "2001:db8:5::/56").await.unwrap();
    assert_eq!(removal.removed, 1, "the /56's counter");
    let body = json(&gate.handle(scan_from("2001:db8:5:6::1")).await);
    assert_eq!(
        (body["quota"]["used"].as_u64(), body["delayMs"].as_u64()),
        (Some(2), Some(0))
    );
    assert_eq!(change::reset(&store, &s).await.unwrap().removed, 2);
    assert_eq!(change::reset(&store, &s).await.unwrap().removed, 0);
}

/// With pacing on, `inspect` shows the paced backlog, and `reset` clears the
/// slot and the idempotency records along with the counter.
#[tokio::test]
async fn inspect_shows_backlog_and_reset_clears_it() {
    let server = ValkeyServer::start();
    let gate = token_gate(&server, &with_vars(&ops_tiers(), &[("QUOTA_PACING", "on")]));
    let mut keyed = scan_from("198.51.100.60");
    keyed
        .headers
        .insert("idempotency-key", "ops-1".parse().unwrap());
    let scans = vec![scan_from("198.51.100.60"); 5];
    one_at_a_time(&gate, std::iter::once(keyed).chain(scans)).await;
    let config = ops_config(&server);
    let store = valkey_store(&config).unwrap();
    let s = subject::resolve(&config, &SubjectArg::Ip("198.51.100.60".into())).unwrap();
    let i = subject::inspect(&store, &config, &s).await.unwrap();
    // Scans 4, 5 (soft, 5 s) and 6 (hard, 60 s) sent at once: the line ends ~70 s out.
    assert!(i.backlog_ms > 60_000, "{i:?}");
    assert!(i.next_free_slot.is_some());
    assert!(i.render().contains("next slot"), "{}", i.render());
    let removal = change::reset(&store, &s).await.unwrap();
    assert_eq!(removal.removed, 4, "counter, first-seen, slot, one record");
    let mut c = server.client().await;
    let left: Vec<String> = c.keys("quota:*").await.unwrap();
    assert_eq!(only_levels(&left), 1, "its /24 keeps its count: {left:?}");
    let i = subject::inspect(&store, &config, &s).await.unwrap();
    assert_eq!((i.exists, i.backlog_ms), (false, 0));
}

/// `purge` removes every quota:* key in batches, reports progress, and leaves other keys alone; a dry run removes nothing.
#[tokio::test]
async fn purge_only_quota_keys() {
    let server = ValkeyServer::start();
    let gate = gate_on(&server);
    for ip in ["203.0.113.1", "203.0.113.2", "2001:db8::1"] {
        gate.handle(scan_from(ip)).await;
    }
    let mut c = server.client().await;
    // Enough keys for several SCAN/UNLINK batches.
    let mut pipe = redis::pipe();
    for i in 0..1_500 {
        pipe.set(format!("quota:ip:{{seeded{i}}}"), 1).ignore();
    }
    let others = [
        "jobs-other",
        "quota",
        "quotas:1",
        "xquota:ip:1",
        "QUOTA:ip:1",
        "session:42",
    ];
    for k in others {
        pipe.set(k, "keep").ignore();
    }
    let _: () = pipe.query_async(&mut c).await.unwrap();
    // Each subject's counter and first-seen key; one /24, and a /56 and /48.
    let quota_keys = 1_500 + 3 * 2 + 3;

    let config = ops_config(&server);
    let dry = purge::purge(valkey_store(&config).unwrap(), true, None)
        .await
        .unwrap();
    assert!(dry.dry_run);
    assert!(
        dry.keys >= quota_keys,
        "a dry run counts at least every key: {}",
        dry.keys
    );
    let left: Vec<String> = c.keys("quota:*").await.unwrap();
    assert_eq!(left.len() as u64, quota_keys);

    let sink = Box::new(std::io::sink());
    let progress = Progress::new("removed", sink, false, Duration::ZERO);
    let store = valkey_store(&config).unwrap();
    let report = purge::purge(store, false, Some(progress.clone()))
        .await
        .unwrap();
    assert_eq!(report.keys, quota_keys);
    assert_eq!(progress.done(), quota_keys);
    let left: Vec<String> = c.keys("quota:*").await.unwrap();
    assert!(left.is_empty(), "{} quota keys left", left.len());
    for k in others {
        let v: Option<String> = c.get(k).await.unwrap();
        assert_eq!(v.as_deref(), Some("keep"), "{k} must survive");
    }
    // The stream queue the gate wrote to survives too.
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 3);
}

/// Off a terminal, each progress report is a plain line with the running total.
#[test]
fn progress_in_a_log() {
    let out = Capture::default();
    let p = Progress::new("removed", Box::new(out.clone()), false, Duration::ZERO);
    p.add(500);
    p.add(250);
    p.finish();
    let text = out.text();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    assert!(lines[1].starts_with("removed 750 quota keys"), "{text:?}");
    assert_eq!(p.done(), 750);
}

/// Within the interval nothing is written; the count still adds up.
#[test]
fn progress_is_throttled() {
    let out = Capture::default();
    let p = Progress::new(
        "removed",
        Box::new(out.clone()),
        true,
        Duration::from_secs(3600),
    );
    for _ in 0..10 {
        p.add(10);
    }
    p.finish();
    assert_eq!(out.text(), "");
    assert_eq!(p.done(), 100);
}

/// What the binary tests run it with: the store at `url` (first, so
/// `&env[1..]` leaves it out), the tests' hash key, 3 scans a day, a soft
/// window of 2.
fn binary_env(url: &str) -> [(&str, &str); 4] {
    [
        ("VALKEY_URL", url),
        ("QUOTA_HASH_SECRET", std::str::from_utf8(SECRET).unwrap()),
        ("QUOTA_ANON", "3"),
        ("QUOTA_SOFT_WINDOW", "2"),
    ]
}

/// Runs the real binary with only `env` set and stdin closed (not a terminal).
fn quota_gate(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quota-gate"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The binary: inspect --json, reset, purge refused without --yes off a terminal, purge --yes, and a clear error without VALKEY_URL.
#[tokio::test]
async fn binary_end_to_end() {
    let server = ValkeyServer::start();
    let gate = gate_on(&server);
    one_at_a_time(&gate, vec![scan_from("192.0.2.10"); 2]).await;
    let url = server.url();
    let env = binary_env(&url);

    let out = quota_gate(&["inspect", "--ip", "192.0.2.10", "--json"], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["count"], 2);
    assert_eq!(report["remaining"], 1);
    assert_eq!(report["next"]["tier"], "within");
    assert!(report["key"].as_str().unwrap().starts_with("quota:ip:{"));
    // Neither output names the address.
    let text = quota_gate(&["inspect", "--ip", "192.0.2.10"], &env);
    assert!(text.status.success());
    for stream in [&out.stdout, &out.stderr, &text.stdout, &text.stderr] {
        assert!(!String::from_utf8_lossy(stream).contains("192.0.2.10"));
    }
    assert!(String::from_utf8_lossy(&text.stdout).contains("next        scan 3: within"));

    let refused = quota_gate(&["purge"], &env);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes"));
    let mut c = server.client().await;
    let left: Vec<String> = c.keys("quota:*").await.unwrap();
    assert_eq!(left.len(), 3, "a refused purge touches nothing");

    let dry = quota_gate(&["purge", "--dry-run", "--json"], &env);
    assert!(dry.status.success());
    let dry: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(dry["keys"], 3);

    let reset = quota_gate(&["reset", "--ip", "192.0.2.10/32"], &env);
    assert!(reset.status.success());
    assert!(String::from_utf8_lossy(&reset.stdout).starts_with("removed 2 keys"));
    gate.handle(scan_from("192.0.2.10")).await;
    let done = quota_gate(&["purge", "--yes"], &env);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(String::from_utf8_lossy(&done.stdout).starts_with("removed 3 quota:* keys"));
    let left: Vec<String> = c.keys("quota:*").await.unwrap();
    assert!(left.is_empty());

    // The dev secret is used, and said so, when QUOTA_HASH_SECRET is unset.
    let dev = quota_gate(&["inspect", "--ip", "192.0.2.10"], &env[..1]);
    assert!(dev.status.success());
    assert!(String::from_utf8_lossy(&dev.stderr).contains("QUOTA_HASH_SECRET"));

    let no_url = quota_gate(&["inspect", "--ip", "192.0.2.10"], &env[1..]);
    assert!(!no_url.status.success());
    let err = String::from_utf8_lossy(&no_url.stderr);
    assert!(err.contains("VALKEY_URL") && err.contains("serve"), "{err}");
    let bad = quota_gate(&["inspect", "--ip", "not-an-ip"], &env);
    assert!(!bad.status.success());
    let both = quota_gate(&["inspect", "--ip", "192.0.2.10", "--token", "t"], &env);
    assert!(
        !both.status.success(),
        "--ip and --token exclude each other"
    );
}

/// An exempt network that covers a trusted proxy is warned of at the start
/// (here of `inspect`; `serve` and Lambda build the same identifier).
#[test]
fn exempt_network_over_a_trusted_proxy_is_warned_of() {
    let server = ValkeyServer::start();
    let url = server.url();
    let secret = std::str::from_utf8(SECRET).unwrap();
    // Whether the start warns with these exempt networks.
    let warns = |exempt: &str| {
        let env = [
            ("VALKEY_URL", url.as_str()),
            ("QUOTA_HASH_SECRET", secret),
            ("QUOTA_TRUSTED_PROXIES", "10.0.0.0/24"),
            ("QUOTA_EXEMPT_NETWORKS", exempt),
        ];
        let out = quota_gate(&["inspect", "--ip", "192.0.2.10"], &env);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).contains("covers a trusted proxy")
    };
    assert!(!warns("192.0.2.0/24"), "no overlap, no warning");
    assert!(warns("10.0.0.0/8"), "the overlap is warned of");
}

/// `stats` reads back the sums moto holds after a PutMetricData of known values, per scope.
#[tokio::test]
async fn stats_from_cloudwatch() {
    let moto = MotoServer::start();
    let sdk = moto.sdk_config().await;
    let cw = aws_sdk_cloudwatch::Client::new(&sdk);
    let ns = "StellaOps/QuotaTest";
    let at = DateTime::from_secs(now() - 300);
    let datum = |name: &str, scope: &str, values: &[f64], unit: StandardUnit| {
        MetricDatum::builder()
            .metric_name(name)
            .dimensions(Dimension::builder().name("Scope").value(scope).build())
            .set_values(Some(values.to_vec()))
            .unit(unit)
            .timestamp(at)
            .build()
    };
    let data = vec![
        datum(
            "stella_quota_soft_hits_total",
            "ip",
            &[1.0, 1.0, 1.0, 0.0],
            StandardUnit::Count,
        ),
        datum(
            "stella_quota_hard_hits_total",
            "ip",
            &[1.0, 1.0],
            StandardUnit::Count,
        ),
        datum(
            "stella_quota_reminders_total",
            "tid",
            &[1.0, 1.0, 1.0, 1.0, 1.0],
            StandardUnit::Count,
        ),
        datum(
            "stella_quota_store_errors_total",
            "ip",
            &[1.0],
            StandardUnit::Count,
        ),
        datum(
            "stella_quota_delay_ms",
            "ip",
            &[0.0, 5000.0, 5000.0, 60000.0],
            StandardUnit::Milliseconds,
        ),
        datum(
            "stella_quota_delay_ms",
            "tid",
            &[0.0, 0.0],
            StandardUnit::Milliseconds,
        ),
    ];
    cw.put_metric_data()
        .namespace(ns)
        .set_metric_data(Some(data))
        .send()
        .await
        .unwrap();

    let end = OffsetDateTime::now_utc() + Duration::from_secs(60);
    let s = stats::stats(&cw, ns, Duration::from_secs(3_600), end)
        .await
        .unwrap();
    let ip = &s.scopes[0];
    let tid = &s.scopes[1];
    assert_eq!((ip.scope, tid.scope), ("ip", "tid"));
    assert_eq!(
        (
            ip.scans,
            ip.soft_hits,
            ip.hard_hits,
            ip.reminders,
            ip.store_errors,
            ip.enqueue_errors
        ),
        (4, 3, 2, 0, 1, 0)
    );
    assert_eq!((tid.scans, tid.soft_hits, tid.reminders), (2, 0, 5));
    // moto computes no extended statistics (p95): the figure is absent, not invented.
    // Against CloudWatch it is the p95 of the delay samples.
    assert_eq!(ip.p95_delay_ms, None);
    assert!(s.p95_error.is_some());
    let table = s.render();
    assert!(
        table.contains("soft hits") && table.contains("p95 delay"),
        "{table}"
    );
}

/// On a 3-primary cluster: inspect and reset find a client's keys, and purge empties every primary of quota:* keys only.
#[tokio::test]
async fn cluster_inspect_reset_purge() {
    let cluster = common::cluster::ValkeyCluster::start();
    let gate = common::cluster::cluster_gate(&cluster, &ops_tiers());
    let subjects = (1..=30).map(|i| scan_from(&format!("198.51.100.{i}")));
    let again = vec![scan_from("198.51.100.1"); 3];
    one_at_a_time(&gate, subjects.chain(again)).await;
    assert_eq!(
        cluster.nodes_holding("quota:*"),
        3,
        "keys spread over every primary"
    );
    let mut c = cluster.client().await;
    let others = ["session:{a}", "session:{b}", "session:{c}", "quota"];
    for k in others {
        let _: () = c.set(k, "keep").await.unwrap();
    }

    let url = cluster.url();
    let cluster_vars = [("VALKEY_URL", url.as_str()), ("VALKEY_CLUSTER", "true")];
    let config = config(&with_vars(&ops_tiers(), &cluster_vars));
    let store = valkey_store(&config).unwrap();
    let s = subject::resolve(&config, &SubjectArg::Ip("198.51.100.1".into())).unwrap();
    let i = subject::inspect(&store, &config, &s).await.unwrap();
    assert_eq!((i.count, i.next.tier), (4, "soft"));
    let other = subject::resolve(&config, &SubjectArg::Ip("198.51.100.2".into())).unwrap();
    assert_eq!(change::reset(&store, &other).await.unwrap().removed, 2);
    let body = json(&gate.handle(scan_from("198.51.100.2")).await);
    assert_eq!(body["quota"]["used"], 1);

    let quota_keys = cluster.keys("quota:*").len() as u64;
    // 30 subjects' counter and first-seen key, and their one /24.
    assert_eq!(quota_keys, 61);
    let progress = Progress::new("removed", Box::new(std::io::sink()), false, Duration::ZERO);
    let report = purge::purge(store, false, Some(progress.clone()))
        .await
        .unwrap();
    assert_eq!((report.keys, progress.done()), (quota_keys, quota_keys));
    assert!(cluster.keys("quota:*").is_empty());
    for k in others {
        let v: Option<String> = c.get(k).await.unwrap();
        assert_eq!(v.as_deref(), Some("keep"), "{k} must survive");
    }
}

/// `inspect --ip` shows each level of the address; `inspect|grant|reset --network` act on one level, found by any address of the network; a network's grant always expires (with its counter, or at the period's end before the first scan).
#[tokio::test]
async fn network_levels() {
    let server = ValkeyServer::start();
    let gate = gate_on(&server);
    let scans = [
        vec![scan_from("203.0.113.7"); 4],
        vec![scan_from("203.0.113.8"); 2],
    ];
    one_at_a_time(&gate, scans.concat()).await;
    let config = ops_config(&server);
    let store = valkey_store(&config).unwrap();
    let s = subject::resolve(&config, &SubjectArg::Ip("203.0.113.7".into())).unwrap();
    let mut i = subject::inspect(&store, &config, &s).await.unwrap();
    let levels = network::of_ip(&config, "203.0.113.7").unwrap();
    i.levels = network::inspect(&store, &config, &levels).await.unwrap();
    // QUOTA_ANON=3, so the default v4/24=8x is 24; both addresses count there.
    let l = &i.levels[..];
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(
        (l[0].level.as_str(), l[0].used, l[0].limit, l[0].remaining),
        ("v4/24", 6, 24, 18)
    );
    assert!(
        l[0].reset_at
            .as_deref()
            .is_some_and(|r| r.ends_with("T00:00:00Z"))
    );
    assert!(
        i.render()
            .contains("level       v4/24: used 6 of 24, remaining 18"),
        "{}",
        i.render()
    );

    let n = network::inspect_network(&config, "203.0.113.200/24")
        .await
        .unwrap();
    assert_eq!((n.used, n.key.as_str()), (6, l[0].key.as_str()));
    // A grant with a counter expires with it.
    let g = network::grant(&config, "203.0.113.0/24", 10).await.unwrap();
    assert_eq!(g.expires_at, l[0].reset_at);
    let n = network::inspect_network(&config, "203.0.113.0/24")
        .await
        .unwrap();
    assert_eq!(
        (n.limit, n.base_limit, n.grant, n.remaining),
        (34, 24, 10, 28)
    );
    assert_eq!(n.grant_expires_at, l[0].reset_at);
    // Before the network's first scan: the end of a period opened now.
    let fresh = network::grant(&config, "198.51.100.0/24", 5).await.unwrap();
    assert!(
        fresh
            .expires_at
            .as_deref()
            .is_some_and(|at| at.ends_with("T00:00:00Z"))
    );
    let mut c = server.client().await;
    let grant_key = format!(
        "{}:grant",
        network::resolve(&config, "198.51.100.0/24")
            .unwrap()
            .key
            .counter
    );
    let ttl: i64 = c.ttl(&grant_key).await.unwrap();
    assert!(
        ttl > 0 && ttl <= 86_400,
        "a network grant always expires: {ttl}"
    );
    let revoked = network::grant(&config, "198.51.100.0/24", 0).await.unwrap();
    assert_eq!(revoked.revoked, Some(true));
    // Reset removes the level's keys and nothing of its subjects.
    let removal = network::reset(&config, "203.0.113.0/24").await.unwrap();
    assert_eq!(removal.removed, 2, "counter and grant");
    assert!(network::render_removal(&removal).contains("counter, pacing slot, grant"));
    assert_eq!(
        subject::inspect(&store, &config, &s).await.unwrap().count,
        4
    );
    let n = network::inspect_network(&config, "203.0.113.0/24")
        .await
        .unwrap();
    assert_eq!((n.exists, n.used, n.limit), (false, 0, 24));
    // A length that is not configured names the configured levels.
    let e = network::resolve(&config, "203.0.113.0/16").unwrap_err();
    assert!(matches!(e, OpsError::BadInput(_)), "{e}");
    assert!(e.to_string().contains("v4/24, v6/56, v6/48"), "{e}");
}

/// The binary: `inspect --ip --json` lists the levels, `grant --network` prints its expiry, and a `--network` of another length exits 2 naming the configured levels.
#[tokio::test]
async fn binary_network() {
    let server = ValkeyServer::start();
    let gate = gate_on(&server);
    one_at_a_time(&gate, vec![scan_from("2001:db8:7:1::1"); 2]).await;
    let url = server.url();
    let env = binary_env(&url);
    let out = quota_gate(&["inspect", "--ip", "2001:db8:7:1::1", "--json"], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let levels: Vec<(&str, u64)> = report["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["level"].as_str().unwrap(), l["used"].as_u64().unwrap()))
        .collect();
    assert_eq!(levels, [("v6/56", 2), ("v6/48", 2)]);
    let granted = quota_gate(
        &[
            "grant",
            "--network",
            "2001:db8:7::/48",
            "--scans",
            "5",
            "--json",
        ],
        &env,
    );
    assert!(
        granted.status.success(),
        "{}",
        String::from_utf8_lossy(&granted.stderr)
    );
    let granted: Value = serde_json::from_slice(&granted.stdout).unwrap();
    assert!(
        granted["expiresAt"]
            .as_str()
            .is_some_and(|at| at.ends_with('Z')),
        "{granted}"
    );
    let bad = quota_gate(&["inspect", "--network", "2001:db8:7::/64"], &env);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("/64 is not a configured level") && err.contains("v6/56, v6/48"),
        "{err}"
    );
    let not_cidr = quota_gate(&["reset", "--network", "nope"], &env);
    assert_eq!(not_cidr.status.code(), Some(2));
    for out in [&out, &bad] {
        assert!(!String::from_utf8_lossy(&out.stdout).contains("2001:db8:7:1"));
    }
}

/// A refusal remembered by two gates (two Lambda environments) does not
/// outlive an operator's `reset` or `grant`: the gate that reads
/// `GET /quota` accepts the next scan at once (it never says "within"
/// while it would refuse), the other within a second and a bit. With an
/// hour's hard delay, the refusal's own `Retry-After` is an hour.
#[tokio::test]
async fn refusals_do_not_outlive_the_operator() {
    let server = ValkeyServer::start();
    let vars = [
        ("QUOTA_ANON", "1"),
        ("QUOTA_NETWORKS", "off"),
        ("QUOTA_SOFT_WINDOW", "0"),
        ("QUOTA_HARD_DELAY_MS", "3600000"),
        ("QUOTA_MAX_BACKLOG_MS", "3600000"),
        ("QUOTA_DELAY_MODE", "defer"),
    ];
    let url = server.url();
    let config = config(&with_vars(&vars, &[("VALKEY_URL", url.as_str())]));
    let store = valkey_store(&config).unwrap();
    let (a, b) = (valkey_gate(&server, &vars), valkey_gate(&server, &vars));
    let ip = "198.51.100.70";
    let who = subject::resolve(&config, &SubjectArg::Ip(ip.into())).unwrap();
    for round in ["reset", "grant"] {
        // Within, an hour out, then refused: both gates remember it.
        for gate in [&a, &a, &a, &b] {
            gate.handle(scan_from(ip)).await;
        }
        // An hour, or what is left of the UTC day when that is less.
        let to_reset = 86_400 - now() as u64 % 86_400;
        let hour = 3_600.min(to_reset);
        for gate in [&a, &b] {
            let refused = gate.handle(scan_from(ip)).await;
            assert_eq!(refused.status(), 503, "round {round}");
            let after = retry_after(&refused);
            assert!(after + 60 >= hour, "round {round}: {after} s, not {hour}");
        }
        if round == "reset" {
            change::reset(&store, &who).await.unwrap();
        } else {
            change::grant(&store, &who, 5, config.policy.reset)
                .await
                .unwrap();
        }
        let quota = json(&a.handle(quota_from(ip)).await);
        assert_eq!(
            quota["nextScan"]["tier"], "within",
            "round {round}: {quota}"
        );
        let scan = a.handle(scan_from(ip)).await;
        assert_eq!(scan.status(), 202, "round {round}: GET /quota said within");
        let since = std::time::Instant::now();
        let accepted = loop {
            let scan = b.handle(scan_from(ip)).await;
            if scan.status() == 202 {
                break since.elapsed();
            }
            assert!(since.elapsed() < Duration::from_secs(3), "round {round}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            accepted < Duration::from_millis(1_500),
            "round {round}: {accepted:?}"
        );
        change::reset(&store, &who).await.unwrap();
    }
}
