//! The Lambda logs are JSON lines with the runtime's request id and nothing
//! personal, and every request's lines, EMF lines and job carry the trace
//! the runtime was given (`Lambda-Runtime-Trace-Id`, which the emulator
//! sends as Lambda does): the sample events go through the real runtime emulator
//! (`cargo lambda watch --only-lambda-apis`, `cargo lambda invoke`) to the
//! built `bootstrap` with `AWS_LAMBDA_LOG_FORMAT=JSON`, as the template's
//! `LogFormat: JSON` sets it. Needs `cargo-lambda` on `PATH`.

use quota_gate_testkit as common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::process::{Command, Stdio};

use common::lambda::Emulator;
use common::serve::stderr_of;
use common::*;
use serde_json::Value;

/// The source address of a sample event, without a `/32` or `/128` suffix.
fn source_ip(event: &Value) -> String {
    let context = &event["requestContext"];
    let ip = context["http"]["sourceIp"]
        .as_str()
        .or_else(|| context["identity"]["sourceIp"].as_str())
        .unwrap();
    ip.split('/').next().unwrap().to_owned()
}

/// Sample events through the real runtime emulator to `bootstrap` with the
/// template's JSON log format: every log line is JSON with the runtime's
/// request id, and no line (log or EMF) carries an IP, a token or a digest.
#[test]
fn lambda_logs_are_json_with_the_request_id() {
    let valkey = ValkeyServer::start();
    let mut emulator = Emulator::start();
    let secret = "dashboards-test-secret-0123456789abcdef";
    let bootstrap = KillOnDrop::new(
        Command::new(bin("bootstrap"))
            .env_clear()
            .env("AWS_LAMBDA_RUNTIME_API", emulator.runtime_api())
            .env("AWS_LAMBDA_FUNCTION_NAME", "_")
            .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
            .env("QUOTA_HASH_SECRET", secret)
            .env("QUOTA_JWT_PUBLIC_KEY", fixture("ed25519.pub.pem"))
            .env("VALKEY_URL", valkey.url())
            .env("QUOTA_BREAKER_FAILURES", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let events = [
        "http-api-v2-ipv4.json",
        "http-api-v2-ipv6.json",
        "http-api-v2-token.json",
        "rest-v1.json",
        "function-url.json",
        "http-api-v2-bad-body.json",
    ];
    let invoke = |event: &str| {
        let out = emulator.invoke(&format!("events/{event}"));
        (!out.status.success()).then(|| format!("{event}: {out:?}"))
    };
    let mut failed: Vec<String> = events.iter().filter_map(|e| invoke(e)).collect();
    // The store goes away: each scan is accepted unmetered and says so in a warning.
    drop(valkey);
    failed.extend(events[..5].iter().filter_map(|e| invoke(e)));
    let (stdout, stderr) = finish(bootstrap);
    emulator.stop();
    assert!(
        failed.is_empty(),
        "{failed:?}\nbootstrap's stderr:\n{stderr}"
    );

    let mut request_ids = BTreeSet::new();
    let (mut xray_of, mut trace_of) = (BTreeMap::new(), BTreeMap::new());
    for line in stderr.lines() {
        let doc: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            doc["level"].is_string() && doc["message"].is_string(),
            "{line}"
        );
        if let Some(id) = doc["span"]["requestId"].as_str() {
            request_ids.insert(id.to_owned());
            let span = &doc["span"];
            if let Some(xray) = span["xrayTraceId"].as_str() {
                xray_of.insert(id.to_owned(), xray_trace_id(xray));
            }
            if let Some(trace) = span["traceId"].as_str() {
                trace_of.insert(id.to_owned(), trace.to_owned());
            }
        }
    }
    // Each invocation's trace is the X-Ray trace the runtime was given.
    assert!(
        trace_of.len() >= 5,
        "the request span carries its trace: {stderr}"
    );
    // Where a line of the runtime's own span names an invocation's X-Ray
    // trace (that span ends without a line of its own), the request's
    // lines carry the same trace.
    let traced: BTreeSet<String> = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|doc| doc["span"]["traceId"].as_str().map(str::to_owned))
        .collect();
    assert!(!xray_of.is_empty(), "{stderr}");
    for (id, xray) in &xray_of {
        assert!(traced.contains(xray), "{id}: {xray}: {stderr}");
    }
    assert!(
        request_ids.len() >= 5,
        "a warning with its own request id per unmetered scan: {stderr}"
    );
    let emf: Vec<&str> = stdout.lines().filter(|l| l.contains("\"_aws\"")).collect();
    assert!(emf.len() >= 9, "{stdout}");
    // The EMF lines and the spooled jobs carry the traces of the logs.
    for line in stdout.lines() {
        let doc: Value = serde_json::from_str(line).unwrap();
        let trace = match doc["trace"]["traceparent"].as_str() {
            Some(traceparent) => traceparent[3..35].to_owned(),
            None => doc["traceId"].as_str().unwrap_or_default().to_owned(),
        };
        let store_line = doc.get("Process").is_some();
        assert!(store_line || traced.contains(&trace), "{line}");
    }
    let mut secrets: Vec<String> = events
        .iter()
        .map(|e| source_ip(&serde_json::from_str(&event_text(e)).unwrap()))
        .collect();
    secrets.push(event_token("http-api-v2-token.json"));
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    assert_nothing_personal(&stderr, &secrets);
    assert_nothing_personal(&emf.join("\n"), &secrets);
}

/// The 32 hex digits of an X-Ray header's `Root=1-<8>-<24>`.
fn xray_trace_id(header: &str) -> String {
    let root = header
        .split(';')
        .find_map(|f| f.strip_prefix("Root=1-"))
        .unwrap();
    root.replace('-', "")
}

/// Stops `child` and returns its stdout and stderr.
fn finish(mut child: KillOnDrop) -> (String, String) {
    child.kill_now();
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    (stdout, stderr_of(&mut child))
}
