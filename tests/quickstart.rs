//! The README's first command, run as a new user would: the real binary,
//! nothing configured, answering the README's curl example.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{free_port, wait_for_port};

/// Sends one raw HTTP/1.1 request and returns the whole response text.
fn http(addr: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn post_scan(body: &str) -> String {
    format!(
        "POST /scan HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// `quota-gate serve` with nothing configured but `vars`, on a free port,
/// listening; stdout and stderr are piped for the test to read.
fn spawn_serve(vars: &[(&str, &str)]) -> (Child, SocketAddr) {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_quota-gate"))
        .arg("serve")
        .env_clear()
        .env("QUOTA_LISTEN", format!("127.0.0.1:{port}"))
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    assert!(
        wait_for_port(addr, Duration::from_secs(10)),
        "serve did not listen"
    );
    (child, addr)
}

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
    let second = http(addr, &post_scan(r#"{"image":"alpine:3.20"}"#));
    assert!(second.contains("x-stella-quota-remaining: 31"), "{second}");
    let bad = http(addr, &post_scan(r#"{"img":1}"#));
    assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");

    let health = http(
        addr,
        "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let metrics = http(
        addr,
        "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    );
    assert!(
        metrics.contains("stella_quota_soft_hits_total"),
        "{metrics}"
    );

    let _ = child.kill();
    let stdout = child.stdout.take().unwrap();
    let lines: Vec<serde_json::Value> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .map(|l| serde_json::from_str(&l).unwrap())
        .collect();
    let (emf, jobs): (Vec<_>, Vec<_>) = lines.into_iter().partition(|l| l.get("_aws").is_some());
    assert_eq!(jobs.len(), 2, "one spooled job per 202, none for the 400");
    assert_eq!(jobs[0]["request"]["image"], "alpine:3.20");
    assert_eq!(emf.len(), 2, "one EMF line per counted scan");
    assert_eq!(emf[0]["Scope"], "ip");
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        stderr.contains("development secret"),
        "serve says it uses the dev secret: {stderr}"
    );
    let _ = child.wait();
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
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let answer = in_flight.join().unwrap();
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    assert!(answer.contains("x-stella-quota-delay-ms: 1500"), "{answer}");
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}
