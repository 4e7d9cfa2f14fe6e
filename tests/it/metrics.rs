//! Prometheus `/metrics` on the real local HTTP server: counters equal what a
//! scripted run sent, the delay histogram supports `histogram_quantile`, and
//! every alert rule in `prometheus/alerts.yaml` names an exposed series.
//!
//! The process's metrics recorder would be shared with every other test in this binary (their
//! gates record too), so no test here installs it: each records into a Prometheus recorder of its
//! own ([`local_recorder`]), set as the default on its current-thread runtime. The scripted traffic
//! runs once ([`scripted_run`]); the tests that read it read that one snapshot.

use quota_gate_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

use common::client::{Connection, build, get_request, scan_request};
use common::*;
use jsonwebtoken::Algorithm;
use quota_gate::gate::Gate;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::spool::Spool;
use quota_gate::io::store::memory::MemoryStore;
use serde_json::json;
use tokio::net::TcpListener;

const ANON_SCANS: u64 = 8;
const TOKEN_SCANS: u64 = 2;

/// Sends the scripted traffic through `quota_gate::front::serve::serve` once and
/// returns what `GET /metrics` said afterwards.
fn scripted_run() -> &'static str {
    &scrapes()[0]
}

/// A Prometheus recorder of the caller's own, with the gate's buckets and descriptions (what
/// `quota-gate serve` installs process-wide).
fn local_recorder() -> metrics_exporter_prometheus::PrometheusRecorder {
    use quota_gate::io::meter::{describe, describe_store};
    let recorder = quota_gate::front::cli::prometheus_builder()
        .unwrap()
        .build_recorder();
    metrics::with_local_recorder(&recorder, || {
        describe();
        describe_store();
    });
    recorder
}

/// The scripted traffic, then two scrapes of `GET /metrics`.
fn scrapes() -> &'static [String; 2] {
    static TEXT: OnceLock<[String; 2]> = OnceLock::new();
    TEXT.get_or_init(|| {
        let recorder = local_recorder();
        let _local = metrics::set_default_local_recorder(&recorder);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let handle = recorder.handle();
            // The seed's tiers (3 within, 2 soft, then hard); reminders from the 5th.
            let key = fixture("ed25519.pub.pem");
            let extra = [("QUOTA_WARN_AT", "5"), ("QUOTA_JWT_PUBLIC_KEY", &key)];
            let gate = Gate::new(
                config(&with_vars(TIERS, &extra)),
                MemoryStore::default(),
                Spool::new(Box::new(std::io::sink())),
                Meter::new("test", None),
            )
            .unwrap();
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(quota_gate::front::serve::serve(
                listener,
                Arc::new(gate),
                Some(handle),
                async {
                    let _ = stopped.await;
                },
            ));
            let mut client = Connection::open(addr).await.unwrap();
            let mut send =
                async |request: String| client.exchange(request.as_bytes()).await.unwrap();
            for _ in 0..ANON_SCANS {
                assert_eq!(send(scan_request(None)).await.0, 202);
            }
            let token = mint(
                Algorithm::EdDSA,
                json!({"iss": "stella-ops.org", "tid": "t-metrics", "exp": now() + 600}),
            );
            for _ in 0..TOKEN_SCANS {
                assert_eq!(send(scan_request(Some(&token))).await.0, 202);
            }
            // Refused requests are not counted, so they must not move any metric.
            let empty_image = build(
                "POST",
                "/scan",
                &[("Content-Type", "application/json")],
                r#"{"image":""}"#,
            );
            assert_eq!(send(empty_image).await.0, 400);
            let (status, first) = send(get_request("/metrics")).await;
            assert_eq!(status, 200);
            let (_, second) = send(get_request("/metrics")).await;
            drop(client);
            let _ = stop.send(());
            server.await.unwrap().unwrap();
            [first, second]
        })
    })
}

/// Every sample line of the exposition: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

/// Series names (without labels) present in the exposition.
fn series_names(text: &str) -> BTreeSet<String> {
    samples(text)
        .keys()
        .map(|s| s.split('{').next().unwrap().to_owned())
        .collect()
}

fn value(text: &str, series: &str) -> f64 {
    *samples(text)
        .get(series)
        .unwrap_or_else(|| panic!("{series} missing from /metrics:\n{text}"))
}

/// Prometheus's `histogram_quantile` over one series' cumulative buckets.
fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    let total = buckets.last().unwrap().1;
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            return prev.0 + (le - prev.0) * (rank - prev.1) / (count - prev.1);
        }
        prev = (le, count);
    }
    f64::NAN
}

/// The `le`-sorted cumulative buckets of `stella_quota_delay_ms` for `scope`.
fn delay_buckets(text: &str, scope: &str) -> Vec<(f64, f64)> {
    let prefix = format!("stella_quota_delay_ms_bucket{{scope=\"{scope}\",le=\"");
    let mut buckets: Vec<(f64, f64)> = samples(text)
        .iter()
        .filter_map(|(series, v)| {
            let le = series.strip_prefix(&prefix)?.strip_suffix("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, *v))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// The counters equal what was sent: 2 soft, 3 hard, 4 reminders, no errors, per scope.
#[test]
fn counters_equal_what_was_sent() {
    let text = scripted_run();
    let ip = |name: &str| value(text, &format!("{name}{{scope=\"ip\"}}"));
    let tid = |name: &str| value(text, &format!("{name}{{scope=\"tid\"}}"));
    assert_eq!(ip("stella_quota_soft_hits_total"), 2.0);
    assert_eq!(ip("stella_quota_hard_hits_total"), 3.0);
    assert_eq!(ip("stella_quota_reminders_total"), 4.0);
    assert_eq!(ip("stella_quota_store_errors_total"), 0.0);
    assert_eq!(ip("stella_quota_enqueue_errors_total"), 0.0);
    assert_eq!(ip("stella_quota_delay_ms_count"), ANON_SCANS as f64);
    assert_eq!(
        ip("stella_quota_delay_ms_sum"),
        2.0 * 5_000.0 + 3.0 * 60_000.0
    );
    assert_eq!(tid("stella_quota_soft_hits_total"), 0.0);
    assert_eq!(tid("stella_quota_delay_ms_count"), TOKEN_SCANS as f64);
}

/// Requests by outcome are one counter per outcome, labelled `scope` only: 3 within, 2 soft, 3 hard anonymous; 2 within by token; every other outcome exposed at 0.
#[test]
fn requests_by_outcome() {
    use quota_gate::io::meter::{Outcome, REQUESTS};
    let text = scripted_run();
    assert_eq!(REQUESTS.len(), Outcome::ALL.len());
    for outcome in Outcome::ALL {
        let name = outcome.requests_metric();
        assert!(REQUESTS.contains(&name), "{name}");
        assert_counter_with_help(text, name);
        let expected = |scope: &str| match (outcome, scope) {
            (Outcome::Within, "ip") => 3.0,
            (Outcome::Soft, "ip") => 2.0,
            (Outcome::Hard, "ip") => 3.0,
            (Outcome::Within, "tid") => TOKEN_SCANS as f64,
            _ => 0.0,
        };
        for scope in ["ip", "tid"] {
            let series = format!("{name}{{scope=\"{scope}\"}}");
            assert_eq!(value(text, &series), expected(scope), "{series}");
        }
    }
    for series in samples(text).keys() {
        if series.starts_with("stella_quota_requests_") {
            assert!(
                !series.contains(',') && series.contains("{scope=\""),
                "scope is the only label: {series}"
            );
        }
    }
}

/// `name` is typed a counter and has a help line in `text`.
fn assert_counter_with_help(text: &str, name: &str) {
    assert!(
        text.contains(&format!("# TYPE {name} counter")),
        "{name}:\n{text}"
    );
    assert!(
        text.contains(&format!("# HELP {name} ")),
        "{name} has no help"
    );
}

/// The exported names are exactly the seed's: no suffix added or dropped, counters typed as counters.
#[test]
fn names_are_the_seeds() {
    let text = scripted_run();
    for name in [
        "stella_quota_soft_hits_total",
        "stella_quota_hard_hits_total",
        "stella_quota_reminders_total",
        "stella_quota_store_errors_total",
        "stella_quota_enqueue_errors_total",
    ] {
        assert_counter_with_help(text, name);
    }
    assert!(
        text.contains("# TYPE stella_quota_delay_ms histogram"),
        "{text}"
    );
    // Besides the gate's own, only the process gauges sampled at each scrape,
    // under the names of Prometheus's process collector.
    let process = [
        quota_gate::io::meter::PROCESS_RSS,
        quota_gate::io::meter::PROCESS_OPEN_FDS,
    ];
    for name in series_names(text) {
        assert!(
            name.starts_with("stella_quota_") || process.contains(&name.as_str()),
            "unexpected series {name}"
        );
        assert!(!name.contains("_total_total"), "{name}");
    }
}

/// The delay histogram has a bucket at the 1 s alert threshold, and `histogram_quantile(0.95, …)` lands in the right bucket.
#[test]
fn delay_histogram_supports_p95() {
    let text = scripted_run();
    let ip = delay_buckets(text, "ip");
    let bounds: Vec<f64> = ip.iter().map(|b| b.0).collect();
    for b in quota_gate::front::cli::DELAY_BUCKETS_MS {
        assert!(bounds.contains(&b), "bucket {b} missing: {bounds:?}");
    }
    let at = |le: f64| ip.iter().find(|b| b.0 == le).unwrap().1;
    assert_eq!(at(1_000.0), 3.0, "3 undelayed scans");
    assert_eq!(at(5_000.0), 5.0, "+2 soft");
    assert_eq!(at(60_000.0), 8.0, "+3 hard");
    assert_eq!(at(f64::INFINITY), 8.0);
    // 0.95 × 8 = 7.6 falls among the hard delays: (30 s, 60 s].
    let p95 = histogram_quantile(0.95, &ip);
    assert!(p95 > 30_000.0 && p95 <= 60_000.0, "p95 {p95}");
    // Token scans were all within quota: p95 below the 1 s alert threshold.
    let tid = histogram_quantile(0.95, &delay_buckets(text, "tid"));
    assert!(tid < 1_000.0, "tid p95 {tid}");
}

/// The metric names each alert rule's expression uses, from `prometheus/alerts.yaml`.
fn alert_metrics() -> BTreeMap<String, BTreeSet<String>> {
    let rules = std::fs::read_to_string(root().join("prometheus/alerts.yaml")).unwrap();
    let mut out = BTreeMap::new();
    let mut alert = None;
    for line in rules.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix("- alert:") {
            alert = Some(name.trim().to_owned());
        } else if let Some(expr) = line.strip_prefix("expr:") {
            let metrics: BTreeSet<String> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("stella_"))
                .map(str::to_owned)
                .collect();
            let name = alert.take().expect("expr: follows its - alert: line");
            out.insert(name, metrics);
        }
    }
    out
}

/// Each alert rule names only series the server really exposes, and the three seed rules are there.
#[test]
fn alert_rules_use_exposed_series() {
    let exposed = series_names(scripted_run());
    // The consumer's rules are tests/it/consume.rs's to check.
    let alerts: BTreeMap<_, _> = alert_metrics()
        .into_iter()
        .filter(|(_, metrics)| !metrics.iter().any(|m| m.starts_with("stella_consumer_")))
        .collect();
    assert_eq!(
        alerts.len(),
        5,
        "the seed's three, backlog refusals and global pacing: {alerts:?}"
    );
    let mut used = BTreeSet::new();
    for (alert, metrics) in &alerts {
        assert!(!metrics.is_empty(), "{alert} names no metric");
        for m in metrics {
            assert!(
                exposed.contains(m),
                "{alert}: {m} is not exposed; have {exposed:?}"
            );
            used.insert(m.as_str());
        }
    }
    for seed in [
        "stella_quota_soft_hits_total",
        "stella_quota_hard_hits_total",
        "stella_quota_delay_ms_bucket",
    ] {
        assert!(used.contains(seed), "no rule on {seed}");
    }
}

/// `GET /metrics` lists its families in name order and each counter's series in label order, the same on every scrape.
#[test]
fn scrapes_are_in_a_stable_order() {
    // Every line but its value (the process gauges move between scrapes).
    let shape = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| match l.starts_with('#') {
                true => l.to_owned(),
                false => l
                    .rsplit_once(' ')
                    .map_or(l, |(series, _)| series)
                    .to_owned(),
            })
            .collect()
    };
    let [first, second] = scrapes();
    assert_eq!(shape(first), shape(second));
    let families: Vec<&str> = first
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    let mut sorted = families.clone();
    sorted.sort_unstable();
    assert_eq!(families, sorted);
    let soft: Vec<&str> = first
        .lines()
        .filter(|l| l.starts_with("stella_quota_soft_hits_total{"))
        .collect();
    assert!(
        soft[0].contains("\"ip\"") && soft[1].contains("\"tid\""),
        "{soft:?}"
    );
}

/// A scan delayed by a network level counts in its level's series (soft, then hard), one paced by the anonymous budget in the global one; every configured level has a series from the start; no address reaches a label.
#[tokio::test]
async fn level_hits_by_level() {
    use quota_gate::io::meter::{GLOBAL_PACED, NETWORK_HARD_HITS, NETWORK_SOFT_HITS};
    let recorder = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let nets = with_vars(TIERS, &[("QUOTA_NETWORKS", "v4/24=1,v6/56=5,v6/48=5")]);
    let levels = config(&nets).policy.levels;
    let meter = || Meter::new("test", None).with_levels(&levels);
    let gate = metered_gate(&nets, MemoryStore::default(), common::Discard, meter());
    for ip in [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "198.51.100.4",
    ] {
        assert_eq!(gate.handle(scan_from(ip)).await.status(), 202, "{ip}");
    }
    let global = with_vars(
        TIERS,
        &[("QUOTA_NETWORKS", "off"), ("QUOTA_ANON_GLOBAL", "1")],
    );
    let global = metered_gate(&global, MemoryStore::default(), common::Discard, meter());
    for ip in ["192.0.2.1", "192.0.2.2"] {
        assert_eq!(global.handle(scan_from(ip)).await.status(), 202);
    }
    let text = quota_gate::io::meter::prometheus::render(&recorder.handle());
    // v4/24 limit 1, soft window 2: within, soft, soft, hard.
    let series = |name: &str, label: &str| format!("{name}{{{label}}}");
    assert_eq!(
        value(&text, &series(NETWORK_SOFT_HITS, "level=\"v4/24\"")),
        2.0
    );
    assert_eq!(
        value(&text, &series(NETWORK_HARD_HITS, "level=\"v4/24\"")),
        1.0
    );
    assert_eq!(value(&text, &series(GLOBAL_PACED, "scope=\"ip\"")), 1.0);
    for level in ["v6/56", "v6/48"] {
        let label = format!("level=\"{level}\"");
        assert_eq!(
            value(&text, &series(NETWORK_SOFT_HITS, &label)),
            0.0,
            "{level}"
        );
        assert_eq!(
            value(&text, &series(NETWORK_HARD_HITS, &label)),
            0.0,
            "{level}"
        );
    }
    for name in [NETWORK_SOFT_HITS, NETWORK_HARD_HITS, GLOBAL_PACED] {
        assert_counter_with_help(&text, name);
    }
    assert!(
        !text.contains("198.51.100") && !text.contains("192.0.2"),
        "{text}"
    );
}

/// The store's own metrics render unlabelled, typed and described: the
/// gauge as the start set it, the counter as the evictions grew.
#[test]
fn store_metrics_are_unlabelled() {
    use quota_gate::io::meter::store::{Process, StoreMeter};
    use quota_gate::io::meter::{STORE_EVICTED_KEYS, STORE_EVICTING};
    let recorder = local_recorder();
    let _local = metrics::set_default_local_recorder(&recorder);
    let meter = StoreMeter::new("test", Process::Serve, None);
    meter.evicting(true, 0);
    meter.evicted(3, 0);
    meter.evicted(4, 0);
    let text = quota_gate::io::meter::prometheus::render(&recorder.handle());
    assert_eq!(value(&text, STORE_EVICTING), 1.0);
    assert_eq!(value(&text, STORE_EVICTED_KEYS), 7.0);
    assert!(
        text.contains(&format!("# TYPE {STORE_EVICTING} gauge")),
        "{text}"
    );
    assert!(
        text.contains(&format!("# HELP {STORE_EVICTING} ")),
        "{text}"
    );
    assert_counter_with_help(&text, STORE_EVICTED_KEYS);
}
