//! The dashboards show only what the gate really emits, and their
//! thresholds are the alerts'. (The JSON logs: `tests/it/lambda_logs.rs`.)
//!
//! - CloudWatch: the dashboard body in `template.yaml` is read back and every
//!   quota metric it plots, with its dimensions, must be carried by an EMF
//!   line of a scripted run of the real gate (within, soft, hard, backlog
//!   refusal, queue failure, keyed repeat, shadow mode, an exempt scan, a
//!   `GET /quota`, fail open on a stopped Valkey, fail closed);
//!   AWS/Lambda and AWS/SQS metrics must be ones AWS publishes.
//! - Grafana: `grafana/quota-gate.json` is loaded, and every panel query, its
//!   template variables substituted, is evaluated by a real Prometheus that
//!   scraped a real `quota-gate serve` through the same kind of run. Needs
//!   Debian's `prometheus` (the binary on `PATH`, or `PROMETHEUS_BIN`).

use quota_gate_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::client::{http, scan_request};
use common::consumer::{Scanner, job, now_ms};
use common::serve::{spawn_serve, stderr_after_term};
use common::*;
use jsonwebtoken::Algorithm;
use quota_gate::gate::Gate;
use quota_gate::io::connection::Valkey;
use quota_gate::io::meter::emf::Sink;
use quota_gate::io::meter::store::{Process, StoreMeter};
use quota_gate::io::store::memory::MemoryStore;
use quota_gate::io::store::valkey::ValkeyStore;
use serde_json::{Value, json};

const IP: &str = "203.0.113.9";

/// One quota each, a soft window of one scan, reminders from the second,
/// delays deferred (nothing sleeps) and a backlog cap that refuses the
/// fourth scan: within, soft (5 s), hard (paced to 65 s), refused (125 s).
const SCRIPT: &[(&str, &str)] = &[
    ("QUOTA_ANON", "1"),
    ("QUOTA_TOKEN", "1"),
    ("QUOTA_SOFT_WINDOW", "1"),
    ("QUOTA_WARN_AT", "2"),
    ("QUOTA_DELAY_MODE", "defer"),
    ("QUOTA_MAX_BACKLOG_MS", "70000"),
];

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap()
}

fn token() -> String {
    mint(
        Algorithm::EdDSA,
        json!({"iss": "stella-ops.org", "tid": "t-dashboards", "exp": now() + 600}),
    )
}

// --- CloudWatch -----------------------------------------------------------------------

/// A metric as a dashboard names it: namespace, name, dimension → value.
type MetricId = (String, String, BTreeMap<String, String>);

/// The `DashboardBody` block of template.yaml, its `${…}` references
/// replaced by stand-ins (each must name a parameter, a resource or a
/// pseudo parameter), parsed.
fn cloudwatch_body(template: &str) -> Value {
    let start = template
        .find("      DashboardBody: !Sub |\n")
        .expect("template.yaml has a DashboardBody: !Sub | block");
    let block: Vec<&str> = template[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("        ") || l.is_empty())
        .map(|l| l.get(8..).unwrap_or(""))
        .collect();
    let mut text = block.join("\n");
    while let Some(at) = text.find("${") {
        let end = at + text[at..].find('}').unwrap();
        let reference = &text[at + 2..end];
        let (name, attribute) = reference.split_once('.').unwrap_or((reference, ""));
        let stand_in = match (name, attribute) {
            ("AWS::Region", _) => "us-east-1".to_owned(),
            ("MetricsNamespace", _) => "StellaOps/Quota".to_owned(),
            (name, "Arn") => format!("arn:aws:cloudwatch:us-east-1:123456789012:alarm:{name}"),
            (name, _) => name.to_owned(),
        };
        assert!(
            name.starts_with("AWS::") || template.contains(&format!("\n  {name}:\n")),
            "${{{reference}}} names nothing in template.yaml"
        );
        text.replace_range(at..=end, &stand_in);
    }
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("the dashboard body is not JSON: {e}"))
}

/// Every metric a metric widget plots (no `...` shorthand, no expressions).
fn dashboard_metrics(body: &Value) -> Vec<MetricId> {
    let mut out = Vec::new();
    for widget in body["widgets"].as_array().unwrap() {
        if widget["type"] != "metric" {
            continue;
        }
        for row in widget["properties"]["metrics"].as_array().unwrap() {
            let words: Vec<&str> = row
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(
                words.len() >= 2 && words.len().is_multiple_of(2) && !words.contains(&"..."),
                "a metric row is namespace, name and dimension pairs: {row}"
            );
            let dims = words[2..]
                .chunks(2)
                .map(|p| (p[0].to_owned(), p[1].to_owned()))
                .collect();
            out.push((words[0].to_owned(), words[1].to_owned(), dims));
        }
    }
    out
}

/// Every (namespace, metric, dimension values) an EMF line declares.
fn emf_metrics(text: &str) -> BTreeSet<MetricId> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let doc: Value = serde_json::from_str(line).unwrap();
        for directive in doc["_aws"]["CloudWatchMetrics"].as_array().unwrap() {
            let ns = directive["Namespace"].as_str().unwrap();
            for set in directive["Dimensions"].as_array().unwrap() {
                let dims: BTreeMap<String, String> = set
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| {
                        let d = d.as_str().unwrap();
                        (d.to_owned(), doc[d].as_str().unwrap().to_owned())
                    })
                    .collect();
                for m in directive["Metrics"].as_array().unwrap() {
                    let name = m["Name"].as_str().unwrap().to_owned();
                    out.insert((ns.to_owned(), name, dims.clone()));
                }
            }
        }
    }
    out
}

/// The scripted run through the library gate, per scope: within, soft,
/// hard, backlog refusal; a soft scan asleep on a sleep lease; a queue failure; a keyed scan and its repeat; then a real Valkey that counts
/// one scan and is stopped: fail open, then fail closed. Returns the EMF text.
async fn scripted_emf_run() -> String {
    let sink = Capture::default();
    let key = fixture("ed25519.pub.pem");
    let vars = with_vars(SCRIPT, &[("QUOTA_JWT_PUBLIC_KEY", key.as_str())]);
    let token = token();
    let anon = || scan_from(IP);
    let tid = || scan_with_token(IP, &token);
    let requests: [&dyn Fn() -> quota_gate::GateRequest; 2] = [&anon, &tid];

    let gate = metered_gate(&vars, MemoryStore::default(), Discard, sink.meter());
    for request in requests {
        let statuses = [
            gate.handle(request()).await.status(),
            gate.handle(request()).await.status(),
            gate.handle(request()).await.status(),
            gate.handle(request()).await.status(),
        ];
        assert_eq!(statuses.map(|s| s.as_u16()), [202, 202, 202, 503]);
    }
    let refusing = metered_gate(&vars, MemoryStore::default(), Refuse, sink.meter());
    let keyed = metered_gate(&vars, MemoryStore::default(), Discard, sink.meter());
    for request in requests {
        assert_eq!(refusing.handle(request()).await.status(), 503);
        let with_key = || {
            let mut r = request();
            r.headers
                .insert("idempotency-key", "dashboards-1".parse().unwrap());
            r
        };
        assert_eq!(keyed.handle(with_key()).await.status(), 202);
        let again = keyed.handle(with_key()).await;
        assert_eq!(again.headers()["idempotent-replayed"], "true");
    }

    // Over-quota scans that sleep (briefly), each on a sleep lease, in each scope.
    let sleeping = with_vars(
        &vars,
        &[("QUOTA_DELAY_MODE", "sleep"), ("QUOTA_SOFT_DELAY_MS", "10")],
    );
    let sleeping = metered_gate(&sleeping, MemoryStore::default(), Discard, sink.meter());
    for request in requests {
        for _ in 0..2 {
            assert_eq!(sleeping.handle(request()).await.status(), 202);
        }
    }

    // Shadow mode, exempt scans and GET /quota, in each scope.
    let shadow = with_vars(&vars, &[("QUOTA_MODE", "shadow")]);
    let shadow = metered_gate(&shadow, MemoryStore::default(), Discard, sink.meter());
    let exempt = with_vars(&vars, &[("QUOTA_EXEMPT_NETWORKS", IP)]);
    let exempt = metered_gate(&exempt, MemoryStore::default(), Discard, sink.meter());
    for request in requests {
        for _ in 0..3 {
            assert_eq!(shadow.handle(request()).await.status(), 202);
        }
        let r = exempt.handle(request()).await;
        assert_eq!(json(&r)["quota"]["scope"], "exempt");
        let mut check = request();
        check.method = http::Method::GET;
        check.path = "/quota".into();
        assert_eq!(shadow.handle(check).await.status(), 200);
    }

    levels_run(&vars, &sink).await;

    let server = ValkeyServer::start();
    let url = server.url();
    let on_valkey = |mode: &str| {
        let vars = with_vars(
            &vars,
            &[
                ("VALKEY_URL", url.as_str()),
                ("QUOTA_FAIL_MODE", mode),
                ("QUOTA_BREAKER_FAILURES", "0"),
            ],
        );
        let config = config(&vars);
        let valkey = Valkey::new(&url, false, config.store.timeout).unwrap();
        Gate::new(config, ValkeyStore::new(valkey), Discard, sink.meter()).unwrap()
    };
    let (open, closed) = (on_valkey("open"), on_valkey("closed"));
    // The Lambda's init check of the store: its one line (noeviction: 0).
    let store_sink = Sink::sync(Box::new(sink.clone()));
    let store_meter = StoreMeter::new("StellaOps/Quota", Process::Lambda, Some(store_sink));
    let valkey = Valkey::new(&url, false, Duration::from_secs(2)).unwrap();
    let store = &open.config().store;
    quota_gate::io::eviction_watch::check_at_start(&valkey, store, &store_meter)
        .await
        .unwrap();
    assert_eq!(json(&open.handle(anon()).await)["quota"]["used"], 1);
    drop(server);
    for request in requests {
        let r = open.handle(request()).await;
        assert_eq!(r.headers()["x-stella-quota"], "unavailable");
        assert_eq!(closed.handle(request()).await.status(), 503);
    }
    sink.text()
}

/// Budgets above the subject: addresses of one network (each a first scan
/// of its own) get the network's soft then hard tier, at each level the
/// dashboard plots; beyond the anonymous budget, scans are paced.
async fn levels_run(vars: &[(&str, &str)], sink: &Capture) {
    let nets = with_vars(vars, &[("QUOTA_NETWORKS", "v4/24=1,v6/56=1,v6/48=2")]);
    let nets = metered_gate(&nets, MemoryStore::default(), Discard, sink.meter());
    let series: [&[&str]; 3] = [
        // v4/24 (1): within, soft, hard.
        &["198.51.100.1", "198.51.100.2", "198.51.100.3"],
        // One /56 (1) of a /48 (2): the /56 is the more severe.
        &["2001:db8:1:1::1", "2001:db8:1:2::1", "2001:db8:1:3::1"],
        // /56s of one /48 (2): within, within, soft, hard.
        &[
            "2001:db8:3:100::1",
            "2001:db8:3:200::1",
            "2001:db8:3:300::1",
            "2001:db8:3:400::1",
        ],
    ];
    for addresses in series {
        for ip in addresses {
            assert_eq!(nets.handle(scan_from(ip)).await.status(), 202, "{ip}");
        }
    }
    // Token holders of one network (each token a first scan of its own)
    // at their own levels: within, soft, hard.
    let tokens = with_vars(
        vars,
        &[
            ("QUOTA_NETWORKS", "off"),
            ("QUOTA_TOKEN_NETWORKS", "v4/24=1,v6/48=1"),
        ],
    );
    let tokens = metered_gate(&tokens, MemoryStore::default(), Discard, sink.meter());
    for (i, ip) in [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "2001:db8:5:1::1",
        "2001:db8:5:2::1",
        "2001:db8:5:3::1",
    ]
    .into_iter()
    .enumerate()
    {
        let token = mint(
            Algorithm::EdDSA,
            json!({"iss": "stella-ops.org", "tid": format!("t-net-{i}"), "exp": now() + 600}),
        );
        let status = tokens.handle(scan_with_token(ip, &token)).await.status();
        assert_eq!(status, 202, "{ip}");
    }
    let global = with_vars(
        vars,
        &[("QUOTA_NETWORKS", "off"), ("QUOTA_ANON_GLOBAL", "1")],
    );
    let global = metered_gate(&global, MemoryStore::default(), Discard, sink.meter());
    for ip in ["192.0.2.1", "192.0.2.2"] {
        assert_eq!(global.handle(scan_from(ip)).await.status(), 202);
    }
}

/// The metrics AWS publishes for a function, a queue and a serverless cache that the dashboard may plot.
const AWS_METRICS: &[(&str, &str, &str)] = &[
    ("AWS/Lambda", "Duration", "FunctionName"),
    ("AWS/Lambda", "ConcurrentExecutions", "FunctionName"),
    ("AWS/Lambda", "Throttles", "FunctionName"),
    ("AWS/Lambda", "Errors", "FunctionName"),
    ("AWS/Lambda", "Invocations", "FunctionName"),
    ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "QueueName"),
    ("AWS/SQS", "ApproximateNumberOfMessagesDelayed", "QueueName"),
    (
        "AWS/SQS",
        "ApproximateNumberOfMessagesNotVisible",
        "QueueName",
    ),
    ("AWS/SQS", "ApproximateAgeOfOldestMessage", "QueueName"),
    ("AWS/SQS", "NumberOfMessagesSent", "QueueName"),
    ("AWS/ElastiCache", "Evictions", "clusterId"),
    ("AWS/ElastiCache", "BytesUsedForCache", "clusterId"),
    ("AWS/ElastiCache", "ElastiCacheProcessingUnits", "clusterId"),
    ("AWS/ElastiCache", "ThrottledCmds", "clusterId"),
];

/// The consumer function's EMF lines for what it meters: a job started in
/// each lane, one that succeeded, one that failed, a duplicate.
fn consumer_emf_lines() -> String {
    use quota_gate::consume::meter::{ConsumeMeter, Event};
    use quota_gate::consume::source::sqs_batch::SOURCE;
    use quota_gate::rules::job::Lane;
    let sink = Capture::default();
    let meter = ConsumeMeter::with_sink(
        "StellaOps/Quota",
        SOURCE,
        Some(Sink::sync(Box::new(sink.clone()))),
    );
    for lane in [Lane::Within, Lane::Over] {
        meter.record(Event::Started {
            lateness_ms: 3,
            lane,
        });
    }
    for event in [Event::Succeeded, Event::Failed, Event::Duplicate] {
        meter.record(event);
    }
    sink.text()
}

/// Every metric and dimension set on the CloudWatch dashboard is one an EMF line of the scripted run (or of the consumer function) carries, or one AWS publishes.
#[tokio::test]
async fn cloudwatch_dashboard_plots_only_emitted_metrics() {
    let body = cloudwatch_body(&read("template.yaml"));
    let plotted = dashboard_metrics(&body);
    let emitted = emf_metrics(&scripted_emf_run().await);
    let consumer = emf_metrics(&consumer_emf_lines());
    let mut ours = BTreeSet::new();
    for (ns, name, dims) in &plotted {
        let id = (ns.clone(), name.clone(), dims.clone());
        if ns == "StellaOps/Quota" && name.starts_with("stella_consumer_") {
            assert!(
                consumer.contains(&id),
                "the dashboard plots {name} {dims:?}, which no EMF line of the consumer function carries"
            );
        } else if ns == "StellaOps/Quota" {
            ours.insert((ns.clone(), name.clone(), dims.clone()));
            assert!(
                emitted.contains(&(ns.clone(), name.clone(), dims.clone())),
                "the dashboard plots {name} {dims:?}, which no EMF line of the run carries"
            );
        } else {
            let names: Vec<&str> = dims.keys().map(String::as_str).collect();
            assert!(
                AWS_METRICS
                    .iter()
                    .any(|(n, m, d)| (n, m) == (&ns.as_str(), &name.as_str()) && names == [*d]),
                "{ns} {name} {dims:?} is not a metric AWS publishes"
            );
        }
    }
    // Every quota metric and every outcome of every scope is on the board.
    assert_eq!(ours, emitted, "the dashboard leaves some metric out");
}

/// The template's top-level resources: name → its lines.
fn resources(template: &str) -> BTreeMap<String, Vec<&str>> {
    let mut out: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut current = None;
    for line in template.lines() {
        if let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':'))
            && !name.starts_with(' ')
            && !name.starts_with('#')
        {
            current = Some(name.to_owned());
            continue;
        }
        if !line.starts_with("  ") && !line.is_empty() {
            current = None;
        }
        if let Some(name) = &current {
            out.entry(name.clone()).or_default().push(line);
        }
    }
    out
}

/// The template's alarms that every stack has (none under a `Condition`):
/// name → `Threshold`.
fn alarms(template: &str) -> BTreeMap<String, f64> {
    resources(template)
        .into_iter()
        .filter(|(_, lines)| lines.contains(&"    Type: AWS::CloudWatch::Alarm"))
        .filter(|(_, lines)| !lines.iter().any(|l| l.starts_with("    Condition: ")))
        .map(|(name, lines)| {
            let threshold = lines
                .iter()
                .find_map(|l| l.strip_prefix("      Threshold: "))
                .unwrap_or_else(|| panic!("{name} has no Threshold"));
            (name, threshold.parse().unwrap())
        })
        .collect()
}

/// The dashboard's threshold lines are its alarms' thresholds, and its alarm widget shows every alarm of the template.
#[test]
fn cloudwatch_thresholds_are_the_alarms() {
    let template = read("template.yaml");
    let body = cloudwatch_body(&template);
    let lines: Vec<(String, f64)> = body["widgets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| {
            w["properties"]["annotations"]["horizontal"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|a| {
            (
                a["label"].as_str().unwrap().to_owned(),
                a["value"].as_f64().unwrap(),
            )
        })
        .collect();
    let alarms_of = |label: &str| -> &[&str] {
        match label {
            "soft-hits alarm" => &["QuotaSoftHitsHighAlarm"],
            "hard-hits alarm" => &["QuotaHardHitsAbuseAlarm"],
            "1 s (p95 alarm)" => &["QuotaDelayP95HighIpAlarm", "QuotaDelayP95HighTidAlarm"],
            "backlog alarm" => &["QuotaBacklogRefusalsAlarm"],
            "global-paced alarm" => &["QuotaGlobalPacedAlarm"],
            "dead-letter alarm" => &["ScanDeadLetterAlarm", "ScanOverDeadLetterAlarm"],
            "within-lane age alarm" => &["ScanQueueAgeAlarm"],
            "over-lane age alarm" => &["ScanQueueOverAgeAlarm"],
            "consumer errors alarm" => &["ConsumerErrorsAlarm"],
            "within dwell alarm" => &["ConsumerDwellWithinAlarm"],
            _ => &[],
        }
    };
    let alarms = alarms(&template);
    assert_eq!(alarms.len(), 12, "{alarms:?}");
    let mut checked = BTreeSet::new();
    for (label, value) in &lines {
        for alarm in alarms_of(label) {
            assert_eq!(alarms[*alarm], *value, "{label}");
            checked.insert(alarm.to_string());
        }
    }
    let all: BTreeSet<String> = alarms.keys().cloned().collect();
    assert_eq!(checked, all, "every alarm has its line on a panel");
    let shown: Vec<&str> = body["widgets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["type"] == "alarm")
        .flat_map(|w| w["properties"]["alarms"].as_array().unwrap())
        .map(|a| a.as_str().unwrap().rsplit(':').next().unwrap())
        .collect();
    assert_eq!(
        shown.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
        all
    );
}

/// The created cache's alarms exist with the cache only, on its own
/// metrics (dimension `clusterId`, the cache): any eviction, any throttled
/// command, and data storage and ECPU at 75 % of the very parameters its
/// `CacheUsageLimits` takes, so a larger cache moves its alarms with it.
#[test]
fn cache_alarms_follow_its_limits() {
    let template = read("template.yaml");
    let all = resources(&template);
    let cache = all["ValkeyCache"].join("\n");
    for limit in ["CacheMaxDataStorageGB", "CacheMaxEcpuPerSecond"] {
        assert!(cache.contains(&format!("Maximum: !Ref {limit}")), "{cache}");
    }
    let expect = [
        ("CacheEvictionsAlarm", "MetricName: Evictions", "0", None),
        (
            "CacheThrottledAlarm",
            "MetricName: ThrottledCmds",
            "0",
            None,
        ),
        (
            "CacheDataStorageAlarm",
            "MetricName: BytesUsedForCache",
            "75",
            Some("100 * bytes / (${CacheMaxDataStorageGB} * 1000000000)"),
        ),
        (
            "CacheEcpuAlarm",
            "MetricName: ElastiCacheProcessingUnits",
            "75",
            Some("100 * ecpu / 60 / ${CacheMaxEcpuPerSecond}"),
        ),
    ];
    for (name, metric, threshold, expression) in expect {
        let alarm = all[name].join("\n");
        assert!(alarm.contains("    Condition: CreateCache"), "{name}");
        assert!(alarm.contains("Namespace: AWS/ElastiCache"), "{name}");
        assert!(alarm.contains(metric), "{name}");
        assert!(alarm.contains("- Name: clusterId\n"), "{name}");
        assert!(alarm.contains("Value: !Ref ValkeyCache"), "{name}");
        assert!(
            alarm.contains(&format!("      Threshold: {threshold}\n")),
            "{name}"
        );
        if let Some(expression) = expression {
            assert!(
                alarm.contains(&format!("Expression: !Sub \"{expression}\"")),
                "{name}"
            );
        }
    }
}

// --- Grafana and Prometheus -------------------------------------------------------------

fn grafana() -> Value {
    serde_json::from_str(&read("grafana/quota-gate.json")).expect("valid JSON")
}

/// Every panel's (title, red threshold, query expressions).
fn panels(dashboard: &Value) -> Vec<(String, Option<f64>, Vec<String>)> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let red = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
                .as_array()
                .and_then(|steps| steps.iter().find(|s| s["color"] == "red"))
                .map(|s| s["value"].as_f64().unwrap());
            let exprs = p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_owned())
                .collect();
            (p["title"].as_str().unwrap().to_owned(), red, exprs)
        })
        .collect()
}

/// The dashboard imports as is: a schema version, a Prometheus data source variable every panel
/// uses; and every panel names its entry of the runbook, a heading of docs/operations.md.
#[test]
fn grafana_dashboard_is_importable() {
    let d = grafana();
    let runbook = common::markdown::anchors(
        &std::fs::read_to_string(common::root().join("docs/operations.md")).unwrap(),
    );
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36);
    assert!(d["uid"].is_string() && d["title"].is_string());
    let variables = d["templating"]["list"].as_array().unwrap();
    let source = variables
        .iter()
        .find(|v| v["type"] == "datasource")
        .unwrap();
    assert_eq!(source["query"], "prometheus");
    let uid = format!("${{{}}}", source["name"].as_str().unwrap());
    let mut ids = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "panel ids are unique"
        );
        assert_eq!(p["datasource"]["uid"], uid.as_str(), "{}", p["title"]);
        let description = p["description"].as_str().unwrap();
        let anchor = description
            .split("docs/operations.md#")
            .nth(1)
            .map(|a| {
                a.split(|c: char| !(c.is_alphanumeric() || c == '-'))
                    .next()
                    .unwrap()
            })
            .unwrap_or_else(|| panic!("{}: no runbook entry", p["title"]));
        assert!(
            runbook.contains(anchor),
            "{}: docs/operations.md#{anchor}",
            p["title"]
        );
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], uid.as_str());
        }
    }
}

/// The Grafana "Requests by outcome" panel plots each of the per-outcome counters, and no query groups by a label the gate no longer has.
#[test]
fn grafana_plots_every_outcome() {
    let panels = panels(&grafana());
    let (_, _, exprs) = panels
        .iter()
        .find(|(title, _, _)| title == "Requests by outcome")
        .expect("a requests-by-outcome panel");
    for name in quota_gate::io::meter::REQUESTS {
        assert!(
            exprs.iter().any(|e| e.contains(&format!("{name}{{"))),
            "{name} is not plotted: {exprs:?}"
        );
    }
    for (title, _, exprs) in &panels {
        for e in exprs {
            assert!(!e.contains("outcome"), "{title}: {e}");
            assert!(!e.contains("stella_quota_requests_total"), "{title}: {e}");
        }
    }
}

/// The alert rules, as (expression left of the comparison, threshold).
fn alert_rules() -> Vec<(String, f64)> {
    read("prometheus/alerts.yaml")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .map(|expr| {
            let (lhs, rhs) = expr
                .rsplit_once(" >= ")
                .or_else(|| expr.rsplit_once(" > "))
                .unwrap_or_else(|| panic!("{expr}: no threshold"));
            (lhs.to_owned(), rhs.parse().unwrap())
        })
        .collect()
}

/// Every alert rule's expression is plotted on a panel whose red line is the rule's threshold.
#[test]
fn grafana_thresholds_are_the_alert_rules() {
    let rules = alert_rules();
    assert_eq!(rules.len(), 6);
    let panels = panels(&grafana());
    for (expr, threshold) in rules {
        let (title, red, _) = panels
            .iter()
            .find(|(_, _, exprs)| exprs.contains(&expr))
            .unwrap_or_else(|| panic!("no panel plots the alert expression {expr}"));
        assert_eq!(*red, Some(threshold), "{title}");
    }
}

/// `expr` with the dashboard's variables as Grafana fills them for "All".
fn substituted(expr: &str) -> String {
    let q = expr
        .replace("$__rate_interval", "30s")
        .replace("$scope", ".+")
        .replace("$instance", ".+");
    assert!(!q.contains('$'), "unknown variable in {expr}");
    q
}

/// `GET path` on `addr` over HTTP/1.0 (so no chunked body): status and body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query's result vector, or the API's error.
fn query(prometheus: SocketAddr, expr: &str) -> Result<Vec<Value>, String> {
    let (status, body) = get(
        prometheus,
        &format!("/api/v1/query?query={}", url_encoded(expr)),
    );
    let answer: Value =
        serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
    if answer["status"] != "success" {
        return Err(body);
    }
    Ok(answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

fn prometheus_bin() -> PathBuf {
    std::env::var_os("PROMETHEUS_BIN").map_or_else(|| PathBuf::from("prometheus"), PathBuf::from)
}

/// A real Prometheus scraping `targets` every second, killed on drop.
fn start_prometheus(targets: &[SocketAddr], dir: &std::path::Path) -> (KillOnDrop, SocketAddr) {
    let config = dir.join("prometheus.yml");
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    std::fs::write(
        &config,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             scrape_configs:\n  - job_name: quota-gate\n    static_configs:\n      \
             - targets: [{}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let addr = loopback(free_port());
    let child = Command::new(prometheus_bin())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {:?} ({e}): install Debian's prometheus or set PROMETHEUS_BIN",
                prometheus_bin()
            )
        });
    let mut child = KillOnDrop::new(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(wait_for_listener(&mut child, addr, Duration::from_millis(200))
        && get(addr, "/-/ready").0 == 200)
    {
        assert!(Instant::now() < deadline, "prometheus did not get ready");
        std::thread::sleep(Duration::from_millis(200));
    }
    (child, addr)
}

/// Polls `expr` until it returns a sample whose value is at least `min`.
fn wait_for(prometheus: SocketAddr, expr: &str, min: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reached = query(prometheus, expr).unwrap().iter().any(|s| {
            s["value"][1]
                .as_str()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v >= min)
        });
        if reached {
            return;
        }
        assert!(Instant::now() < deadline, "{expr} never reached {min}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// After the scripted run against a real serve, every Grafana panel query parses and returns data from a real Prometheus; serve's JSON logs carry no token or digest.
#[test]
fn grafana_queries_return_data_from_prometheus() {
    let valkey = ValkeyServer::start();
    let key = fixture("ed25519.pub.pem");
    let url = valkey.url();
    let vars = with_vars(
        SCRIPT,
        &[
            ("QUOTA_JWT_PUBLIC_KEY", key.as_str()),
            ("VALKEY_URL", url.as_str()),
            ("QUOTA_LOG_FORMAT", "json"),
            (
                "QUOTA_HASH_SECRET",
                "dashboards-test-secret-0123456789abcdef",
            ),
            ("QUOTA_SERVE_WORKERS", "1"),
        ],
    );
    let (mut serve, addr) = spawn_serve(&vars);
    // A consumer beside it, for the consumer's panels: one job run.
    let scanner = Scanner::new();
    let consumer = loopback(free_port());
    let listen = consumer.to_string();
    let args = ["--from", "-", "--metrics-listen", &listen];
    let mut consume = scanner.consume("g", &args, &[], Stdio::piped());
    let mut jobs = consume.stdin.take().unwrap();
    writeln!(jobs, "{}", job(now_ms())).unwrap();
    scanner.wait_for_ends(1, Duration::from_secs(10));
    assert!(wait_for_listener(
        &mut consume,
        consumer,
        Duration::from_secs(10)
    ));
    let dir = tempfile::tempdir().unwrap();
    let (_prometheus, prometheus) = start_prometheus(&[addr, consumer], dir.path());

    let token = token();
    for t in [None, Some(token.as_str())] {
        let statuses: Vec<String> = (0..4)
            .map(|_| {
                http(addr, &scan_request(t))
                    .lines()
                    .next()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert!(
            statuses[..3].iter().all(|s| s.contains(" 202 ")),
            "{statuses:?}"
        );
        assert!(statuses[3].contains(" 503 "), "backlog_full: {statuses:?}");
    }
    drop(valkey);
    // A subject the gate has not refused (a refused one is answered from
    // its memory of the refusal, store or no store).
    let other = mint(
        Algorithm::EdDSA,
        json!({"iss": "stella-ops.org", "tid": "t-dashboards-2", "exp": now() + 600}),
    );
    let unmetered = http(addr, &scan_request(Some(&other)));
    assert!(
        unmetered.contains("x-stella-quota: unavailable"),
        "{unmetered}"
    );
    wait_for(prometheus, "stella_quota_requests_unmetered_total", 1.0);
    wait_for(prometheus, "count_over_time(process_open_fds[1m])", 3.0);
    wait_for(prometheus, "stella_consumer_lateness_ms_count", 1.0);

    for (title, _, exprs) in panels(&grafana()) {
        for expr in exprs {
            let q = substituted(&expr);
            let result = query(prometheus, &q).unwrap_or_else(|e| panic!("{title}: {q}: {e}"));
            assert!(!result.is_empty(), "{title}: {q} returned no data");
        }
    }

    let logs = stderr_after_term(&mut serve);
    assert!(logs.lines().count() >= 2, "{logs}");
    for line in logs.lines() {
        let doc: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            doc["level"].is_string() && doc["message"].is_string(),
            "{line}"
        );
    }
    assert_nothing_personal(&logs, &[&token]);
}
