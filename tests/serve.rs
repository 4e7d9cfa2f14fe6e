//! `quota-gate serve` as a server on a network must be: it keeps answering
//! when its stdout reader is stuck, lets go of connections that never finish
//! their headers or sit idle, caps its open connections, and refuses an
//! oversize `Expect: 100-continue` upload before the body is sent.
//!
//! Every test runs the real binary, against a real `valkey-server` where a
//! store or stream is involved.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::serve::{http, post_scan, request, spawn_serve, stderr_of};
use common::{ValkeyServer, stream_jobs};

/// One scan on its own connection: the status code and how long it took.
fn timed_scan(addr: SocketAddr) -> (u16, Duration, String) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
        .write_all(post_scan(r#"{"image":"alpine:3.20"}"#).as_bytes())
        .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, started.elapsed(), response)
}

/// `scans` scans from `clients` threads at once; every answer.
fn burst(addr: SocketAddr, clients: usize, scans: usize) -> Vec<(u16, Duration, String)> {
    let next = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let next = next.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < scans {
                    answers.push(timed_scan(addr));
                }
                answers
            })
        })
        .collect();
    threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect()
}

/// A health check that must answer quickly.
fn assert_healthy(addr: SocketAddr) {
    let started = Instant::now();
    let health = http(addr, &request("GET", "/healthz"));
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "/healthz took {:?}",
        started.elapsed()
    );
}

/// The value of a Prometheus series (summed over its labels).
fn metric(addr: SocketAddr, name: &str) -> f64 {
    http(addr, &request("GET", "/metrics"))
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// With a Valkey stream queue, stdout carries only EMF lines. Nobody reads it:
/// 800 scans from 16 clients are all 202 within 10 s each, /healthz stays
/// 200, and the stream holds one job per 202.
#[test]
fn stuck_stdout_never_holds_a_request_with_a_stream_queue() {
    let valkey = ValkeyServer::start();
    let url = valkey.url();
    let (mut child, addr) = spawn_serve(&[
        ("VALKEY_URL", &url),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("QUOTA_ANON", "100000"),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
    ]);
    // stdout is a pipe this test never reads: it is full after a few hundred lines.
    let started = Instant::now();
    let answers = burst(addr, 16, 800);
    let total = started.elapsed();
    assert_healthy(addr);
    let slowest = answers.iter().map(|a| a.1).max().unwrap();
    let accepted = answers.iter().filter(|a| a.0 == 202).count();
    eprintln!("stream queue, stuck stdout: 800 scans in {total:?}, slowest {slowest:?}");
    for (status, took, response) in &answers {
        assert_eq!(*status, 202, "{response}");
        assert!(*took < Duration::from_secs(10), "a scan took {took:?}");
    }
    let jobs = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(stream_jobs(&valkey, "jobs"));
    assert_eq!(jobs.len(), accepted);
    // Past the writer's queue (4096 lines) EMF lines are dropped, and counted.
    assert!(http(addr, &request("GET", "/metrics")).contains("stella_quota_emf_dropped_total"));
    let more = burst(addr, 16, 4000);
    assert!(more.iter().all(|a| a.0 == 202));
    let dropped = metric(addr, "stella_quota_emf_dropped_total");
    eprintln!("after 4800 scans, EMF lines dropped: {dropped}");
    assert!(dropped > 0.0, "{dropped}");
    assert_healthy(addr);
    let _ = child.kill();
    let _ = child.wait();
}

/// With the stdout spool and nobody reading stdout, scans that cannot be
/// written are refused 503 (with `Retry-After`) within the gateway budget
/// instead of hanging, their counts are refunded, /healthz keeps answering,
/// and every 202 has its job line once the reader comes back.
#[test]
fn stuck_stdout_spool_answers_503_in_time_and_refunds() {
    let valkey = ValkeyServer::start();
    let url = valkey.url();
    let (mut child, addr) = spawn_serve(&[
        ("VALKEY_URL", &url),
        ("QUOTA_ANON", "100000"),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
        ("QUOTA_GATEWAY_TIMEOUT_MS", "2000"),
    ]);
    let answers = burst(addr, 16, 300);
    assert_healthy(addr);
    let accepted = answers.iter().filter(|a| a.0 == 202).count();
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 503).collect();
    let slowest = answers.iter().map(|a| a.1).max().unwrap();
    eprintln!(
        "spool, stuck stdout: {accepted} × 202, {} × 503, slowest {slowest:?}",
        refused.len()
    );
    assert_eq!(accepted + refused.len(), answers.len(), "only 202 and 503");
    assert!(!refused.is_empty(), "a 64 KiB pipe cannot hold 300 jobs");
    for (_, took, response) in &refused {
        assert!(response.contains("retry-after: "), "{response}");
        assert!(*took < Duration::from_secs(4), "a refusal took {took:?}");
    }
    // Refunded: the counter holds exactly the accepted scans.
    let count: u64 = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut c = valkey.client().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("quota:ip:*")
            .query_async(&mut c)
            .await
            .unwrap();
        let key = keys.iter().find(|k| k.ends_with('}')).expect("a counter");
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap()
    });
    assert_eq!(count, accepted as u64, "refused scans are refunded");
    // The reader comes back: every 202 has its job.
    let mut stdout = child.stdout.take().unwrap();
    let _ = child.kill();
    let mut out = String::new();
    stdout.read_to_string(&mut out).unwrap();
    let jobs = out.lines().filter(|l| l.contains("\"scanId\"")).count();
    eprintln!("job lines once read: {jobs} (202s: {accepted})");
    assert!(jobs >= accepted, "{jobs} job lines for {accepted} × 202");
    let _ = child.wait();
}

/// 100 connections that never finish their headers are closed within 15 s,
/// while scans and /healthz keep working; an idle keep-alive connection is
/// closed too.
#[test]
fn slow_and_idle_connections_are_closed() {
    let (mut child, addr) = spawn_serve(&[]);
    let opened = Instant::now();
    let slow: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"POST /scan HTTP/1.1\r\nhost: x\r\n").unwrap();
            s
        })
        .collect();
    // An idle keep-alive connection: one request answered, then nothing.
    let mut idle = TcpStream::connect(addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut first = [0u8; 512];
    let n = idle.read(&mut first).unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    let idle_since = Instant::now();

    assert_healthy(addr);
    let (status, _, response) = timed_scan(addr);
    assert_eq!(status, 202, "{response}");

    let closed_at = |mut s: TcpStream| {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        Instant::now()
    };
    let idle_closed = closed_at(idle) - idle_since;
    let mut latest = Duration::ZERO;
    for s in slow {
        latest = latest.max(closed_at(s) - opened);
    }
    eprintln!("slow headers closed within {latest:?}; idle closed after {idle_closed:?}");
    assert!(latest < Duration::from_secs(15), "{latest:?}");
    assert!(
        idle_closed >= Duration::from_secs(9) && idle_closed < Duration::from_secs(15),
        "{idle_closed:?}"
    );
    assert_healthy(addr);
    let _ = child.kill();
    let _ = child.wait();
}

/// At `QUOTA_MAX_CONNECTIONS` a new connection waits (the open ones keep
/// working), and /healthz answers on it as soon as an old one closes.
#[test]
fn connection_cap_waits_for_a_free_slot() {
    let (mut child, addr) = spawn_serve(&[("QUOTA_MAX_CONNECTIONS", "4")]);
    let mut open: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                .unwrap();
            let mut buf = [0u8; 256];
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
            s
        })
        .collect();
    // The fifth waits in the backlog: no answer while all four are open.
    let mut fifth = TcpStream::connect(addr).unwrap();
    fifth
        .write_all(request("GET", "/healthz").as_bytes())
        .unwrap();
    fifth
        .set_read_timeout(Some(Duration::from_millis(800)))
        .unwrap();
    let mut buf = [0u8; 256];
    assert!(fifth.read(&mut buf).is_err(), "answered past the cap");
    // An open one still serves its next request.
    open[0]
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let n = open[0].read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // One closes: the fifth is served at once.
    let closed = Instant::now();
    drop(open.pop());
    fifth
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut answer = String::new();
    let _ = fifth.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    eprintln!("served {:?} after a slot freed", closed.elapsed());
    assert!(closed.elapsed() < Duration::from_secs(2));
    let _ = child.kill();
    let _ = child.wait();
}

/// `Expect: 100-continue` with a 10 MiB `Content-Length` gets 413 at once,
/// never `100 Continue`, and no body byte is sent.
#[test]
fn oversize_expect_continue_is_refused_before_the_body() {
    let (mut child, addr) = spawn_serve(&[]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    s.write_all(
        b"POST /scan HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 10485760\r\nexpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // The same length to another path is still a 404, and not counted either way.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(
        b"POST /other HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 10485760\r\nexpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    let first = http(addr, &post_scan(r#"{"image":"a"}"#));
    assert!(first.contains("x-stella-quota-remaining: 32"), "{first}");
    let _ = child.kill();
    let _ = child.wait();
}

/// The issue's case: under `ulimit -n 256`, 300 connections that send
/// nothing. The connection cap is lowered to fit the limit (and says so), so
/// the process never runs out of descriptors: /healthz and a scan on new
/// connections are answered once the idle ones are let go.
#[test]
fn open_file_limit_lowers_the_connection_cap() {
    let port = common::free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 256 && exec \"$0\" serve")
        .arg(env!("CARGO_BIN_EXE_quota-gate"))
        .env_clear()
        .env("QUOTA_LISTEN", addr.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(common::wait_for_port(addr, Duration::from_secs(10)));
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let started = Instant::now();
    let mut health = TcpStream::connect(addr).unwrap();
    health
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    health
        .write_all(request("GET", "/healthz").as_bytes())
        .unwrap();
    let mut answer = String::new();
    let _ = health.read_to_string(&mut answer);
    eprintln!(
        "/healthz behind 300 idle connections: {:?}",
        started.elapsed()
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
    let (status, _, response) = timed_scan(addr);
    assert_eq!(status, 202, "{response}");
    drop(idle);
    let _ = child.kill();
    let stderr = stderr_of(&mut child);
    let _ = child.wait();
    assert!(stderr.contains("open-file limit"), "{stderr}");
    assert!(!stderr.contains("Too many open files"), "{stderr}");
}

/// A body that stops arriving gets 408 after 10 s, and the scan is not counted.
#[test]
fn stalled_body_gets_408() {
    let (mut child, addr) = spawn_serve(&[]);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let started = Instant::now();
    s.write_all(
        b"POST /scan HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"image\":",
    )
    .unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    let took = started.elapsed();
    eprintln!("stalled body answered after {took:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(took >= Duration::from_secs(9) && took < Duration::from_secs(13));
    let first = http(addr, &post_scan(r#"{"image":"a"}"#));
    assert!(first.contains("x-stella-quota-remaining: 32"), "{first}");
    let _ = child.kill();
    let _ = child.wait();
}
