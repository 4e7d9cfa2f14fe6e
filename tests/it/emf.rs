//! The EMF lines the handler prints, read back from the meter's sink and
//! checked against the CloudWatch embedded metric format specification:
//!
//! - the root is a JSON object with an `_aws` member;
//! - `_aws.Timestamp` is an integer, milliseconds since the epoch;
//! - `_aws.CloudWatchMetrics` is an array of directives, each with a
//!   `Namespace` (1–255 characters), `Dimensions` (an array of dimension
//!   sets, each an array of at most 30 names) and `Metrics` (at most 100
//!   definitions, each a `Name` of 1–255 characters and an optional `Unit`
//!   from CloudWatch's list);
//! - every dimension named is a top-level member whose value is a string;
//! - every metric named is a top-level member whose value is a number or an
//!   array of at most 100 numbers.
//!
//! Beyond the specification, the names and units must be those
//! `quota_gate::io::meter` declares, every directive's `Dimensions` must be
//! exactly `[["Scope"]]` (the product spec's step 9: no other dimension), a
//! line must name exactly one of the per-outcome requests metrics (or, for
//! an exempt scan or a `GET /quota`, exactly its one event counter), and no
//! line may carry the client's address or digest. Every line of a request
//! carries its trace id as the property `traceId` (32 hex digits), never a
//! dimension or a metric. A scan whose delay a level
//! above the subject set has a second line of its own with exactly one level
//! metric: a network hit's dimension is `[["Level"]]` (a configured level's
//! name, `v4/24`, never an address), global pacing's `[["Scope"]]` (`ip`).
//! The store's own lines (`stella_quota_store_evicting` at start, the
//! evicted keys as they grow) carry one store metric each, under
//! `[["Process"]]` (`serve`, `lambda` or `consume`): they describe the
//! process's store, not a request.

use quota_gate_testkit as common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use quota_gate::gate::Gate;
use quota_gate::io::connection::Valkey;
use quota_gate::io::meter;
use quota_gate::io::store::memory::MemoryStore;
use quota_gate::io::store::valkey::ValkeyStore;
use serde_json::Value;

/// The units CloudWatch accepts in a metric definition.
const UNITS: &[&str] = &[
    "Seconds",
    "Microseconds",
    "Milliseconds",
    "Bytes",
    "Kilobytes",
    "Megabytes",
    "Gigabytes",
    "Terabytes",
    "Bits",
    "Kilobits",
    "Megabits",
    "Gigabits",
    "Terabits",
    "Percent",
    "Count",
    "Bytes/Second",
    "Kilobytes/Second",
    "Megabytes/Second",
    "Gigabytes/Second",
    "Terabytes/Second",
    "Bits/Second",
    "Kilobits/Second",
    "Megabits/Second",
    "Gigabits/Second",
    "Terabits/Second",
    "Count/Second",
    "None",
];

const IP: &str = "203.0.113.7";

/// Every line `sink` holds, each parsed and checked against the spec.
fn documents(sink: &Capture) -> Vec<Value> {
    let text = sink.text();
    assert!(text.is_empty() || text.ends_with('\n'), "lines end in \\n");
    text.lines().map(check_emf).collect()
}

/// Checks one line against the EMF specification and meter's declarations; returns it parsed.
fn check_emf(line: &str) -> Value {
    assert!(!line.contains(IP), "no client address in metrics: {line}");
    // CloudWatch Logs caps one event at 256 KiB.
    assert!(line.len() < 256 * 1024);
    let doc: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let root = doc.as_object().expect("the root is an object");
    let aws = root["_aws"].as_object().expect("_aws is an object");

    let ts = aws["Timestamp"].as_u64().expect("Timestamp is an integer");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        now.abs_diff(ts) < 60_000,
        "Timestamp is epoch milliseconds: {ts}"
    );

    let directives = aws["CloudWatchMetrics"].as_array().expect("an array");
    assert!(!directives.is_empty());
    assert!(root.get("Outcome").is_none(), "no Outcome member: {line}");
    // The declared metrics named in `among`.
    let declared_of = |among: &[&str]| -> Vec<&str> {
        directives
            .iter()
            .flat_map(|d| d["Metrics"].as_array().into_iter().flatten())
            .filter_map(|m| m["Name"].as_str())
            .filter(|n| among.contains(n))
            .collect()
    };
    let requests = declared_of(&meter::REQUESTS);
    let events = declared_of(&meter::EVENTS);
    let levels = declared_of(&meter::LEVEL_METRICS);
    let sleep_leases = declared_of(&[meter::ASLEEP, meter::BEDS_FULL]);
    let store = declared_of(&meter::STORE_METRICS);
    let by_level = levels.iter().any(|n| *n != meter::GLOBAL_PACED);
    if !sleep_leases.is_empty() {
        assert_eq!(sleep_leases, [meter::ASLEEP, meter::BEDS_FULL], "{line}");
        assert!(requests.is_empty() && events.is_empty() && levels.is_empty());
        assert!(root[meter::ASLEEP].as_u64().is_some(), "{line}");
        assert!(root[meter::BEDS_FULL].as_u64().unwrap() <= 1, "{line}");
    } else if !store.is_empty() {
        assert_eq!(store.len(), 1, "one store metric per line: {line}");
        assert!(
            requests.is_empty() && events.is_empty() && levels.is_empty(),
            "{line}"
        );
        assert!(root[store[0]].is_u64(), "{line}");
    } else if !levels.is_empty() {
        assert_eq!(levels.len(), 1, "one level metric per line: {line}");
        assert!(requests.is_empty() && events.is_empty(), "{line}");
        assert_eq!(root[levels[0]], 1, "{line}");
    } else if events.is_empty() {
        assert_eq!(requests.len(), 1, "one requests metric per line: {line}");
        // Refusals go out in aggregate (one line per interval); every other outcome one a request.
        if requests[0] == meter::Outcome::BacklogFull.requests_metric() {
            assert!(root[requests[0]].as_u64().unwrap() >= 1, "{line}");
        } else {
            assert_eq!(root[requests[0]], 1, "{line}");
        }
    } else {
        assert_eq!(events.len(), 1, "one event per line: {line}");
        assert!(requests.is_empty(), "an event is no outcome: {line}");
        assert_eq!(root[events[0]], 1, "{line}");
    }
    // A request's line carries its trace id as a property, never a
    // dimension or a metric; the store's lines and the refusals' aggregate
    // belong to no one request.
    let aggregate =
        !store.is_empty() || requests == [meter::Outcome::BacklogFull.requests_metric()];
    match root
        .get("traceId")
        .map(|v| v.as_str().expect("traceId is text"))
    {
        Some(id) => {
            let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
            assert!(id.len() == 32 && id.chars().all(hex), "{line}");
            assert!(
                !line.contains("\"Name\":\"traceId\""),
                "not a metric: {line}"
            );
            assert!(!line.contains("[\"traceId\"]"), "not a dimension: {line}");
        }
        None => assert!(aggregate, "a request's line carries its traceId: {line}"),
    }
    for d in directives {
        let ns = d["Namespace"].as_str().expect("Namespace is a string");
        assert!((1..=255).contains(&ns.len()));
        assert_eq!(ns, "StellaOps/Quota");

        let sets = d["Dimensions"].as_array().expect("Dimensions is an array");
        let dimension = match (by_level, store.is_empty()) {
            (true, _) => "Level",
            (false, false) => "Process",
            (false, true) => "Scope",
        };
        assert_eq!(
            d["Dimensions"],
            serde_json::json!([[dimension]]),
            "{dimension} and no other dimension: {line}"
        );
        for set in sets {
            let names = set.as_array().expect("a dimension set is an array");
            assert!(names.len() <= 30);
            for name in names {
                let name = name.as_str().expect("dimension names are strings");
                let value = root
                    .get(name)
                    .unwrap_or_else(|| panic!("dimension {name} missing"));
                let value = value.as_str().expect("dimension values are strings");
                let level = |v: &str| {
                    let (family, len) = v.split_once('/').unwrap_or_default();
                    ["v4", "v6"].contains(&family) && len.parse::<u8>().is_ok()
                };
                match name {
                    "Level" => assert!(level(value), "{name}={value}"),
                    "Process" => assert!(
                        ["serve", "lambda", "consume"].contains(&value),
                        "{name}={value}"
                    ),
                    _ => assert!(["ip", "tid"].contains(&value), "{name}={value}"),
                }
            }
        }

        let metrics = d["Metrics"].as_array().expect("Metrics is an array");
        assert!(metrics.len() <= 100);
        for m in metrics {
            let name = m["Name"].as_str().expect("Name is a string");
            assert!((1..=255).contains(&name.len()));
            let unit = m["Unit"].as_str().expect("every metric declares its unit");
            assert!(UNITS.contains(&unit), "{unit}");
            let declared = if name == meter::DELAY_MS {
                "Milliseconds"
            } else {
                assert!(
                    meter::COUNTERS.contains(&name)
                        || meter::REQUESTS.contains(&name)
                        || meter::SHADOW_COUNTERS.contains(&name)
                        || meter::EVENTS.contains(&name)
                        || meter::LEVEL_METRICS.contains(&name)
                        || [meter::ASLEEP, meter::BEDS_FULL].contains(&name)
                        || meter::STORE_METRICS.contains(&name),
                    "undeclared metric {name}"
                );
                "Count"
            };
            assert_eq!(unit, declared, "{name}");
            match root.get(name) {
                Some(Value::Number(_)) => {}
                Some(Value::Array(values)) => {
                    assert!(values.len() <= 100, "{name}: at most 100 values");
                    assert!(values.iter().all(Value::is_number), "{name}");
                }
                other => panic!("metric {name} is not a top-level number: {other:?}"),
            }
        }
    }
    doc
}

/// The lines of `sink` that are a request's own: not a sleep lease's line, which
/// follows each scan that asked for a sleep lease.
fn request_lines(sink: &Capture) -> Vec<Value> {
    let sleep_leases = |d: &Value| d.get(meter::ASLEEP).is_some();
    documents(sink)
        .into_iter()
        .filter(|d| !sleep_leases(d))
        .collect()
}

/// The metric names one directive declares.
fn declared(doc: &Value) -> Vec<&str> {
    doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["Name"].as_str().unwrap())
        .collect()
}

/// Asserts the counter values of one document, in `meter::COUNTERS` order.
fn assert_counters(doc: &Value, expected: [u64; 6]) {
    let got: Vec<u64> = meter::COUNTERS
        .iter()
        .map(|n| doc[*n].as_u64().unwrap())
        .collect();
    assert_eq!(got, expected, "{doc}");
}

/// A gate with a quota of one and a soft window of one, and `extra`, on the
/// paused Tokio clock, its EMF lines captured, after three scans from `IP`
/// (within, soft, hard).
async fn after_three_scans(extra: &[(&str, &str)]) -> (Gate<MemoryStore, Discard>, Capture) {
    let sink = Capture::default();
    let vars = with_vars(&[("QUOTA_ANON", "1"), ("QUOTA_SOFT_WINDOW", "1")], extra);
    let gate = metered_gate(&vars, MemoryStore::default(), Discard, sink.meter())
        .with_clock(quota_gate::io::clock::Clock::tokio());
    for _ in 0..3 {
        assert_eq!(gate.handle(scan_from(IP)).await.status(), 202);
    }
    (gate, sink)
}

/// Within, soft, hard and reminder scans each print one valid EMF line with the right counters and delay.
#[tokio::test(start_paused = true)]
async fn tiers_print_valid_emf() {
    let (_gate, sink) = after_three_scans(&[("QUOTA_WARN_AT", "3")]).await;
    let docs = request_lines(&sink);
    assert_eq!(docs.len(), 3, "one line per request");
    // within, soft, hard: the first three of meter::REQUESTS.
    for (doc, requests) in docs.iter().zip(meter::REQUESTS) {
        let all: Vec<&str> = meter::COUNTERS
            .iter()
            .copied()
            .chain([requests, meter::DELAY_MS])
            .collect();
        assert_eq!(
            declared(doc),
            all,
            "every counter, the outcome's requests metric and the delay on every decided scan"
        );
        assert_eq!(doc[requests], 1);
        assert_eq!(doc["Scope"], "ip");
    }
    // [soft, hard, reminders, store errors, enqueue errors]
    assert_counters(&docs[0], [0, 0, 0, 0, 0, 0]);
    assert_counters(&docs[1], [1, 0, 0, 0, 0, 0]);
    assert_counters(&docs[2], [0, 1, 1, 0, 0, 0]);
    let delays: Vec<u64> = docs
        .iter()
        .map(|d| d[meter::DELAY_MS].as_u64().unwrap())
        .collect();
    assert_eq!(
        delays,
        [0, 5_000, 60_000],
        "the whole delay owed, slept or not"
    );
    let tiers: Vec<&str> = docs.iter().map(|d| d["tier"].as_str().unwrap()).collect();
    assert_eq!(tiers, ["within", "soft", "hard"]);
}

/// Shadow mode meters soft and hard under the shadow counters (the real ones
/// stay 0, the outcome is `within`: nobody waited); an exempt scan and a
/// `GET /quota` print one valid line each, with their one counter.
#[tokio::test(start_paused = true)]
async fn shadow_exempt_and_check_print_valid_emf() {
    let (gate, sink) = after_three_scans(&[
        ("QUOTA_MODE", "shadow"),
        ("QUOTA_EXEMPT_NETWORKS", "192.0.2.0/24"),
    ])
    .await;
    assert_eq!(gate.handle(scan_from("192.0.2.9")).await.status(), 202);
    let mut check = scan_from(IP);
    check.method = http::Method::GET;
    check.path = "/quota".into();
    assert_eq!(gate.handle(check).await.status(), 200);
    let docs = documents(&sink);
    assert_eq!(docs.len(), 5, "one line per request");
    for doc in &docs[..3] {
        assert_eq!(doc["stella_quota_requests_within_total"], 1, "{doc}");
        assert_eq!(doc[meter::DELAY_MS], 0, "{doc}");
        assert_counters(doc, [0, 0, 0, 0, 0, 0]);
        assert_eq!(doc["mode"], "shadow");
    }
    let shadow = |d: &Value| {
        [
            d[meter::SHADOW_SOFT_HITS].as_u64(),
            d[meter::SHADOW_HARD_HITS].as_u64(),
        ]
    };
    assert_eq!(shadow(&docs[0]), [Some(0), Some(0)]);
    assert_eq!(shadow(&docs[1]), [Some(1), Some(0)]);
    assert_eq!(shadow(&docs[2]), [Some(0), Some(1)]);
    assert_eq!(declared(&docs[3]), [meter::EXEMPT]);
    assert_eq!(declared(&docs[4]), [meter::CHECKS]);
}

/// Token holders are metered under Scope=tid, with no token material in the line.
#[tokio::test]
async fn token_scope_dimension() {
    let sink = Capture::default();
    let token = event_token("http-api-v2-token.json");
    let key = fixture("ed25519.pub.pem");
    let vars = [("QUOTA_JWT_PUBLIC_KEY", key.as_str())];
    let gate = metered_gate(&vars, MemoryStore::default(), Discard, sink.meter());
    let r = gate.handle(scan_with_token(IP, &token)).await;
    assert_eq!(json(&r)["quota"]["scope"], "tid");
    let docs = documents(&sink);
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["Scope"], "tid");
    let line = docs[0].to_string();
    assert!(
        !line.contains(&token) && !line.contains("tenant-42"),
        "{line}"
    );
}

/// An unreachable store prints a store-error line with no delay sample, so an outage cannot drag p95 down.
#[tokio::test]
async fn store_error_prints_valid_emf() {
    let sink = Capture::default();
    let dead = format!("redis://127.0.0.1:{}", free_port());
    let config = config(&[("VALKEY_URL", &dead), ("QUOTA_STORE_TIMEOUT_MS", "200")]);
    let store = ValkeyStore::new(Valkey::new(&dead, false, config.store.timeout).unwrap());
    let gate = Gate::new(config, store, Discard, sink.meter()).unwrap();
    let r = gate.handle(scan_from(IP)).await;
    assert_eq!(r.status(), 202, "fail open by default");
    let docs = documents(&sink);
    assert_eq!(docs.len(), 1);
    assert_counters(&docs[0], [0, 0, 0, 1, 0, 0]);
    assert_eq!(
        docs[0]["tier"], "unmetered",
        "a scan accepted uncounted says so"
    );
    let undecided: Vec<&str> = meter::COUNTERS
        .iter()
        .copied()
        .chain(["stella_quota_requests_unmetered_total"])
        .collect();
    assert_eq!(declared(&docs[0]), undecided);
    assert!(docs[0].get(meter::DELAY_MS).is_none());
}

/// A failed enqueue prints an enqueue-error line.
#[tokio::test]
async fn enqueue_error_prints_valid_emf() {
    let sink = Capture::default();
    let gate = metered_gate(&[], MemoryStore::default(), Refuse, sink.meter());
    assert_eq!(gate.handle(scan_from(IP)).await.status(), 503);
    let docs = documents(&sink);
    assert_eq!(docs.len(), 1);
    assert_counters(&docs[0], [0, 0, 0, 0, 1, 0]);
    assert_eq!(docs[0]["stella_quota_requests_queue_unavailable_total"], 1);
}

/// Requests refused before counting (bad input) print nothing.
#[tokio::test]
async fn rejected_requests_print_nothing() {
    let sink = Capture::default();
    let gate = metered_gate(&[], MemoryStore::default(), Discard, sink.meter());
    let mut bad = scan_from(IP);
    bad.body = bytes::Bytes::from_static(br#"{"img":1}"#);
    assert_eq!(gate.handle(bad).await.status(), 400);
    assert!(documents(&sink).is_empty());
}

/// A line's timestamp is the request's instant, as it is given in the exit, written as integer milliseconds.
#[test]
fn timestamp_is_the_requests_instant() {
    let sink = Capture::default();
    sink.meter().record(&meter::Exit {
        scope: quota_gate::rules::scope::Scope::Ip,
        metered: meter::Metered::Counted {
            tier: quota_gate::rules::decide::Tier::Hard,
            reminder: false,
            delay: Duration::from_secs(60),
            shadow: false,
            level: quota_gate::rules::level::LevelName::Subject,
        },
        outcome: meter::Outcome::Hard,
        at: quota_gate::rules::unix::UnixMillis(1_796_032_800_123),
        sleep_lease: None,
        trace: None,
    });
    let line = sink.text();
    let doc: Value = serde_json::from_str(line.trim_end()).unwrap();
    assert_eq!(doc["_aws"]["Timestamp"].as_u64(), Some(1_796_032_800_123));
    assert!(
        line.contains("\"Timestamp\":1796032800123"),
        "no float: {line}"
    );
}

/// Each scan that would sleep asks for a sleep lease, and its sleep lease's line follows
/// its own: how many were asleep, and whether it found every sleep lease taken
/// (then it slept nothing). A within scan, a deferring gate and a shadow
/// decision ask for none.
#[tokio::test(start_paused = true)]
async fn bed_lines() {
    let (_gate, sink) = after_three_scans(&[("QUOTA_MAX_ASLEEP", "1")]).await;
    let docs = documents(&sink);
    let sleep_leases: Vec<(u64, u64)> = docs
        .iter()
        .filter(|d| d.get(meter::ASLEEP).is_some())
        .map(|d| {
            (
                d[meter::ASLEEP].as_u64().unwrap(),
                d[meter::BEDS_FULL].as_u64().unwrap(),
            )
        })
        .collect();
    // The soft scan slept 5 s in the one sleep lease, held a second longer (its
    // grace): the hard scan, 5 s later, found it taken and slept nothing.
    assert_eq!(sleep_leases, [(1, 0), (1, 1)], "{docs:?}");
    assert!(
        docs[2].get(meter::ASLEEP).is_some(),
        "after the soft scan's own line"
    );
    for quiet in [("QUOTA_DELAY_MODE", "defer"), ("QUOTA_MODE", "shadow")] {
        let (_gate, sink) = after_three_scans(&[quiet]).await;
        assert!(
            request_lines(&sink).len() == documents(&sink).len(),
            "{quiet:?}"
        );
    }
}

/// Every line of a request carries the gate's one clock reading: the EMF timestamps of a paused-clock run are the instants its requests arrived, not when the lines were written.
#[tokio::test(start_paused = true)]
async fn timestamps_are_the_gates_clock() {
    let (_gate, sink) = after_three_scans(&[]).await;
    let stamps: Vec<u64> = request_lines(&sink)
        .iter()
        .map(|d| d["_aws"]["Timestamp"].as_u64().unwrap())
        .collect();
    // Within, soft (slept 5 s), hard: the third arrived after the soft scan's sleep.
    assert!(stamps[1] - stamps[0] < 1_000, "{stamps:?}");
    assert!(stamps[2] - stamps[1] >= 5_000, "{stamps:?}");
}

/// A scan delayed by a network level is followed by that level's line (soft, then hard, dimension Level), one paced by the anonymous budget by a global-paced line; a within scan, a token's and a shadow decision have none; no line names an address.
#[tokio::test]
async fn level_lines() {
    let sink = Capture::default();
    let vars = with_vars(
        TIERS,
        &[
            ("QUOTA_NETWORKS", "v4/24=1,v6/48=1"),
            ("QUOTA_SOFT_WINDOW", "1"),
        ],
    );
    let gate = metered_gate(&vars, MemoryStore::default(), Discard, sink.meter());
    let addresses = ["198.51.100.1", "198.51.100.2", "198.51.100.3"];
    for ip in addresses {
        assert_eq!(gate.handle(scan_from(ip)).await.status(), 202);
    }
    let level_lines = |docs: &[Value]| -> Vec<(String, String)> {
        docs.iter()
            .filter_map(|d| {
                let metric = meter::LEVEL_METRICS.iter().find(|m| d.get(**m).is_some())?;
                let dimension = d.get("Level").or(d.get("Scope"))?.as_str()?.to_owned();
                Some((metric.to_string(), dimension))
            })
            .collect()
    };
    let docs = documents(&sink);
    assert_eq!(docs.len(), 5, "three scans, two level lines");
    assert_eq!(
        level_lines(&docs),
        [
            (meter::NETWORK_SOFT_HITS.to_string(), "v4/24".to_string()),
            (meter::NETWORK_HARD_HITS.to_string(), "v4/24".to_string()),
        ]
    );
    // The anonymous budget: the second scan is paced fleet-wide.
    let sink = Capture::default();
    let global = with_vars(
        TIERS,
        &[("QUOTA_NETWORKS", "off"), ("QUOTA_ANON_GLOBAL", "1")],
    );
    let gate = metered_gate(&global, MemoryStore::default(), Discard, sink.meter());
    for ip in ["192.0.2.1", "192.0.2.2"] {
        assert_eq!(gate.handle(scan_from(ip)).await.status(), 202);
    }
    let docs = documents(&sink);
    assert_eq!(
        level_lines(&docs),
        [(meter::GLOBAL_PACED.to_string(), "ip".to_string())]
    );
    // Shadow mode decides the same, but nobody waited: no level line.
    let sink = Capture::default();
    let shadow = with_vars(&vars, &[("QUOTA_MODE", "shadow")]);
    let gate = metered_gate(&shadow, MemoryStore::default(), Discard, sink.meter());
    for ip in addresses {
        assert_eq!(gate.handle(scan_from(ip)).await.status(), 202);
    }
    assert!(level_lines(&documents(&sink)).is_empty());
    let text = sink.text();
    assert!(!text.contains("198.51.100") && !text.contains("192.0.2"));
}

/// The store's lines, from each front end: at start whether it can evict
/// (1 or 0), then the keys evicted, a line only when there were any; each
/// valid EMF with its one store metric under `[["Process"]]`.
#[test]
fn store_lines_follow_the_spec() {
    use quota_gate::io::meter::emf::Sink;
    use quota_gate::io::meter::store::{Process, StoreMeter};
    let sink = Capture::default();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for process in [Process::Serve, Process::Lambda, Process::Consume] {
        let meter = StoreMeter::new(
            "StellaOps/Quota",
            process,
            Some(Sink::sync(Box::new(sink.clone()))),
        );
        meter.evicting(process == Process::Lambda, now);
        meter.evicted(0, now);
        meter.evicted(17, now);
    }
    let docs = documents(&sink);
    assert_eq!(
        docs.len(),
        6,
        "two lines per process: the gauge, the evictions"
    );
    let evicting: Vec<u64> = docs
        .iter()
        .filter_map(|d| d[meter::STORE_EVICTING].as_u64())
        .collect();
    assert_eq!(evicting, [0, 1, 0]);
    for doc in docs
        .iter()
        .filter(|d| d.get(meter::STORE_EVICTED_KEYS).is_some())
    {
        assert_eq!(doc[meter::STORE_EVICTED_KEYS], 17, "{doc}");
    }
    let processes: Vec<&str> = docs
        .iter()
        .map(|d| d["Process"].as_str().unwrap())
        .collect();
    assert_eq!(
        processes,
        ["serve", "serve", "lambda", "lambda", "consume", "consume"]
    );
}
