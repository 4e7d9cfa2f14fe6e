//! `quota-gate consume` as a real process, against `serve`, a real
//! `valkey-server` and a moto SQS: every job starts no sooner than its
//! `notBefore` (and within a second after it), each `scanId` runs once
//! across consumers, crashes, redeliveries and a stalled Valkey.
//!
//! The scanner is a shell script that appends `start <unix ms> <scanId>
//! <consumer>` (and `end …` when it finishes) to a log file; the tests read
//! the log back. Delays are hundreds of milliseconds and leases a few
//! seconds, so the whole file runs in well under a minute.

use quota_gate_testkit as common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::client::{post_scan, send};
use common::consumer::*;
use common::moto::MotoServer;
use common::serve::spawn_serve;
use common::*;
use redis::AsyncCommands;
use serde_json::{Value, json};

/// Sends `n` scans at once from one address; the 202 bodies.
fn burst(addr: std::net::SocketAddr, n: usize) -> Vec<Value> {
    let threads: Vec<_> = (0..n)
        .map(|i| {
            std::thread::spawn(move || {
                let body = format!(r#"{{"image":"alpine:3.{i}"}}"#);
                send(addr, post_scan(&body).as_bytes(), Duration::from_secs(10)).unwrap()
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| {
            let (status, text) = t.join().unwrap();
            assert_eq!(status, 202, "{text}");
            let (_, body) = text.split_once("\r\n\r\n").unwrap();
            serde_json::from_str(body).unwrap()
        })
        .collect()
}

/// Over-quota scans from the first on, paced a few hundred ms apart, defer mode.
const PACED: [(&str, &str); 4] = [
    ("QUOTA_ANON", "1"),
    ("QUOTA_SOFT_DELAY_MS", "300"),
    ("QUOTA_HARD_DELAY_MS", "400"),
    ("QUOTA_DELAY_MODE", "defer"),
];

/// Every scan in `expected` (scanId → notBefore ms) started exactly once,
/// no sooner than its notBefore and within a second after it.
fn assert_on_time_once(lines: &[Line], expected: &HashMap<String, i64>) {
    let starts: Vec<&Line> = lines.iter().filter(|l| l.what == "start").collect();
    assert_eq!(starts.len(), expected.len(), "{lines:?}");
    let mut seen = HashMap::new();
    for s in starts {
        *seen.entry(s.scan_id.clone()).or_insert(0) += 1;
        let not_before = expected[&s.scan_id];
        let late = s.at_ms - not_before;
        assert!(late >= 0, "{} started {} ms early", s.scan_id, -late);
        assert!(late < 1000, "{} started {late} ms late", s.scan_id);
    }
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
}

/// serve → Valkey stream → two consumers: a paced burst of over-quota scans
/// starts each no sooner than its notBefore and within 1 s after, each once.
#[tokio::test(flavor = "multi_thread")]
async fn stream_two_consumers_on_time_once() {
    let rig = StreamRig::start();
    let (_serve, addr) = spawn_serve(&rig.vars(&PACED));
    let scanner = &rig.scanner;
    // Each holds at most 4 jobs, so the burst is shared between them.
    let args = ["--lease", "8s", "--max-held", "4"];
    let _a = rig.consume("a", &args, &[]);
    let _b = rig.consume("b", &args, &[]);
    let bodies = burst(addr, 8);
    let expected = not_befores(&bodies);
    let spread = expected.values().max().unwrap() - expected.values().min().unwrap();
    assert!(
        spread >= 2000,
        "paced: the burst spreads over seconds ({spread} ms)"
    );
    let lines = scanner.wait_for_ends(8, Duration::from_secs(20));
    assert_on_time_once(&lines, &expected);
    let tags: std::collections::HashSet<&str> = lines.iter().map(|l| l.tag.as_str()).collect();
    assert_eq!(
        tags.len(),
        2,
        "both consumers ran scans: {lines:?}\n{}\n{}",
        scanner.errors_of("a"),
        scanner.errors_of("b")
    );
    assert_eq!(rig.pending().await, 0, "every entry acknowledged");
}

/// A consumer killed (SIGKILL) in the middle of a scan: the other reclaims
/// the entry once its lease is over and runs it to its end, once.
#[tokio::test(flavor = "multi_thread")]
async fn killed_consumer_job_reclaimed_once() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    let mut a = rig.consume("a", &["--lease", "2s"], &[("SLEEP", "30")]);
    let job = job(now_ms());
    rig.queue(std::slice::from_ref(&job)).await;
    scanner.wait_for("start", 1, Duration::from_secs(10));
    a.kill_now();
    let killed_at = Instant::now();
    let _b = rig.consume("b", &["--lease", "2s"], &[]);
    let lines = scanner.wait_for_ends(1, Duration::from_secs(15));
    assert!(
        killed_at.elapsed() >= Duration::from_secs(2),
        "not before the lease"
    );
    let id = job["scanId"].as_str().unwrap();
    let by = |tag: &str, what: &str| {
        lines
            .iter()
            .filter(|l| l.tag == tag && l.what == what && l.scan_id == id)
            .count()
    };
    assert_eq!((by("a", "start"), by("a", "end")), (1, 0), "{lines:?}");
    assert_eq!((by("b", "start"), by("b", "end")), (1, 1), "{lines:?}");
    assert_eq!(rig.pending().await, 0);
}

/// Valkey stopped (SIGSTOP) for 3 s while two consumers work through a
/// stream: once it resumes, every job runs, and none twice.
#[tokio::test(flavor = "multi_thread")]
async fn valkey_paused_under_load_no_loss_no_twice() {
    let rig = StreamRig::start();
    let args = ["--lease", "8s", "--concurrency", "8"];
    let _a = rig.consume("a", &args, &[]);
    let _b = rig.consume("b", &args, &[]);
    let start = now_ms();
    let mut ids = Vec::new();
    for i in 0..40 {
        let job = job(start + i * 100);
        ids.push(job["scanId"].as_str().unwrap().to_owned());
        xadd(&rig.valkey, "jobs", &job).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    rig.valkey.signal("STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    rig.valkey.signal("CONT");
    let lines = rig.scanner.wait_for_ends(40, Duration::from_secs(40));
    let mut runs: HashMap<&str, usize> = HashMap::new();
    for l in lines.iter().filter(|l| l.what == "start") {
        *runs.entry(l.scan_id.as_str()).or_default() += 1;
    }
    for id in &ids {
        assert_eq!(runs.get(id.as_str()), Some(&1), "{id}: {lines:?}");
    }
    assert_eq!(runs.len(), 40);
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.pending().await != 0 {
        assert!(Instant::now() < deadline, "entries left unacknowledged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The spool pipe `serve | consume --from -`: a paced burst starts each
/// scan no sooner than its notBefore and within 1 s after, each once.
#[tokio::test(flavor = "multi_thread")]
async fn spool_pipe_honours_not_before() {
    let (mut serve, addr) = spawn_serve(&PACED);
    let scanner = Scanner::new();
    let out = serve.stdout.take().unwrap();
    let _c = scanner.consume("pipe", &["--from", "-"], &[], Stdio::from(out));
    let bodies = burst(addr, 6);
    let lines = scanner.wait_for_ends(6, Duration::from_secs(15));
    assert_on_time_once(&lines, &not_befores(&bodies));
}

/// Through SQS (moto): a job whose notBefore is beyond what DelaySeconds
/// covered is held by visibility until then; a message delivered twice
/// (the same job sent twice) runs once.
#[tokio::test(flavor = "multi_thread")]
async fn sqs_visibility_holds_and_duplicates_run_once() {
    let moto = MotoServer::start();
    let valkey = ValkeyServer::start();
    let url = moto.create_queue("scans").await;
    let sqs = aws_sdk_sqs::Client::new(&moto.sdk_config().await);
    let late = job(now_ms() + 3500);
    let twice = job(now_ms());
    for body in [&late, &twice, &twice] {
        sqs.send_message()
            .queue_url(&url)
            .message_body(body.to_string())
            .send()
            .await
            .unwrap();
    }
    let scanner = Scanner::new();
    let aws = moto.process_env();
    let valkey_url = valkey.url();
    let mut vars: Vec<(&str, &str)> = aws.iter().map(|(k, v)| (*k, v.as_str())).collect();
    vars.push(("VALKEY_URL", &valkey_url));
    let _c = scanner.consume(
        "sqs",
        &["--from", &url, "--lease", "5s"],
        &vars,
        Stdio::null(),
    );
    // Held by visibility, not in memory: invisible, and received again later.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(scanner.lines().iter().all(|l| l.scan_id != late["scanId"]));
    let lines = scanner.wait_for_ends(2, Duration::from_secs(20));
    let expected = not_befores(&[late.clone(), twice]);
    let starts: Vec<&Line> = lines.iter().filter(|l| l.what == "start").collect();
    assert_eq!(starts.len(), 2, "the duplicate did not run: {lines:?}");
    for s in starts {
        let late_ms = s.at_ms - expected[&s.scan_id];
        assert!(late_ms >= 0, "started {} ms early", -late_ms);
        assert!(late_ms < 1500, "started {late_ms} ms late");
    }
    let received = moto
        .sqs_messages()
        .into_iter()
        .find(|m| {
            m["body"]
                .as_str()
                .is_some_and(|b| b.contains(late["scanId"].as_str().unwrap()))
        })
        .unwrap();
    assert!(
        received["approximate_receive_count"].as_u64().unwrap_or(0) >= 2,
        "{received}"
    );
    // The duplicate comes back after half a lease, finds the scan done, and is deleted.
    let deadline = Instant::now() + Duration::from_secs(15);
    while queued(&sqs, &url).await != 0 {
        assert!(Instant::now() < deadline, "messages left on the queue");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lines = scanner.lines();
    assert_eq!(
        lines.iter().filter(|l| l.what == "start").count(),
        2,
        "{lines:?}"
    );
}

/// Messages on the queue, visible or not.
async fn queued(sqs: &aws_sdk_sqs::Client, url: &str) -> u64 {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::All)
        .send()
        .await
        .unwrap();
    [
        A::ApproximateNumberOfMessages,
        A::ApproximateNumberOfMessagesNotVisible,
    ]
    .iter()
    .map(|name| {
        attrs
            .attributes()
            .and_then(|a| a.get(name))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    })
    .sum()
}

/// The job contract: every job the gate really writes (within, soft and
/// hard tiers, IP scope) validates against docs/job.schema.json, which
/// requires exactly the fields the type writes but `trace` (which jobs
/// written before it lack), and rejects what a consumer could not honour.
#[tokio::test]
async fn jobs_match_the_published_schema() {
    use quota_gate::io::store::memory::MemoryStore;
    let schema = schema::job_schema();
    let validator = schema::validator(&schema);
    let jobs = RecordingQueue::default();
    let gate = gate(TIERS, MemoryStore::default(), jobs.clone());
    for _ in 0..8 {
        assert_eq!(gate.handle(scan_from("203.0.113.9")).await.status(), 202);
    }
    let written = jobs.json();
    let tiers: std::collections::HashSet<&str> = written
        .iter()
        .map(|j| j["tier"].as_str().unwrap())
        .collect();
    assert_eq!(tiers.len(), 3, "{tiers:?}");
    schema::assert_valid_jobs(&validator, &written);
    let mut required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let mut fields: Vec<&str> = written[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    // Optional in the schema (older jobs lack them), always written.
    required.extend(["trace", "lane"]);
    required.sort_unstable();
    fields.sort_unstable();
    assert_eq!(
        required, fields,
        "the schema names every field the gate writes"
    );
    // An over-quota job names its lane and its tenant too.
    let over = written
        .iter()
        .find(|j| j["lane"] == "over")
        .expect("an over-quota job");
    assert!(over["tenant"].is_string(), "{over}");
    assert!(schema["properties"]["tenant"].is_object());
    for (field, bad) in [
        ("trace", json!({"traceparent": "00-junk"})),
        ("trace", json!({"tracestate": "a=1"})),
        ("scope", json!("cookie")),
        ("tier", json!("gold")),
        ("version", json!(2)),
        ("notBefore", json!("soon")),
        ("scanId", json!("not-a-uuid")),
    ] {
        let mut job = written[0].clone();
        job[field] = bad;
        assert!(!validator.is_valid(&job), "{field}");
    }
}

/// SIGTERM: the running scan finishes within the grace period, the held
/// one is neither run nor acknowledged, and another consumer runs it once
/// after the lease, still no sooner than its notBefore.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_running_and_leaves_held_pending() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    let args = ["--lease", "2s", "--grace", "10s"];
    let mut a = rig.consume("a", &args, &[("SLEEP", "1")]);
    let (running, held) = (job(now_ms()), job(now_ms() + 4000));
    rig.queue(&[running.clone(), held.clone()]).await;
    scanner.wait_for("start", 1, Duration::from_secs(10));
    signal(a.id(), "TERM");
    let status = a.wait().unwrap();
    assert!(status.success(), "{status}: {}", scanner.errors_of("a"));
    let lines = scanner.lines();
    let ran = |job: &Value, what: &str| {
        lines
            .iter()
            .filter(|l| l.what == what && l.scan_id == job["scanId"].as_str().unwrap())
            .count()
    };
    assert_eq!(
        (ran(&running, "start"), ran(&running, "end")),
        (1, 1),
        "finished within the grace"
    );
    assert_eq!(ran(&held, "start"), 0);
    assert_eq!(
        rig.pending().await,
        1,
        "the held job is left pending, not acked"
    );
    let _b = rig.consume("b", &["--lease", "2s"], &[]);
    let lines = scanner.wait_for_ends(2, Duration::from_secs(15));
    let starts: Vec<&Line> = lines
        .iter()
        .filter(|l| l.what == "start" && l.scan_id == held["scanId"].as_str().unwrap())
        .collect();
    assert_eq!(starts.len(), 1, "{lines:?}");
    assert_eq!(starts[0].tag, "b");
    assert!(starts[0].at_ms >= unix_ms(held["notBefore"].as_str().unwrap()));
    assert_eq!(rig.pending().await, 0);
}

/// A scanner that keeps failing: retried with backoff, then the job goes to
/// `<stream>:dead` with its failures and last error, and is acked.
#[tokio::test(flavor = "multi_thread")]
async fn failing_job_dead_lettered_after_max_attempts() {
    let rig = StreamRig::start();
    let scanner = &rig.scanner;
    let failing = format!("{} && exit 3", scanner.exec());
    let args = [
        "--exec",
        &failing,
        "--max-attempts",
        "3",
        "--backoff",
        "100ms",
        "--lease",
        "2s",
    ];
    let mut child = rig.consume("f", &args, &[]);
    let job = job(now_ms());
    rig.queue(std::slice::from_ref(&job)).await;
    let mut c = rig.valkey.client().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    let dead: redis::streams::StreamRangeReply = loop {
        let dead: redis::streams::StreamRangeReply = c.xrange_all("jobs:dead").await.unwrap();
        if !dead.ids.is_empty() {
            break dead;
        }
        assert!(Instant::now() < deadline, "{}", scanner.errors_of("f"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(dead.ids.len(), 1);
    let entry = &dead.ids[0];
    assert_eq!(entry.get::<String>("job").unwrap(), job.to_string());
    assert_eq!(entry.get::<String>("failures").unwrap(), "3");
    assert!(entry.get::<String>("error").unwrap().contains("exit"));
    let starts = scanner.lines().iter().filter(|l| l.what == "start").count();
    assert_eq!(starts, 3, "three attempts");
    assert_eq!(rig.pending().await, 0, "acked once dead-lettered");
    child.kill_now();
}

/// `--post`: the job JSON reaches an HTTP scanner; a 500 is retried, a 204 is done.
#[tokio::test(flavor = "multi_thread")]
async fn post_hands_the_job_to_an_http_scanner() {
    use std::io::{Read, Write};
    let rig = StreamRig::start();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/scan", listener.local_addr().unwrap());
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = bodies.clone();
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().enumerate() {
            let mut conn = conn.unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !String::from_utf8_lossy(&buf).contains("\"request\"") {
                let n = conn.read(&mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf).into_owned());
            let status = if i == 0 {
                "500 Internal Server Error"
            } else {
                "204 No Content"
            };
            let _ = write!(conn, "HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n");
        }
    });
    let _child = rig.consume("p", &["--post", &url, "--backoff", "100ms"], &[]);
    let job = job(now_ms());
    rig.queue(std::slice::from_ref(&job)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let posted = bodies.lock().unwrap().len();
        if posted >= 2 && rig.pending().await == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{}", rig.scanner.errors_of("p"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bodies = bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 2, "one retry after the 500");
    for request in &bodies {
        assert!(request.starts_with("POST /scan HTTP/1.1"), "{request}");
        assert!(
            request
                .to_lowercase()
                .contains("content-type: application/json")
        );
        let (_, body) = request.split_once("\r\n\r\n").unwrap();
        assert_eq!(body, job.to_string());
    }
}

/// `--metrics-listen` serves Prometheus text: after one job from standard
/// input, `GET /metrics` answers 200 with the consumer's counters.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_listen_serves_prometheus_text() {
    let scanner = Scanner::new();
    let addr = loopback(free_port());
    let listen = addr.to_string();
    let mut child = scanner.consume(
        "m",
        &["--from", "-", "--metrics-listen", &listen],
        &[],
        Stdio::piped(),
    );
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, format!("{}\n", job(now_ms())).as_bytes()).unwrap();
    scanner.wait_for_ends(1, Duration::from_secs(10));
    assert!(wait_for_listener(&mut child, addr, Duration::from_secs(10)));
    let request = common::client::get_request("/metrics");
    let (status, text) = send(addr, request.as_bytes(), Duration::from_secs(10)).unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(
        text.contains("stella_consumer_jobs_succeeded_total"),
        "{text}"
    );
    // The consumer's alert rule reads a series this consumer exposes.
    let rules = std::fs::read_to_string(common::root().join("prometheus/alerts.yaml")).unwrap();
    let rule = rules
        .lines()
        .find(|l| l.contains("stella_consumer_lateness_ms_bucket{lane=\"within\"}"))
        .expect("the within-quota dwell rule");
    assert!(rule.trim_start().starts_with("expr:"), "{rule}");
    assert!(
        text.contains(
            "stella_consumer_lateness_ms_bucket{source=\"stdin\",lane=\"within\",le=\"5000\"}"
        ),
        "{text}"
    );
    drop(stdin);
}

/// A spool consumer (`--from -`, with and without `--journal`) SIGTERMed
/// while it holds deferred jobs, its pipe kept open by the writer and lines
/// still coming right at and after the signal: it exits within a few
/// seconds (no read of standard input keeps it alive), and every job
/// written is run, kept in the journal, written back to its stdout, or
/// still unread in the pipe: none is lost.
#[tokio::test(flavor = "multi_thread")]
async fn spool_sigterm_stops_promptly_and_loses_no_line() {
    for journaled in [false, true] {
        spool_sigterm_round(journaled);
    }
}

/// One round of [`spool_sigterm_stops_promptly_and_loses_no_line`].
fn spool_sigterm_round(journaled: bool) {
    use std::io::{Read, Write};
    let SpoolRound {
        scanner,
        journal,
        mut writer,
        mut unread,
        mut child,
        echoed,
    } = SpoolRound::start(journaled);
    let mut written = Vec::new();
    let mut send = |j: Value| {
        writeln!(writer, "{j}").unwrap();
        written.push(j["scanId"].as_str().unwrap().to_owned());
    };
    for _ in 0..3 {
        send(job(now_ms() + 60_000));
    }
    send(job(now_ms()));
    scanner.wait_for("end", 1, Duration::from_secs(10));
    signal(child.id(), "TERM");
    let termed = Instant::now();
    // Right at the signal and while the consumer drains the pipe; then
    // nothing until it has exited, and one more line after.
    for pause in [0, 20, 80, 150] {
        std::thread::sleep(Duration::from_millis(pause));
        send(job(now_ms() + 60_000));
    }
    let status = wait_exit(&mut child, termed + Duration::from_secs(5), &scanner);
    assert!(status.success(), "{status}: {}", scanner.errors_of("a"));
    send(job(now_ms() + 60_000));
    drop(writer);
    let mut left = String::new();
    unread.read_to_string(&mut left).unwrap();
    let echoed = echoed.join().unwrap();
    let kept = std::fs::read_to_string(&journal).unwrap_or_default();
    let ran: Vec<String> = scanner.of("start").into_iter().map(|l| l.scan_id).collect();
    let places = [("stdout", &echoed), ("journal", &kept), ("unread", &left)];
    for id in &written {
        let found = places.iter().any(|(_, text)| text.contains(id.as_str()));
        assert!(
            found || ran.contains(id),
            "journaled={journaled}: {id} lost\n{places:#?}\nran: {ran:?}\n{}",
            scanner.errors_of("a")
        );
    }
}

/// A spool consumer SIGTERMed while a writer keeps writing into its pipe
/// for longer than its stop may read (`DRAIN_MAX`, 2 s), every write
/// ending in the middle of a line (its scanId in the part written): it
/// stops reading at the cap, and every line written is run, kept in the
/// journal, written back to its stdout, or still unread in the pipe, and
/// what is unread starts at a line's start (no line's tail left behind).
#[test]
fn spool_sigterm_under_a_writer_that_never_pauses() {
    for journaled in [false, true] {
        nonstop_round(journaled);
    }
}

/// One round of [`spool_sigterm_under_a_writer_that_never_pauses`].
fn nonstop_round(journaled: bool) {
    use std::io::{Read, Write};
    use std::sync::{Arc, atomic::AtomicBool, atomic::Ordering};
    let mut r = SpoolRound::start(journaled);
    let due = job(now_ms());
    writeln!(r.writer, "{due}").unwrap();
    r.scanner.wait_for("end", 1, Duration::from_secs(10));
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let writing = std::thread::spawn(move || nonstop_writer(r.writer, &stopped));
    std::thread::sleep(Duration::from_millis(300));
    signal(r.child.id(), "TERM");
    let termed = Instant::now();
    let status = wait_exit(&mut r.child, termed + Duration::from_secs(5), &r.scanner);
    let took = termed.elapsed();
    stop.store(true, Ordering::Relaxed);
    assert!(status.success(), "{status}: {}", r.scanner.errors_of("a"));
    let mut left = String::new();
    r.unread.read_to_string(&mut left).unwrap();
    let mut written = writing.join().unwrap();
    written.push(due["scanId"].as_str().unwrap().to_owned());
    assert!(
        took >= Duration::from_millis(1500),
        "the cap was hit: {took:?}"
    );
    let kept = std::fs::read_to_string(&r.journal).unwrap_or_default();
    let ran: Vec<String> = r
        .scanner
        .of("start")
        .into_iter()
        .map(|l| l.scan_id)
        .collect();
    let places = [r.echoed.join().unwrap(), kept, left.clone()].map(|text| scan_ids(&text));
    let lost: Vec<&String> = written
        .iter()
        .filter(|id| !ran.contains(id) && !places.iter().any(|p| p.contains(*id)))
        .collect();
    assert!(
        lost.is_empty(),
        "journaled={journaled}: {} of {} lines lost: {lost:?}\n{}",
        lost.len(),
        written.len(),
        r.scanner.errors_of("a")
    );
    for line in left.lines() {
        let whole = serde_json::from_str::<Value>(line).is_ok_and(|j| j["scanId"].is_string());
        assert!(
            whole,
            "journaled={journaled}: a broken line left in the pipe: {line}"
        );
    }
}

/// Writes held jobs to `out` until `stop`, five lines every 5 ms, each
/// write ending after the scanId of its last line; then that line's rest.
/// The scanIds written, in order.
fn nonstop_writer(
    mut out: std::io::PipeWriter,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<String> {
    use std::io::Write;
    let mut ids = Vec::new();
    let mut rest = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut chunk = std::mem::take(&mut rest);
        for _ in 0..5 {
            let job = job(now_ms() + 60_000);
            let id = job["scanId"].as_str().unwrap().to_owned();
            let line = format!("{job}\n").into_bytes();
            chunk.extend_from_slice(&line);
            ids.push(id);
        }
        // The last line cut just after its scanId.
        let last = String::from_utf8_lossy(&chunk)
            .rfind(ids.last().unwrap().as_str())
            .unwrap();
        let cut = last + ids.last().unwrap().len() + 1;
        rest = chunk.split_off(cut);
        out.write_all(&chunk).unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    out.write_all(&rest).unwrap();
    ids
}

/// The thread that reads standard input: a spool consumer with a regular
/// file on stdin, far more jobs than its stop may journal before the cap,
/// SIGTERMed early. The jobs it took are a prefix of the file (the rest is
/// never read), each run, journaled or written back: none is missing
/// before the last one taken.
#[test]
fn spool_sigterm_with_a_file_on_stdin_loses_no_line() {
    use std::io::Write;
    let scanner = Scanner::new();
    let journal = scanner.dir.path().join("journal");
    let path = scanner.dir.path().join("jobs");
    let mut jobs = vec![job(now_ms())];
    jobs.extend((0..FILE_JOBS).map(|_| job(now_ms() + 60_000)));
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    for j in &jobs {
        writeln!(file, "{j}").unwrap();
    }
    file.into_inner().unwrap().sync_all().unwrap();
    let stdin = Stdio::from(std::fs::File::open(&path).unwrap());
    let mut child = spool_consumer(&scanner, Some(&journal), stdin);
    let echoed = read_all(child.stdout.take().unwrap());
    scanner.wait_for("end", 1, Duration::from_secs(10));
    signal(child.id(), "TERM");
    let termed = Instant::now();
    let status = wait_exit(&mut child, termed + Duration::from_secs(5), &scanner);
    assert!(status.success(), "{status}: {}", scanner.errors_of("a"));
    let kept = std::fs::read_to_string(&journal).unwrap_or_default();
    let ran: Vec<String> = scanner.of("start").into_iter().map(|l| l.scan_id).collect();
    let places = [echoed.join().unwrap(), kept].map(|text| scan_ids(&text));
    let taken: Vec<bool> = jobs
        .iter()
        .map(|j| j["scanId"].as_str().unwrap().to_owned())
        .map(|id| ran.contains(&id) || places.iter().any(|p| p.contains(&id)))
        .collect();
    let last = taken.iter().rposition(|t| *t).unwrap();
    assert!(
        last + 1 < jobs.len(),
        "the cap was hit: the file was not read to its end"
    );
    let missing: Vec<usize> = (0..=last).filter(|i| !taken[*i]).collect();
    assert!(
        missing.is_empty(),
        "lines {missing:?} of the {} taken lost\n{}",
        last + 1,
        scanner.errors_of("a")
    );
}

/// Jobs in the file of [`spool_sigterm_with_a_file_on_stdin_loses_no_line`].
const FILE_JOBS: usize = 100_000;

/// The scanIds of `text`'s JSON lines.
fn scan_ids(text: &str) -> std::collections::HashSet<String> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|j| j["scanId"].as_str().map(str::to_owned))
        .collect()
}

/// Everything `out` gives until its end, read by a thread.
/// A spool consumer reading a pipe of the test's, for the SIGTERM rounds.
struct SpoolRound {
    scanner: Scanner,
    journal: std::path::PathBuf,
    writer: std::io::PipeWriter,
    /// Our own read end: whatever the consumer never took stays readable here.
    unread: std::io::PipeReader,
    child: KillOnDrop,
    /// Its stdout (the lines it wrote back), read to its end.
    echoed: std::thread::JoinHandle<String>,
}

impl SpoolRound {
    /// A consumer on a new pipe, with a journal if `journaled`.
    fn start(journaled: bool) -> Self {
        let scanner = Scanner::new();
        let journal = scanner.dir.path().join("journal");
        let (reader, writer) = std::io::pipe().unwrap();
        let unread = reader.try_clone().unwrap();
        let mut child = spool_consumer(&scanner, journaled.then_some(&journal), reader.into());
        let echoed = read_all(child.stdout.take().unwrap());
        Self {
            scanner,
            journal,
            writer,
            unread,
            child,
            echoed,
        }
    }
}

fn read_all(mut out: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        out.read_to_string(&mut text).unwrap();
        text
    })
}

/// `quota-gate consume --from -` (with `journal`, if given) on `stdin`,
/// running `scanner`, its stdout piped.
fn spool_consumer(
    scanner: &Scanner,
    journal: Option<&std::path::Path>,
    stdin: Stdio,
) -> KillOnDrop {
    let errors = std::fs::File::create(scanner.dir.path().join("a.err")).unwrap();
    let mut cmd = std::process::Command::new(bin("quota-gate"));
    cmd.args(["consume", "--no-emf", "--from", "-", "--exec"])
        .arg(scanner.exec())
        .args(["--scanner-env", SCANNER_VARS]);
    if let Some(journal) = journal {
        cmd.arg("--journal").arg(journal);
    }
    let child = cmd
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("LOG", scanner.log())
        .env("RUNS", scanner.dir.path().join("runs"))
        .env("TAG", "a")
        .env("RUST_LOG", "info")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(errors)
        .spawn()
        .unwrap();
    KillOnDrop::new(child)
}

/// Waits for `child` to exit, failing the test at `deadline`.
fn wait_exit(
    child: &mut KillOnDrop,
    deadline: Instant,
    scanner: &Scanner,
) -> std::process::ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "still running after SIGTERM: {}",
            scanner.errors_of("a")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
