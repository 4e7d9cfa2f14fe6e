//! The README's first command, run as a new user would: the real binary,
//! nothing configured, answering the README's curl example.

use quota_gate_testkit as common;

use std::io::{BufRead, BufReader, Read};
use std::process::Command;
use std::time::Duration;

use common::client::{http, post_scan, request};
use common::serve::{spawn_serve, stderr_of};

/// `quota-gate serve` on the embedded default answers POST /scan with 202 and the quota
/// headers, spools one job line per scan on stdout, and serves /healthz and /metrics.
#[test]
fn serve_on_embedded_default() {
    let (mut child, addr) = spawn_serve(&[]);

    let first = http(addr, &post_scan(r#"{"image":"alpine:3.20"}"#));
    assert!(first.starts_with("HTTP/1.1 202 Accepted"), "{first}");
    for header in [
        "x-stella-quota-remaining: 32",
        "x-stella-reset: ",
        "ratelimit-policy: \"daily\";q=33;w=86400",
        "ratelimit: \"daily\";r=32;t=",
        "x-stella-quota-delay-ms: 0",
    ] {
        assert!(first.contains(header), "missing {header:?} in {first}");
    }
    // Pretty-printed, with a number no f64 holds: the job carries it as sent.
    let second = http(
        addr,
        &post_scan("{\n  \"tag\": 12345678901234567890123,\n  \"image\": \"alpine:3.20\"\n}"),
    );
    assert!(second.contains("x-stella-quota-remaining: 31"), "{second}");
    let bad = http(addr, &post_scan(r#"{"img":1}"#));
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");

    let health = http(addr, &request("GET", "/healthz"));
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let metrics = http(addr, &request("GET", "/metrics"));
    assert!(
        metrics.contains("stella_quota_soft_hits_total"),
        "{metrics}"
    );

    child.kill_now();
    let stdout = child.stdout.take().unwrap();
    let raw: Vec<String> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .collect();
    assert!(
        raw.iter()
            .any(|l| l
                .contains(r#""request":{"tag":12345678901234567890123,"image":"alpine:3.20"}"#)),
        "the second job's request, untouched but for whitespace: {raw:?}"
    );
    let lines: Vec<serde_json::Value> = raw
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let (emf, jobs): (Vec<_>, Vec<_>) = lines.into_iter().partition(|l| l.get("_aws").is_some());
    assert_eq!(jobs.len(), 2, "one spooled job per 202, none for the 400");
    assert_eq!(jobs[0]["request"]["image"], "alpine:3.20");
    assert_eq!(emf.len(), 2, "one EMF line per counted scan");
    assert_eq!(emf[0]["Scope"], "ip");
    let stderr = stderr_of(&mut child);
    assert!(
        stderr.contains("development secret"),
        "serve says it uses the dev secret: {stderr}"
    );
}

/// The Lambda bootstrap refuses to start without a hash secret, naming the variable.
#[test]
fn bootstrap_requires_hash_secret() {
    let out = Command::new(env!("CARGO_BIN_EXE_bootstrap"))
        .env_clear()
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("QUOTA_HASH_SECRET"), "{stderr}");
}

/// A stand-in Runtime API: accepts one request on `listener` and returns its
/// request line and headers, and its body.
fn capture_one_request(listener: std::net::TcpListener) -> (Vec<String>, String) {
    use std::io::{BufRead as _, Write as _};
    let (stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut head = Vec::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
        head.push(line.trim_end().to_owned());
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let reply = "HTTP/1.1 202 Accepted\r\ncontent-length: 16\r\n\r\n{\"status\":\"OK\"}";
    (&stream).write_all(reply.as_bytes()).unwrap();
    (head, String::from_utf8(body).unwrap())
}

/// Under a Lambda runtime, a configuration error at cold start is posted to the
/// Runtime API as the function's init error, naming the variable, before the
/// process exits non-zero. `AWS_LAMBDA_RUNTIME_API` is `host:port` in Lambda
/// and a URL with a path prefix under `cargo lambda watch`; both are served.
#[test]
fn bootstrap_reports_config_error_to_runtime_api() {
    for (form, prefix) in [("lambda", ""), ("cargo-lambda", "/.rt/bootstrap")] {
        let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = api.local_addr().unwrap();
        let value = match form {
            "lambda" => addr.to_string(),
            _ => format!("http://{addr}{prefix}"),
        };
        let server = std::thread::spawn(move || capture_one_request(api));
        let out = Command::new(env!("CARGO_BIN_EXE_bootstrap"))
            .env_clear()
            .env("AWS_LAMBDA_RUNTIME_API", value)
            .env("QUOTA_HARD_DELAY_MS", "18446744073709551615")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let (head, body) = server.join().unwrap();
        assert_eq!(
            head[0],
            format!("POST {prefix}/2018-06-01/runtime/init/error HTTP/1.1"),
            "{form}"
        );
        assert!(
            head.iter().any(|h| h
                .eq_ignore_ascii_case("lambda-runtime-function-error-type: Runtime.ConfigError")),
            "{head:?}"
        );
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["errorType"], "Runtime.ConfigError");
        let message = body["errorMessage"].as_str().unwrap();
        assert!(message.starts_with("QUOTA_HARD_DELAY_MS"), "{message}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("QUOTA_HARD_DELAY_MS"), "{stderr}");
    }
}

/// `HEAD /healthz` is 200 like `GET`; `/scan/` (trailing slash) is 404, as
/// docs/guide.md's error table says.
#[test]
fn healthz_head_and_exact_scan_path() {
    let (_serve, addr) = spawn_serve(&[]);
    let head = http(addr, &request("HEAD", "/healthz"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(!head.ends_with("ok\n"), "HEAD has no body: {head}");
    let slash = http(
        addr,
        &post_scan(r#"{"image":"alpine:3.20"}"#).replacen("/scan", "/scan/", 1),
    );
    assert!(slash.starts_with("HTTP/1.1 404"), "{slash}");
}

/// `quota-gate stats` without AWS configuration says what to set, in a
/// sentence, not the SDK's error chain; a bad `--since` is refused first.
#[test]
fn stats_without_aws_configuration_says_what_to_set() {
    let home = tempfile::tempdir().unwrap();
    let stats_since = |since: &str, vars: &[(&str, &str)]| {
        Command::new(env!("CARGO_BIN_EXE_quota-gate"))
            .args(["stats", "--since", since])
            .env_clear()
            .env("HOME", home.path())
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .envs(vars.iter().copied())
            .output()
            .unwrap()
    };
    let stats = |vars: &[(&str, &str)]| stats_since("1h", vars);
    // A bad window is a wrong command line (exit 2), said before AWS is looked at.
    for bad in ["10x", "0s"] {
        let out = stats_since(bad, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(
            stderr.contains("--since") && !stderr.contains("AWS_REGION"),
            "{stderr}"
        );
    }
    let out = stats(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("AWS_REGION"), "{stderr}");
    assert!(stderr.len() < 400, "{} bytes: {stderr}", stderr.len());
    let out = stats(&[("AWS_REGION", "eu-west-1")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("AWS_ACCESS_KEY_ID"), "{stderr}");
    assert!(stderr.len() < 400, "{} bytes: {stderr}", stderr.len());
}

/// A bad value stops `serve` at start with the variable's name.
#[test]
fn bad_configuration_names_the_variable() {
    let out = Command::new(env!("CARGO_BIN_EXE_quota-gate"))
        .arg("serve")
        .env_clear()
        .env("QUOTA_ANON", "lots")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("QUOTA_ANON"));
}

/// SIGTERM stops `serve` gracefully: a scan asleep in its soft delay still gets its 202,
/// then the process exits cleanly.
#[test]
fn sigterm_finishes_requests_in_flight() {
    let (mut child, addr) = spawn_serve(&[("QUOTA_ANON", "1"), ("QUOTA_SOFT_DELAY_MS", "1500")]);
    assert!(http(addr, &post_scan(r#"{"image":"a"}"#)).starts_with("HTTP/1.1 202"));
    // The second scan is over quota: it sleeps 1.5 s before its answer.
    let in_flight = std::thread::spawn(move || http(addr, &post_scan(r#"{"image":"a"}"#)));
    std::thread::sleep(Duration::from_millis(300));
    common::consumer::signal(child.id(), "TERM");
    let answer = in_flight.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    assert!(answer.contains("x-stella-quota-delay-ms: 1500"), "{answer}");
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
    // The non-blocking log writer is drained before the process exits.
    let stderr = stderr_of(&mut child);
    assert!(stderr.contains("shutting down"), "{stderr}");
}
