//! One trace from the request to the scanner: a client's `traceparent` sent
//! to `quota-gate serve` comes out, with the same trace id, in the job on
//! every backend (the spool, a Valkey stream, SQS's `AWSTraceHeader` and
//! message attributes, read back from moto), in the request's log lines
//! (with the steps' spans and their durations) and EMF line, and in the
//! scanner's environment under `quota-gate consume`. The Lambda path takes
//! the invocation's X-Ray context the same way. A malformed `traceparent`,
//! an oversized `tracestate` and no context at all are answered as before.

use quota_gate_testkit as common;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;
use common::client::{build, send};
use common::consumer::{job, now_ms};
use common::moto::MotoServer;
use common::serve::{spawn_serve, stderr_of};
use common::*;
use quota_gate::io::store::memory::MemoryStore;
use serde_json::Value;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
const XRAY: &str = "Root=1-4bf92f35-77b34da6a3ce929d0e0e4736;Parent=00f067aa0ba902b7;Sampled=1";

/// `POST /scan` with `headers`: the status and the response's scanId.
fn post(addr: SocketAddr, headers: &[(&str, &str)]) -> (u16, String) {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    let request = build("POST", "/scan", &all, SCAN_BODY);
    let (status, text) = send(addr, request.as_bytes(), Duration::from_secs(10)).unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let doc: Value = serde_json::from_str(body).unwrap_or_default();
    (
        status,
        doc["scanId"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The lines of `serve`'s stdout, as they come.
fn stdout_lines(child: &mut KillOnDrop) -> Receiver<String> {
    let (tx, rx) = channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// The next lines, until `n` job lines and `n` EMF lines came: (jobs, EMF).
fn jobs_and_emf(rx: &Receiver<String>, n: usize) -> (Vec<Value>, Vec<Value>) {
    let (mut jobs, mut emf) = (Vec::new(), Vec::new());
    while jobs.len() < n || emf.len() < n {
        let line = rx.recv_timeout(Duration::from_secs(10)).expect("a line");
        let doc: Value = serde_json::from_str(&line).unwrap();
        if doc.get("_aws").is_some() {
            emf.push(doc);
        } else if doc.get("scanId").is_some() {
            jobs.push(doc);
        }
    }
    (jobs, emf)
}

/// Stops `serve` with SIGTERM (it drains) and returns its stderr.
fn stop(mut child: KillOnDrop) -> String {
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let _ = child.wait();
    stderr_of(&mut child)
}

/// The trace id in a job's `traceparent`.
fn job_trace_id(job: &Value) -> String {
    let tp = job["trace"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("{job}"));
    assert_eq!(tp.len(), 55, "{tp}");
    tp[3..35].to_owned()
}

/// Through `serve` to the spool: the client's trace in the job, the EMF
/// line and every log line of the request, including the steps' spans
/// with their durations; a malformed traceparent, an oversized tracestate
/// and no context are answered as before, each under a trace of its own.
#[test]
fn serve_carries_the_trace_to_the_spool_the_logs_and_emf() {
    let (mut serve, addr) = spawn_serve(&[("QUOTA_LOG_FORMAT", "json")]);
    let lines = stdout_lines(&mut serve);
    let huge = format!("a={}", "x".repeat(600));
    let requests: [&[(&str, &str)]; 4] = [
        &[("traceparent", TP), ("tracestate", STATE)],
        &[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        )],
        &[("traceparent", TP), ("tracestate", &huge)],
        &[],
    ];
    let mut scan_ids = Vec::new();
    for headers in requests {
        let (status, scan_id) = post(addr, headers);
        assert_eq!(status, 202, "{headers:?}");
        scan_ids.push(scan_id);
    }
    let (jobs, emf) = jobs_and_emf(&lines, 4);
    let queued: Vec<&str> = jobs.iter().map(|j| j["scanId"].as_str().unwrap()).collect();
    assert_eq!(queued, scan_ids);
    let stderr = stop(serve);
    // The client's context, unchanged; a malformed one replaced by a new trace.
    assert_eq!(
        jobs[0]["trace"],
        serde_json::json!({"traceparent": TP, "tracestate": STATE})
    );
    assert_ne!(job_trace_id(&jobs[1]), TRACE_ID);
    assert_eq!(jobs[2]["trace"], serde_json::json!({"traceparent": TP}));
    assert_ne!(job_trace_id(&jobs[3]), job_trace_id(&jobs[1]));
    for (job, line) in jobs.iter().zip(&emf) {
        assert_eq!(
            line["traceId"].as_str(),
            Some(job_trace_id(job).as_str()),
            "{line}"
        );
        let dimensions = &line["_aws"]["CloudWatchMetrics"][0]["Dimensions"];
        assert_eq!(dimensions, &serde_json::json!([["Scope"]]));
    }
    let logs: Vec<Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of_trace: Vec<&Value> = logs
        .iter()
        .filter(|l| l["span"]["traceId"] == TRACE_ID)
        .collect();
    for step in ["count", "enqueue"] {
        let closed = of_trace
            .iter()
            .find(|l| l["span"]["name"] == step && l["message"] == "close")
            .unwrap_or_else(|| panic!("no {step} span closed: {stderr}"));
        assert!(closed["time.busy"].is_string(), "{closed}");
    }
    // The request's own span ends without a line: a refused request
    // writes none.
    assert!(
        !of_trace
            .iter()
            .any(|l| l["span"]["name"] == "request" && l["message"] == "close"),
        "{stderr}"
    );
}

/// Through `serve` to a Valkey stream: the job carries the client's trace.
#[test]
fn serve_carries_the_trace_to_the_stream() {
    let valkey = ValkeyServer::start();
    let url = valkey.url();
    let vars = [
        ("VALKEY_URL", url.as_str()),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
    ];
    let (serve, addr) = spawn_serve(&vars);
    assert_eq!(post(addr, &[("traceparent", TP)]).0, 202);
    drop(serve);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let jobs = runtime.block_on(stream_jobs(&valkey, "jobs"));
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["trace"]["traceparent"], TP);
}

/// Through `serve` to SQS (moto): `AWSTraceHeader` in X-Ray form and the
/// `traceparent`/`tracestate` message attributes, as a consumer reads them.
#[test]
fn serve_carries_the_trace_to_sqs() {
    let moto = MotoServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let queue = runtime.block_on(moto.create_queue("scans"));
    let endpoint = moto.endpoint();
    let vars = [
        ("SCAN_QUEUE_URL", queue.as_str()),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let (serve, addr) = spawn_serve(&vars);
    assert_eq!(
        post(addr, &[("traceparent", TP), ("tracestate", STATE)]).0,
        202
    );
    drop(serve);
    let message = runtime.block_on(async {
        let sqs = aws_sdk_sqs::Client::new(&moto.sdk_config().await);
        let received = sqs
            .receive_message()
            .queue_url(&queue)
            .message_system_attribute_names(MessageSystemAttributeName::AwsTraceHeader)
            .message_attribute_names("All")
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        received.messages.unwrap_or_default().remove(0)
    });
    let system = message.attributes.clone().unwrap_or_default();
    let trace_header = system.get(&MessageSystemAttributeName::AwsTraceHeader);
    assert_eq!(trace_header.map(String::as_str), Some(XRAY), "{message:?}");
    let attributes = message.message_attributes.clone().unwrap_or_default();
    let text = |name: &str| attributes.get(name).and_then(|a| a.string_value.clone());
    assert_eq!(text("traceparent").as_deref(), Some(TP));
    assert_eq!(text("tracestate").as_deref(), Some(STATE));
    let job: Value = serde_json::from_str(message.body().unwrap()).unwrap();
    assert_eq!(job["trace"]["traceparent"], TP);
}

/// `quota-gate consume` gives the scanner the job's trace in its
/// environment, and its own log lines about the job carry the trace id; a
/// job without a trace gives the scanner none, whatever the consumer had.
#[test]
fn consume_hands_the_trace_to_the_scanner() {
    let dir = tempfile::tempdir().unwrap();
    let mut traced = job(now_ms());
    traced["trace"] = serde_json::json!({"traceparent": TP, "tracestate": STATE});
    let plain = job(now_ms());
    let script = "printenv TRACEPARENT TRACESTATE _X_AMZN_TRACE_ID > \"$OUT/$SCAN_ID\"; \
                  echo status $? >> \"$OUT/$SCAN_ID\"";
    let mut consumer = Command::new(bin("quota-gate"))
        .args(["consume", "--from", "-", "--no-emf", "--exec", script])
        .args(["--scanner-env", "OUT"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("OUT", dir.path())
        .env("QUOTA_LOG_FORMAT", "json")
        .env(
            "TRACEPARENT",
            "00-11111111111111111111111111111111-1111111111111111-01",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = consumer.stdin.take().unwrap();
    for job in [&traced, &plain] {
        writeln!(stdin, "{job}").unwrap();
    }
    drop(stdin);
    let out = consumer.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let env_of = |job: &Value| {
        let path = dir.path().join(job["scanId"].as_str().unwrap());
        std::fs::read_to_string(path).unwrap_or_default()
    };
    assert_eq!(
        env_of(&traced),
        format!("{TP}\n{STATE}\n{XRAY}\nstatus 0\n")
    );
    assert_eq!(env_of(&plain), "status 1\n", "no trace: none passed on");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let carried = stderr.lines().any(|l| {
        let doc: Value = serde_json::from_str(l).unwrap_or_default();
        doc["span"]["traceId"] == TRACE_ID && doc["span"]["scanId"] == traced["scanId"]
    });
    assert!(carried, "a consumer line with the job's trace: {stderr}");
}

/// The Lambda path: the invocation's X-Ray context (what the runtime got
/// as `Lambda-Runtime-Trace-Id`) is the request's trace, over a client's
/// `traceparent`; the job and the EMF line carry it.
#[tokio::test]
async fn lambda_takes_the_invocations_xray_context() {
    use lambda_http::RequestExt;
    let queue = RecordingQueue::default();
    let emf = Capture::default();
    let gate = metered_gate(&[], MemoryStore::default(), queue.clone(), emf.meter());
    let mut context = lambda_runtime::Context::default();
    context.xray_trace_id =
        Some(XRAY.replace("Parent=00f067aa0ba902b7", "Parent=53995c3f42cd8ad8"));
    context.request_id = "req-1".into();
    let mut request = event("http-api-v2-ipv4.json").with_lambda_context(context);
    let other = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01";
    request
        .headers_mut()
        .insert("traceparent", other.parse().unwrap());
    let answer = gate
        .handle(quota_gate::front::lambda::to_gate_request(request))
        .await;
    assert_eq!(answer.status(), 202);
    let job = serde_json::to_value(queue.last()).unwrap();
    assert_eq!(
        job["trace"]["traceparent"],
        "00-4bf92f3577b34da6a3ce929d0e0e4736-53995c3f42cd8ad8-01"
    );
    let line: Value = serde_json::from_str(emf.text().lines().last().unwrap()).unwrap();
    assert_eq!(line["traceId"], TRACE_ID);
}
