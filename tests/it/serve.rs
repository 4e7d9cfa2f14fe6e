//! `quota-gate serve` as a server on a network must be: it keeps answering
//! when its stdout reader is stuck, lets go of connections that never finish
//! their headers, sit idle or never read their answers, caps its open
//! connections, and refuses an oversize `Expect: 100-continue` upload before
//! the body is sent. A scan runs to its end when its client leaves, and at
//! `SIGTERM`.
//!
//! Every test runs the real binary, against a real `valkey-server` where a
//! store or stream is involved.

use quota_gate_testkit as common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::client::{get_request, http, post_scan, request, send};
use common::serve::{
    Dribble, Flood, spawn_serve, spawn_serve_with_open_files, stderr_after_term, stderr_of,
};
use common::{KillOnDrop, ValkeyServer, stream_jobs, with_vars};

/// What `serve` answers (503) on a connection it closed for another before reading its request.
const GAVE_WAY: &str = "connection closed for another";

/// One scan on its own connection: the status code (0 for no answer), how
/// long it took, and the response (or what went wrong).
fn timed_scan(addr: SocketAddr) -> (u16, Duration, String) {
    let started = Instant::now();
    let scan = post_scan(r#"{"image":"alpine:3.20"}"#);
    let within = Duration::from_secs(30);
    let (status, response) = send(addr, scan.as_bytes(), within).unwrap_or_else(|e| (0, e));
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

/// Writes `bytes` (an unfinished or oversize request) on a new connection
/// and reads what comes back until the server closes or `within` passes.
fn raw_exchange(addr: SocketAddr, bytes: &[u8], within: Duration) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    s.write_all(bytes).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

/// `GET /healthz` on the open connection `s`, answered 200; `s` stays open.
fn healthz_on(s: &mut TcpStream) {
    s.write_all(get_request("/healthz").as_bytes()).unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
}

/// Runs `future` to its end on a runtime of its own.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Runtime::new().unwrap().block_on(future)
}

/// A health check that must answer quickly: within 5 s, which a loaded
/// test machine's scheduling alone can take 2 s of.
fn assert_healthy(addr: SocketAddr) {
    let started = Instant::now();
    let health = http(addr, &request("GET", "/healthz"));
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
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

/// `serve` counting on a Valkey of its own, with room for every scan of a
/// test and a store timeout that a loaded machine cannot miss; and `extra`.
fn serve_on_valkey(extra: &[(&str, &str)]) -> (ValkeyServer, KillOnDrop, SocketAddr) {
    let valkey = ValkeyServer::start();
    let url = valkey.url();
    let (child, addr) = spawn_serve(&with_vars(
        &[
            ("VALKEY_URL", url.as_str()),
            ("QUOTA_ANON", "100000"),
            ("QUOTA_STORE_TIMEOUT_MS", "2000"),
        ],
        extra,
    ));
    (valkey, child, addr)
}

/// The one address counter on `valkey` (the tests' scans all come from 127.0.0.1).
fn counted(valkey: &ValkeyServer) -> u64 {
    block_on(async {
        let keys = valkey.keys("quota:ip:*").await;
        let key = keys.iter().find(|k| k.ends_with('}')).expect("a counter");
        valkey.get(key).await
    })
}

/// With a Valkey stream queue, stdout carries only EMF lines. Nobody reads it:
/// 800 scans from 16 clients are all 202 within 10 s each, /healthz stays
/// 200, and the stream holds one job per 202.
#[test]
fn stuck_stdout_never_holds_a_request_with_a_stream_queue() {
    let (valkey, _serve, addr) = serve_on_valkey(&[("SCAN_QUEUE_URL", "valkey-stream:jobs")]);
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
    let jobs = block_on(stream_jobs(&valkey, "jobs"));
    assert_eq!(jobs.len(), accepted);
    // Past the writer's queue (4096 lines) EMF lines are dropped, and counted.
    assert!(http(addr, &request("GET", "/metrics")).contains("stella_quota_emf_dropped_total"));
    let more = burst(addr, 16, 4000);
    assert!(more.iter().all(|a| a.0 == 202));
    let dropped = metric(addr, "stella_quota_emf_dropped_total");
    eprintln!("after 4800 scans, EMF lines dropped: {dropped}");
    assert!(dropped > 0.0, "{dropped}");
    assert_healthy(addr);
}

/// With the stdout spool and nobody reading stdout, scans that cannot be
/// written are refused 503 (with `Retry-After`) within the gateway budget
/// instead of hanging, their counts are refunded, /healthz keeps answering,
/// and every 202 has its job line once the reader comes back.
#[test]
fn stuck_stdout_spool_answers_503_in_time_and_refunds() {
    let (valkey, mut child, addr) = serve_on_valkey(&[("QUOTA_GATEWAY_TIMEOUT_MS", "2000")]);
    let answers = burst(addr, 64, 300);
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
    let count = counted(&valkey);
    assert_eq!(count, accepted as u64, "refused scans are refunded");
    // The reader comes back: every 202 has its job.
    child.kill_now();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let jobs = out.lines().filter(|l| l.contains("\"scanId\"")).count();
    eprintln!("job lines once read: {jobs} (202s: {accepted})");
    assert!(jobs >= accepted, "{jobs} job lines for {accepted} × 202");
}

/// 100 connections that never finish their headers are closed within 15 s,
/// while scans and /healthz keep working; an idle keep-alive connection is
/// closed too.
#[test]
fn slow_and_idle_connections_are_closed() {
    let (_serve, addr) = spawn_serve(&[]);
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
    healthz_on(&mut idle);
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
}

/// At `QUOTA_MAX_CONNECTIONS`, every open connection a keep-alive one just
/// answered (within its grace), a new connection waits (the open ones keep
/// working), and /healthz answers on it as soon as an old one closes.
#[test]
fn connection_cap_waits_for_a_free_slot() {
    let (_serve, addr) = spawn_serve(&[("QUOTA_MAX_CONNECTIONS", "4")]);
    let mut open: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(addr).unwrap();
            healthz_on(&mut s);
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
    healthz_on(&mut open[0]);
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
}

/// `Expect: 100-continue` with a 10 MiB `Content-Length` gets 413 at once,
/// never `100 Continue`, and no body byte is sent.
#[test]
fn oversize_expect_continue_is_refused_before_the_body() {
    let (_serve, addr) = spawn_serve(&[]);
    // The head alone: the body would only follow a `100 Continue`.
    let upload = |path: &str| {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: 10485760\r\nexpect: 100-continue\r\n\r\n"
        );
        raw_exchange(addr, head.as_bytes(), Duration::from_secs(5))
    };
    let started = Instant::now();
    let answer = upload("/scan");
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(2));
    // The same length to another path is still a 404, and not counted either way.
    let answer = upload("/other");
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    let first = http(addr, &post_scan(r#"{"image":"a"}"#));
    assert!(first.contains("x-stella-quota-remaining: 32"), "{first}");
}

/// A body cut short (fewer bytes than its `Content-Length`, the client's
/// side then closed) or a broken chunked encoding is the client's mistake:
/// 400 `incomplete_body`, not a 413 about a size it never had, and not counted.
#[test]
fn short_or_badly_framed_body_is_400() {
    let (_serve, addr) = spawn_serve(&[]);
    let head = |framing: &str| {
        format!("POST /scan HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{framing}\r\n")
    };
    let short = head("content-length: 100\r\n") + r#"{"image":"a"}"#;
    let bad_chunk = head("transfer-encoding: chunked\r\n") + "ZZ\r\n{}\r\n0\r\n\r\n";
    let cut_chunk = head("transfer-encoding: chunked\r\n") + "40\r\n{\"image\":";
    for (name, request) in [
        ("short", short),
        ("bad chunk", bad_chunk),
        ("cut chunk", cut_chunk),
    ] {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 400"), "{name}: {answer}");
        assert!(answer.contains("incomplete_body"), "{name}: {answer}");
    }
    let first = http(addr, &post_scan(r#"{"image":"a"}"#));
    assert!(
        first.contains("x-stella-quota-remaining: 32"),
        "none counted: {first}"
    );
}

/// The issue's case: under `ulimit -n 256`, 300 connections that send
/// nothing. The connection cap is lowered to fit the limit (and says so), so
/// the process never runs out of descriptors: /healthz and a scan on new
/// connections are answered once the idle ones are let go.
#[test]
fn open_file_limit_lowers_the_connection_cap() {
    let (mut child, addr) = spawn_serve_with_open_files(256, &[]);
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let started = Instant::now();
    let health = request("GET", "/healthz");
    let (_, answer) =
        send(addr, health.as_bytes(), Duration::from_secs(20)).unwrap_or_else(|e| (0, e));
    eprintln!(
        "/healthz behind 300 idle connections: {:?}",
        started.elapsed()
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(started.elapsed() < Duration::from_secs(15));
    let (status, _, response) = timed_scan(addr);
    assert_eq!(status, 202, "{response}");
    drop(idle);
    let stderr = stderr_after_term(&mut child);
    assert!(stderr.contains("open-file limit"), "{stderr}");
    assert!(!stderr.contains("Too many open files"), "{stderr}");
}

/// A body that stops arriving gets 408 after 10 s, and the scan is not counted.
#[test]
fn stalled_body_gets_408() {
    let (_serve, addr) = spawn_serve(&[]);
    let started = Instant::now();
    let answer = raw_exchange(
        addr,
        b"POST /scan HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
          content-length: 100\r\n\r\n{\"image\":",
        Duration::from_secs(20),
    );
    let took = started.elapsed();
    eprintln!("stalled body answered after {took:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(answer.contains("within 10 s"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(took >= Duration::from_secs(9) && took < Duration::from_secs(13));
    let first = http(addr, &post_scan(r#"{"image":"a"}"#));
    assert!(first.contains("x-stella-quota-remaining: 32"), "{first}");
}

/// The workers (here 4, one single-threaded runtime each, accepting on one
/// socket) share one in-memory store: 40 scans at once from 8 clients, each
/// on its own connection, are counted 1 … 40, each once.
#[test]
fn workers_share_one_in_memory_count() {
    let (mut serve, addr) = spawn_serve(&[("QUOTA_SERVE_WORKERS", "4"), ("QUOTA_ANON", "1000")]);
    read_stdout_away(&mut serve);
    let answers = burst(addr, 8, 40);
    let mut used: Vec<u64> = answers
        .iter()
        .map(|(status, _, body)| {
            assert_eq!(*status, 202, "{body}");
            let json: serde_json::Value =
                serde_json::from_str(body.split("\r\n\r\n").nth(1).unwrap_or(body)).unwrap();
            json["quota"]["used"].as_u64().unwrap()
        })
        .collect();
    used.sort_unstable();
    assert_eq!(used, (1..=40).collect::<Vec<u64>>());
}

/// Reads `serve`'s stdout away on a thread of its own. Jobs are spooled to
/// stdout (54 KB for 40 scans): a pipe the kernel sized down on a busy
/// machine (one page, once a user's pipes pass `pipe-user-pages-soft`)
/// fills, and the spool then refuses jobs.
fn read_stdout_away(serve: &mut KillOnDrop) {
    let mut stdout = serve.stdout.take().expect("piped stdout");
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
}

/// Fresh clients for `during`, on two threads: `GET /healthz` and
/// `POST /scan`, each on a new connection, one after another. Every answer:
/// what was asked, the status (0 for none within `within`) and how long it
/// took from its first connection ([`answered`]).
fn probe(
    addr: SocketAddr,
    during: Duration,
    within: Duration,
) -> Vec<(&'static str, u16, Duration)> {
    let until = Instant::now() + during;
    let asked = move |what: &'static str| {
        let asked = match what {
            "/healthz" => request("GET", "/healthz"),
            _ => post_scan(r#"{"image":"alpine:3.20"}"#),
        };
        let mut answers = Vec::new();
        while Instant::now() < until {
            let (status, took) = answered(within, || send(addr, asked.as_bytes(), within));
            answers.push((what, status, took));
            std::thread::sleep(Duration::from_millis(200));
        }
        answers
    };
    let health = std::thread::spawn(move || asked("/healthz"));
    let mut answers = asked("POST /scan");
    answers.extend(health.join().unwrap());
    answers
}

/// A request sent as a client sends it: again, the clock running on, when its connection was
/// closed unanswered or answered 503 "closed for another" ([`GAVE_WAY`]). At the cap, `serve` may
/// close a connection whose request it has not read within `NEW_CONNECTION_GRACE` for a new one,
/// which a client or a `serve` starved of CPU can miss. The status (0: none within `within`) and
/// the time from the first connection.
fn answered(within: Duration, send: impl Fn() -> Result<(u16, String), String>) -> (u16, Duration) {
    let started = Instant::now();
    loop {
        let why = match send() {
            Ok((503, body)) if body.contains(GAVE_WAY) => body,
            Ok((status, _)) => return (status, started.elapsed()),
            Err(_) if started.elapsed() >= within => return (0, started.elapsed()),
            Err(e) => e,
        };
        eprintln!(
            "not served after {:?} ({why}); sent again",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The longest `what` of `answers` took.
fn slowest(answers: &[(&'static str, u16, Duration)], what: &str) -> Duration {
    let took = answers.iter().filter(|a| a.0 == what).map(|a| a.2);
    took.max().unwrap_or_default()
}

/// `connections` clients that each pipeline 1 500 `GET /metrics` with a
/// 4 KiB receive buffer and never read, reopened as soon as `serve` lets
/// them go, for 12 s (past two of its 5 s write timeouts): every fresh
/// client's `/healthz` and scan is answered within 12 s throughout, and
/// `serve` closed every flood connection at least once (a starved flood
/// client's late bursts given 20 s more).
fn assert_never_readers_hold_nothing(connections: usize, extra: &[(&str, &str)]) {
    let vars = with_vars(&[("SCAN_QUEUE_URL", "valkey-stream:jobs")], extra);
    let (_valkey, _serve, addr) = serve_on_valkey(&vars);
    let flood = Flood::start(addr, connections, 1500, &get_request("/metrics"));
    std::thread::sleep(Duration::from_secs(1));
    let answers = probe(addr, Duration::from_secs(12), Duration::from_secs(30));
    // A flood client starved of CPU sends its burst late, and its write
    // timeout runs from there: up to 20 s more for the last to be closed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while flood.closed() < connections && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let closed = flood.stop();
    eprintln!(
        "{connections} never-reading connections: {} answers, slowest /healthz {:?}, \
         slowest scan {:?}; flood connections closed by serve: {closed}",
        answers.len(),
        slowest(&answers, "/healthz"),
        slowest(&answers, "POST /scan"),
    );
    for (what, status, took) in &answers {
        let expected = if *what == "/healthz" { 200 } else { 202 };
        assert_eq!(*status, expected, "{what} after {took:?}");
        assert!(*took < Duration::from_secs(12), "{what} took {took:?}");
    }
    assert!(closed >= connections, "only {closed} closed");
    assert_healthy(addr);
}

/// The issue's flood at the default cap (1 024 connections): it holds nothing.
#[test]
fn never_reading_pipeliners_hold_nothing_at_the_default_cap() {
    assert_never_readers_hold_nothing(1024, &[]);
}

/// The same with `QUOTA_MAX_CONNECTIONS=8` and 8 such connections.
#[test]
fn never_reading_pipeliners_hold_nothing_at_a_small_cap() {
    assert_never_readers_hold_nothing(8, &[("QUOTA_MAX_CONNECTIONS", "8")]);
}

/// One keep-alive connection that asks for `/healthz` every 500 ms for
/// `during`, on a thread that panics if an answer does not come.
fn keep_alive_client(addr: SocketAddr, during: Duration) -> std::thread::JoinHandle<()> {
    let mut connection = TcpStream::connect(addr).unwrap();
    connection
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    healthz_on(&mut connection);
    let until = Instant::now() + during;
    std::thread::spawn(move || {
        while Instant::now() < until {
            std::thread::sleep(Duration::from_millis(500));
            healthz_on(&mut connection);
        }
    })
}

/// Slowloris past the cap: 96 clients at `QUOTA_MAX_CONNECTIONS=64` that
/// send a request line and then a byte of header a second, never finishing,
/// each reopened 250 ms after `serve` closes it. For 6 s from when the cap
/// is full, every fresh client's `/healthz` and scan is answered within
/// 1 s: a dribbling connection gives its slot up to a new one (the probes
/// were answered only at the dribblers' 10 s header timeout before), and
/// `serve` let go of dribblers to admit them. A keep-alive client that
/// opened before the flood, sending a request every 500 ms, keeps its
/// connection throughout.
#[test]
fn header_dribblers_past_the_cap_hold_nothing() {
    let (mut serve, addr) =
        spawn_serve(&[("QUOTA_MAX_CONNECTIONS", "64"), ("QUOTA_ANON", "100000")]);
    read_stdout_away(&mut serve);
    let keep_alive = keep_alive_client(addr, Duration::from_secs(7));
    let dribble = Dribble::start(addr, 96, Duration::from_millis(250));
    std::thread::sleep(Duration::from_millis(1500));
    let answers = probe(addr, Duration::from_secs(6), Duration::from_secs(3));
    let closed = dribble.stop();
    let kept = keep_alive.join();
    assert!(kept.is_ok(), "the keep-alive connection was lost");
    eprintln!(
        "96 dribblers past a cap of 64: {} answers, slowest /healthz {:?}, slowest scan {:?}; \
         dribblers closed by serve: {closed}",
        answers.len(),
        slowest(&answers, "/healthz"),
        slowest(&answers, "POST /scan"),
    );
    for (what, status, took) in &answers {
        let expected = if *what == "/healthz" { 200 } else { 202 };
        assert_eq!(*status, expected, "{what} after {took:?}");
        assert!(*took < Duration::from_secs(1), "{what} took {took:?}");
    }
    assert!(answers.len() >= 20, "{} answers", answers.len());
    assert!(closed >= 32, "only {closed} dribblers closed");
}

/// Sends `bytes` on a new connection, shuts its write side (a client that
/// half-closes once its request is sent), and reads until `serve` closes,
/// for at most `within`: what came back, and how long `serve` took to close.
fn half_closed_exchange(addr: SocketAddr, bytes: &[u8], within: Duration) -> (String, Duration) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    s.write_all(bytes).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let sent = Instant::now();
    let mut answer = Vec::new();
    let closed = s.read_to_end(&mut answer);
    assert!(closed.is_ok(), "not closed within {within:?}: {closed:?}");
    (
        String::from_utf8_lossy(&answer).into_owned(),
        sent.elapsed(),
    )
}

/// `answer` is one complete response of `status`: its head and its whole
/// body, as long as its `Content-Length`.
fn assert_whole(answer: &str, status: u16) {
    let head = common::client::parse_response(answer.as_bytes())
        .unwrap()
        .unwrap_or_else(|| panic!("no complete head: {answer:?}"));
    assert_eq!(head.status, status, "{answer}");
    assert!(!head.body.is_empty(), "{answer}");
    assert_eq!(head.body.end, answer.len(), "the whole body: {answer}");
}

/// A client that half-closes (`shutdown(Write)`) once its request is sent
/// gets its whole answer: a scan its 202 (counted once), `GET /quota` its
/// 200. One whose headers the half-close cut short is let go at once, not
/// after the header timeout.
#[test]
fn a_half_closed_request_gets_its_whole_answer() {
    let (mut serve, addr) = spawn_serve(&[]);
    read_stdout_away(&mut serve);
    let within = Duration::from_secs(5);
    let scan = common::client::scan_request(None);
    let (answer, _) = half_closed_exchange(addr, scan.as_bytes(), within);
    assert_whole(&answer, 202);
    assert!(answer.contains("\"scanId\""), "{answer}");
    assert!(answer.contains("x-stella-quota-remaining: 32"), "{answer}");
    let (answer, _) = half_closed_exchange(addr, get_request("/quota").as_bytes(), within);
    assert_whole(&answer, 200);
    assert!(answer.contains("x-stella-quota-remaining: 32"), "{answer}");
    let cut = b"GET /quota HTTP/1.1\r\nhost: x\r\n";
    let (answer, took) = half_closed_exchange(addr, cut, within);
    eprintln!("headers cut short by a half-close: closed after {took:?}: {answer:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let next = http(addr, &post_scan(r#"{"image":"a"}"#));
    assert!(next.contains("x-stella-quota-remaining: 31"), "{next}");
}

/// `POST /scan` with `Idempotency-Key: key`, closing the connection after.
fn keyed_scan(key: &str) -> String {
    common::client::build(
        "POST",
        "/scan",
        &[
            ("Content-Type", "application/json"),
            ("Connection", "close"),
            ("Idempotency-Key", key),
        ],
        r#"{"image":"alpine:3.20"}"#,
    )
}

/// Sends `request` on a new connection and closes it after `after`, without
/// reading: a client whose HTTP timeout is shorter than its delay.
fn send_and_leave(addr: SocketAddr, request: &str, after: Duration) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    std::thread::sleep(after);
    let _ = s.shutdown(std::net::Shutdown::Both);
}

/// Over quota with a 2 s soft delay, a keyed client leaves 0.5 s into its
/// delay: the scan still runs to its end, counted once with exactly one job,
/// and a retry with the key gets the saved answer with that job's `scanId`.
#[test]
fn a_scan_outlives_the_client_that_left() {
    let (valkey, _serve, addr) = serve_on_valkey(&[
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("QUOTA_ANON", "1"),
        ("QUOTA_SOFT_DELAY_MS", "2000"),
    ]);
    let (status, _, first) = timed_scan(addr);
    assert_eq!(status, 202, "{first}");
    send_and_leave(addr, &keyed_scan("left-early"), Duration::from_millis(500));
    std::thread::sleep(Duration::from_secs(3));
    let jobs = block_on(stream_jobs(&valkey, "jobs"));
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_eq!(counted(&valkey), 2, "each scan counted once");
    assert_eq!(jobs[1]["delayMs"], 2000, "{}", jobs[1]);
    let retry = http(addr, &keyed_scan("left-early"));
    assert!(retry.starts_with("HTTP/1.1 202"), "{retry}");
    assert!(retry.contains("idempotent-replayed: true"), "{retry}");
    let scan_id = jobs[1]["scanId"].as_str().unwrap();
    assert!(retry.contains(scan_id), "{retry}");
    assert_eq!(block_on(stream_jobs(&valkey, "jobs")).len(), 2);
    assert_eq!(counted(&valkey), 2);
}

/// `SIGTERM` while two scans sleep a 60 s hard delay (28 s of it in the
/// handler; one client waiting, one gone): `serve` exits within
/// `QUOTA_DRAIN_TIMEOUT_MS` (8 s by default) of the signal, where it used to
/// wait the sleeps out; the waiting client gets its 202 at once, its sleep
/// cut short and the rest of its delay deferred; both scans are counted once
/// with one job each, whose `notBefore` is still 60 s after its arrival.
#[test]
fn sigterm_wakes_sleeping_scans_into_jobs_within_the_drain() {
    let (valkey, mut child, addr) = serve_on_valkey(&[
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("QUOTA_ANON", "1"),
        ("QUOTA_SOFT_WINDOW", "0"),
        ("QUOTA_PACING", "off"),
        ("QUOTA_STORE_TIMEOUT_MS", "100"),
    ]);
    let (status, _, first) = timed_scan(addr);
    assert_eq!(status, 202, "{first}");
    let waiting = std::thread::spawn(move || timed_scan(addr));
    send_and_leave(
        addr,
        &post_scan(r#"{"image":"a"}"#),
        Duration::from_millis(300),
    );
    std::thread::sleep(Duration::from_millis(500));
    let terminated = Instant::now();
    common::consumer::signal(child.id(), "TERM");
    let (status, _, answer) = waiting.join().unwrap();
    assert_eq!(status, 202, "{answer}");
    assert!(
        answer.contains("x-stella-quota-delay-ms: 60000"),
        "{answer}"
    );
    let body: serde_json::Value =
        serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    let slept = body["sleptMs"].as_u64().unwrap();
    assert!((500..5_000).contains(&slept), "{body}");
    assert_eq!(body["deferredMs"].as_u64(), Some(60_000 - slept), "{body}");
    let exit = child.wait().unwrap();
    let took = terminated.elapsed();
    eprintln!("exited {took:?} after SIGTERM");
    assert!(exit.success(), "{exit:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    let jobs = block_on(stream_jobs(&valkey, "jobs"));
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    assert_eq!(counted(&valkey), 3);
    let at = |job: &serde_json::Value, field: &str| {
        humantime::parse_rfc3339(job[field].as_str().unwrap()).unwrap()
    };
    for job in &jobs[1..] {
        let held = at(job, "notBefore").duration_since(at(job, "receivedAt"));
        assert_eq!(held.unwrap(), Duration::from_secs(60), "{job}");
        assert!(job["deferredMs"].as_u64().unwrap() > 55_000, "{job}");
    }
    let stderr = stderr_of(&mut child);
    assert!(stderr.contains("drain_limit_ms=7000"), "{stderr}");
    assert!(
        stderr.contains("stopped: every request in flight answered"),
        "{stderr}"
    );
}

/// A scan whose client left keeps its connection's slot until it ends: at
/// `QUOTA_MAX_CONNECTIONS=1`, a fresh client is served only once the 2 s
/// delay of the scan left behind is over, so clients that send and leave
/// cannot pile up scans past the cap.
#[test]
fn a_scan_left_behind_keeps_its_slot() {
    let (_serve, addr) = spawn_serve(&[
        ("QUOTA_ANON", "1"),
        ("QUOTA_SOFT_DELAY_MS", "2000"),
        ("QUOTA_MAX_CONNECTIONS", "1"),
    ]);
    let (status, _, first) = timed_scan(addr);
    assert_eq!(status, 202, "{first}");
    let sent = Instant::now();
    send_and_leave(
        addr,
        &post_scan(r#"{"image":"a"}"#),
        Duration::from_millis(300),
    );
    let health = http(addr, &request("GET", "/healthz"));
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let waited = sent.elapsed();
    eprintln!("/healthz answered {waited:?} after the scan left behind was sent");
    assert!(waited >= Duration::from_millis(1800), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
}

/// A test's server is known by the socket it holds, not by a port that answers: a `serve` whose
/// port another process took is not mistaken for one that listens (it exited, unable to bind),
/// and one that did bind is found.
#[test]
fn a_server_is_known_by_its_own_listener() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let start = |addr: SocketAddr| {
        let child = std::process::Command::new(common::bin("quota-gate"))
            .arg("serve")
            .env_clear()
            .env("QUOTA_LISTEN", addr.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        KillOnDrop::new(child)
    };
    let mut loser = start(addr);
    assert!(!common::wait_for_listener(
        &mut loser,
        addr,
        Duration::from_secs(10)
    ));
    assert!(TcpStream::connect(addr).is_ok(), "the port still answers");
    let free = common::loopback(common::free_port());
    let mut winner = start(free);
    assert!(common::wait_for_listener(
        &mut winner,
        free,
        Duration::from_secs(10)
    ));
}
