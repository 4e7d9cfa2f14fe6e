//! What a self-hosting operator runs the binary with, checked on the real
//! binary and a real `valkey-server`: `/readyz` of `serve` and of `consume
//! --health-listen` follows the store (paused with `SIGSTOP`, resumed with
//! `SIGCONT`) while `/healthz` stays alive; `quota-gate probe`, the image's
//! `HEALTHCHECK`, answers only in exit statuses 0 and 1; `QUOTA_EMF=off`
//! leaves stdout without metric lines and `/metrics` as it was; a listener
//! beyond loopback without trusted proxies is warned about once.

use quota_gate_testkit as common;

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use common::client::{http, post_scan, request};
use common::consumer::StreamRig;
use common::serve::{spawn_serve, stderr_of};
use common::{KillOnDrop, ValkeyServer, bin, free_port, loopback, wait_for_listener};

/// `quota-gate probe url`: its exit status and how long it took.
fn probe(url: &str) -> (Option<i32>, Duration) {
    let started = Instant::now();
    let out = Command::new(bin("quota-gate"))
        .args(["probe", url])
        .env_clear()
        .output()
        .unwrap();
    (out.status.code(), started.elapsed())
}

/// `GET path`'s status line and body.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let answer = http(addr, &request("GET", path));
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    (status, body.to_owned())
}

/// Polls `GET /readyz` until its status line starts with `want`.
fn ready_turns(addr: SocketAddr, want: &str, within: Duration) -> (String, String) {
    let until = Instant::now() + within;
    loop {
        let (status, body) = get(addr, "/readyz");
        if status.starts_with(want) || Instant::now() > until {
            return (status, body);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Ready, then 503 within the probe's second of a paused Valkey (while
/// alive), then ready again once it is resumed; on `addr`'s `/readyz`.
fn readiness_follows(valkey: &ValkeyServer, addr: SocketAddr) {
    let url = format!("http://{addr}/readyz");
    assert_eq!(
        ready_turns(addr, "HTTP/1.1 200", Duration::from_secs(5)).1,
        r#"{"ready":true}"#
    );
    assert_eq!(probe(&url).0, Some(0));
    valkey.signal("STOP");
    let (status, body) = ready_turns(addr, "HTTP/1.1 503", Duration::from_secs(5));
    let (alive, _) = get(addr, "/healthz");
    let (probed, took) = probe(&url);
    valkey.signal("CONT");
    assert!(status.starts_with("HTTP/1.1 503"), "{status}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["ready"], false, "{body}");
    assert!(alive.starts_with("HTTP/1.1 200"), "{alive}");
    assert_eq!(probed, Some(1));
    assert!(took < Duration::from_secs(3), "{took:?}");
    let (status, _) = ready_turns(addr, "HTTP/1.1 200", Duration::from_secs(5));
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
}

/// `serve`'s `/readyz` follows its Valkey; with the in-memory store it is
/// always ready.
#[test]
fn serve_is_ready_while_its_store_answers() {
    let valkey = ValkeyServer::start();
    let url = valkey.url();
    let (_serve, addr) = spawn_serve(&[("VALKEY_URL", url.as_str())]);
    readiness_follows(&valkey, addr);
    let (_memory, addr) = spawn_serve(&[]);
    assert!(get(addr, "/readyz").0.starts_with("HTTP/1.1 200"));
}

/// `consume --health-listen`'s `/readyz` follows the Valkey of its stream.
#[test]
fn consume_is_ready_while_its_valkey_answers() {
    let rig = StreamRig::start();
    let addr = loopback(free_port());
    let listen = addr.to_string();
    let mut consumer = rig.consume("c", &["--health-listen", &listen], &[]);
    assert!(
        wait_for_listener(&mut consumer, addr, Duration::from_secs(10)),
        "no health listener"
    );
    assert!(get(addr, "/healthz").0.starts_with("HTTP/1.1 200"));
    assert!(get(addr, "/nothing").0.starts_with("HTTP/1.1 404"));
    readiness_follows(&rig.valkey, addr);
}

/// `probe` exits 0 on a 2xx only, and 1 on anything else: another status,
/// a refused connection, a server that never answers (within its 2 s), a
/// URL it does not take. Never 2, which Docker reserves.
#[test]
fn probe_answers_in_exit_statuses() {
    let (_serve, addr) = spawn_serve(&[]);
    assert_eq!(probe(&format!("http://{addr}/healthz")).0, Some(0));
    assert_eq!(probe(&format!("http://{addr}/nowhere")).0, Some(1));
    assert_eq!(
        probe(&format!("http://{}/", loopback(free_port()))).0,
        Some(1)
    );
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let (code, took) = probe(&format!("http://{}/readyz", silent.local_addr().unwrap()));
    assert_eq!(code, Some(1));
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(4)).contains(&took),
        "{took:?}"
    );
    for bad in ["https://127.0.0.1/", "127.0.0.1:9000", "http://"] {
        assert_eq!(probe(bad).0, Some(1), "{bad}");
    }
}

/// Two scans through `serve` with `vars` (the stdout spool): its stdout,
/// and its `/metrics`.
fn stdout_and_metrics(vars: &[(&str, &str)]) -> (String, String) {
    let (mut child, addr) = spawn_serve(vars);
    for _ in 0..2 {
        let answer = http(addr, &post_scan(r#"{"image":"alpine:3.20"}"#));
        assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    }
    let (_, metrics) = get(addr, "/metrics");
    common::consumer::signal(child.id(), "TERM");
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    let _ = child.wait();
    (stdout, metrics)
}

/// `QUOTA_EMF=off`: stdout carries the jobs and no EMF line, and `/metrics`
/// counts the scans as with EMF on.
#[test]
fn emf_off_leaves_stdout_to_the_jobs() {
    let (with_emf, metrics_on) = stdout_and_metrics(&[]);
    let (without, metrics_off) = stdout_and_metrics(&[("QUOTA_EMF", "off")]);
    assert!(with_emf.contains("\"_aws\""), "{with_emf}");
    assert!(!without.contains("\"_aws\""), "{without}");
    assert_eq!(
        without.lines().filter(|l| l.contains("scanId")).count(),
        2,
        "{without}"
    );
    let accepted = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("stella_quota_requests_") && !l.contains(" 0"))
            .count()
    };
    assert!(accepted(&metrics_off) > 0, "{metrics_off}");
    assert_eq!(accepted(&metrics_on), accepted(&metrics_off));
}

/// `serve` on every interface with `vars`: what it logged at start.
fn start_log(vars: &[(&str, &str)]) -> String {
    let port = free_port();
    let child = Command::new(bin("quota-gate"))
        .arg("serve")
        .env_clear()
        .env("QUOTA_LISTEN", format!("0.0.0.0:{port}"))
        .envs(vars.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop::new(child);
    assert!(wait_for_listener(
        &mut child,
        loopback(port),
        Duration::from_secs(10)
    ));
    common::consumer::signal(child.id(), "TERM");
    let log = stderr_of(&mut child);
    let _ = child.wait();
    log
}

/// Beyond loopback with no trusted proxy, one warning says every client
/// behind a proxy shares a counter and names the variable; with a proxy
/// trusted, or on loopback, none.
#[test]
fn a_public_listener_without_trusted_proxies_is_warned_about() {
    const WARNING: &str = "QUOTA_TRUSTED_PROXIES is empty";
    let log = start_log(&[]);
    assert_eq!(log.matches(WARNING).count(), 1, "{log}");
    assert!(log.contains("WARN"), "{log}");
    assert!(!start_log(&[("QUOTA_TRUSTED_PROXIES", "10.0.0.0/8")]).contains(WARNING));
    let (mut local, _) = spawn_serve(&[]);
    common::consumer::signal(local.id(), "TERM");
    assert!(!stderr_of(&mut local).contains(WARNING));
}
