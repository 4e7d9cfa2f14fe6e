//! The shared harness of quota-gate's integration tests (`tests/*.rs`) and
//! its benchmark (`benches/gate/`): a dev-only crate of the workspace, never
//! published. Each test file imports it as `use quota_gate_testkit as common;`.
//!
//! What it provides:
//!
//! - local servers, each a real process on a free port, killed on drop
//!   ([`KillOnDrop`]): a pinned `valkey-server` ([`ValkeyServer`]), a
//!   3-primary Valkey cluster ([`cluster`]), a `moto` server for SQS and
//!   CloudWatch ([`moto`]), and `quota-gate serve` itself ([`serve`]);
//! - gates built from plain variable lists, never from the process
//!   environment ([`config`], [`gate`], [`valkey_gate`], [`stream_gate`]),
//!   and the jobs they queued on a Valkey stream ([`stream_jobs`]);
//! - requests: `POST /scan` from an address, with or without a token
//!   ([`scan_from`], [`scan_with_token`]), the sample events of `events/`,
//!   test JWTs signed with the keys of `tests/fixtures/jwt/` ([`mint`]),
//!   sent [`all_at_once`] or [`one_at_a_time`];
//! - scenarios several files share: the seed's tiers ([`TIERS`], checked by
//!   [`assert_tiers`]), the seed's delays ([`SEED_DELAYS`]), and exact
//!   counts under concurrency ([`assert_400_concurrent_scans_count_exactly`]);
//! - a TCP proxy switchable between upstreams, for failovers ([`proxy`]);
//! - the deterministic simulation of the request path ([`sim`]);
//! - the one HTTP/1.1 client of the tests and the bench ([`client`]);
//! - `quota-gate consume` with a scanner that records its starts, ends and
//!   overlaps, and the consumer's promises checked on that record ([`consumer`]);
//! - fakes: queues that record, discard or refuse jobs ([`RecordingQueue`],
//!   [`Discard`], [`Refuse`]) and a sink that collects what is written to it,
//!   EMF lines or progress ([`Capture`]).

pub mod client;
pub mod cluster;
pub mod consumer;
pub mod lambda;
pub mod markdown;
pub mod moto;
pub mod proxy;
pub mod schema;
pub mod serve;
pub mod sim;

mod fakes;

pub use fakes::{Capture, Discard, OwnedPace, RecordingQueue, Refuse};

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, header};
use quota_gate::config::Config;
use quota_gate::gate::{Gate, GateRequest};
use quota_gate::io::connection::Valkey;
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::ScanQueue;
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::queue::stream::lane_key;
use quota_gate::io::store::valkey::ValkeyStore;
use quota_gate::rules::job::Lane;

/// The repository root (this crate lives in `testkit/`, one level below).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent")
        .to_path_buf()
}

/// A binary of the `quota-gate` package (`quota-gate`, `bootstrap`), as
/// Cargo built it for the running test or bench: beside the `deps/` folder
/// that holds the test's own executable.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let mut dir = exe.parent().expect("a folder").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} not built (cargo builds it for integration tests and benches)",
        path.display()
    );
    path
}

/// The pinned `valkey-server`: `$VALKEY_SERVER`, else `.tools/bin/valkey-server`
/// as installed by `scripts/test`.
pub fn valkey_server_bin() -> PathBuf {
    std::env::var_os("VALKEY_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".tools/bin/valkey-server"))
}

/// A port nobody listens on right now, and one this process never handed out before: tests run
/// in parallel in one process, and two servers given the same port would race for it, the loser
/// exiting while the winner answers its tests (another test's gate, another store).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Waits until `child` itself listens on `addr` (every server the tests start listens in its own
/// process); `false` once it has exited or `within` has passed. A port that merely accepts proves
/// nothing: another process (the container check's, beside the tests) may hold it, and `child`
/// then failed to bind.
pub fn wait_for_listener(child: &mut Child, addr: SocketAddr, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return false;
        }
        if listener_inode(addr).is_some_and(|inode| held_by(child.id(), inode)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The inode of the socket listening on `addr` (or on every address at its port), from
/// `/proc/net/tcp`, where 127.0.0.1:6379 reads `0100007F:18EB` on a little-endian host.
fn listener_inode(addr: SocketAddr) -> Option<u64> {
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    let exact = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    let any = format!("00000000:{:04X}", v4.port());
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let listening = fields.get(3) == Some(&"0A");
        let local = fields.get(1).copied()?;
        (listening && (local == exact || local == any)).then(|| fields.get(9)?.parse().ok())?
    })
}

/// Whether process `pid` holds the socket `inode` open.
fn held_by(pid: u32, inode: u64) -> bool {
    let socket = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == socket.as_str()))
    })
}

/// A child process that is killed and reaped when dropped, so a failing
/// test leaves no server behind. Derefs to the [`Child`] (its pipes, its id).
pub struct KillOnDrop(Child);

impl KillOnDrop {
    pub fn new(child: Child) -> Self {
        Self(child)
    }

    /// Kills the process now (SIGKILL) and waits for it.
    pub fn kill_now(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// A `valkey-server` of our own, killed on drop.
pub struct ValkeyServer {
    pub port: u16,
    child: KillOnDrop,
    /// Removed on drop, after the server is gone.
    dir: tempfile::TempDir,
}

impl ValkeyServer {
    /// Starts a throw-away standalone server with persistence off.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `--option value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        for _ in 0..5 {
            // Another test may take the port between our probe and the bind.
            if let Some(server) = Self::try_start(free_port(), extra) {
                return server;
            }
        }
        panic!("valkey-server did not start");
    }

    /// Starts a server on a given `port` (one a gate was already pointed at), waiting for it.
    pub fn start_on(port: u16, extra: &[&str]) -> Self {
        Self::try_start(port, extra)
            .unwrap_or_else(|| panic!("valkey-server did not start on port {port}"))
    }

    fn try_start(port: u16, extra: &[&str]) -> Option<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("quota-gate-valkey-{port}-"))
            .tempdir()
            .unwrap();
        let mut server = Self {
            port,
            child: spawn_valkey(port, dir.path(), extra),
            dir,
        };
        server.is_ready(Duration::from_secs(10)).then_some(server)
    }

    /// Whether our own process (not another test's server on the same port) answers.
    fn is_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return false;
            }
            let info = redis::Client::open(self.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c));
            if let Ok(info) = info {
                return info.contains(&format!("process_id:{}\r\n", self.child.id()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain client connection for assertions, patient where redis-rs's
    /// defaults (1 s to connect, 500 ms an answer) are not: a loaded test
    /// machine, or a server just resumed, can take longer to answer.
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        let patient = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&patient)
            .await
            .unwrap()
    }

    /// `cmd`'s answer on a fresh connection, as `T`.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut c = self.client().await;
        cmd.query_async(&mut c).await.unwrap()
    }

    /// Every key matching `pattern` (`KEYS`).
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        self.query(redis::cmd("KEYS").arg(pattern)).await
    }

    /// `GET key`, as `T`.
    pub async fn get<T: redis::FromRedisValue>(&self, key: &str) -> T {
        self.query(redis::cmd("GET").arg(key)).await
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A replica of the server at `primary` (`--replicaof`), once it has
    /// the primary's data.
    pub async fn replica_of(primary: SocketAddr) -> Self {
        let port = primary.port().to_string();
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &port]);
        replica.wait_in_sync().await;
        replica
    }

    /// Waits until this replica has its primary's data (`master_link_status:up`).
    pub async fn wait_in_sync(&self) {
        let mut c = self.client().await;
        for _ in 0..200 {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut c)
                .await
                .unwrap();
            if info.contains("master_link_status:up") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the replica on port {} never synced", self.port);
    }

    /// `REPLICAOF NO ONE`: this replica becomes a primary.
    pub async fn promote(&self) {
        let mut c = self.client().await;
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut c)
            .await
            .unwrap();
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`) to the server process.
    pub fn signal(&self, signal: &str) {
        consumer::signal(self.pid(), signal);
    }

    /// SIGKILL (no shutdown, no goodbye to clients), then a new process on the
    /// same port and data directory with `extra` options (an AOF survives).
    pub fn crash_and_restart(&mut self, down_for: Duration, extra: &[&str]) {
        self.child.kill_now();
        std::thread::sleep(down_for);
        self.child = spawn_valkey(self.port, self.dir.path(), extra);
        assert!(
            self.is_ready(Duration::from_secs(10)),
            "valkey-server did not restart on port {}",
            self.port
        );
    }
}

impl Drop for ValkeyServer {
    fn drop(&mut self) {
        self.child.kill_now();
    }
}

/// A throw-away `valkey-server` on `port`: loopback only, persistence off unless `extra` says.
fn spawn_valkey(port: u16, dir: &Path, extra: &[&str]) -> KillOnDrop {
    let bin = valkey_server_bin();
    let child = Command::new(&bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--dir", &dir.to_string_lossy()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {bin:?} (run scripts/test once to install it): {e}")
        });
    KillOnDrop::new(child)
}

/// A configuration from `vars` only (no process environment), hashing with
/// [`SECRET`] unless `vars` set `QUOTA_HASH_SECRET`.
pub fn config(vars: &[(&str, &str)]) -> Config {
    let mut map: HashMap<String, String> =
        HashMap::from([("QUOTA_HASH_SECRET".to_owned(), SECRET_TEXT.to_owned())]);
    map.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::from_lookup(|k| map.get(k).cloned()).expect("valid test configuration")
}

/// `base` followed by `extra`: a variable list where `extra` wins.
pub fn with_vars<'a>(
    base: &[(&'a str, &'a str)],
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut all = base.to_vec();
    all.extend_from_slice(extra);
    all
}

/// The hash secret of test configurations.
pub const SECRET_TEXT: &str = "test-secret-0123456789abcdef";
pub const SECRET: &[u8] = SECRET_TEXT.as_bytes();

/// A gate over `store` and `queue`, EMF lines discarded.
pub fn gate<S, Q>(vars: &[(&str, &str)], store: S, queue: Q) -> Gate<S, Q>
where
    S: quota_gate::io::store::QuotaStore,
    Q: ScanQueue,
{
    metered_gate(vars, store, queue, Meter::new("test", None))
}

/// A gate over `store` and `queue` whose EMF lines go to `meter`.
pub fn metered_gate<S, Q>(vars: &[(&str, &str)], store: S, queue: Q, meter: Meter) -> Gate<S, Q>
where
    S: quota_gate::io::store::QuotaStore,
    Q: ScanQueue,
{
    Gate::new(config(vars), store, queue, meter).unwrap()
}

/// A gate on the Valkey that `vars` name (`VALKEY_URL`, …), queueing to the
/// stream `SCAN_QUEUE_URL` names (`valkey-stream:jobs` unless `vars` say
/// otherwise) on the same Valkey. Later entries of `vars` win.
pub fn stream_gate(vars: &[(&str, &str)]) -> Gate<ValkeyStore, StreamQueue> {
    let config = config(&with_vars(
        &[("SCAN_QUEUE_URL", "valkey-stream:jobs")],
        vars,
    ));
    let valkey = Valkey::from_config(&config)
        .unwrap()
        .expect("VALKEY_URL is set");
    let quota_gate::config::QueueTarget::ValkeyStream(key) = &config.queue else {
        panic!("SCAN_QUEUE_URL must name a Valkey stream here");
    };
    let queue = StreamQueue::new(valkey.clone(), key);
    Gate::new(
        config,
        ValkeyStore::new(valkey),
        queue,
        Meter::new("test", None),
    )
    .unwrap()
}

/// A gate on `server`, queueing to the stream `jobs` on the same server.
pub fn valkey_gate(server: &ValkeyServer, vars: &[(&str, &str)]) -> Gate<ValkeyStore, StreamQueue> {
    let url = server.url();
    stream_gate(&with_vars(&[("VALKEY_URL", url.as_str())], vars))
}

/// A gate on `server` that verifies tokens with the Ed25519 test key; and `extra`.
pub fn token_gate(server: &ValkeyServer, extra: &[(&str, &str)]) -> Gate<ValkeyStore, StreamQueue> {
    let key = fixture("ed25519.pub.pem");
    valkey_gate(server, &with_vars(&[("QUOTA_JWT_PUBLIC_KEY", &key)], extra))
}

/// 3 scans within quota, 2 soft, then hard, with a 2 s store timeout;
/// then `extra`.
pub fn small_quota(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let base = [
        ("QUOTA_ANON", "3"),
        ("QUOTA_SOFT_WINDOW", "2"),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
    ];
    with_vars(&base, extra)
}

/// The seed's tiers at small limits: 3 scans within quota, 2 soft (5 s),
/// then hard (60 s); nothing slept, no pacing.
pub const TIERS: &[(&str, &str)] = &[
    ("QUOTA_ANON", "3"),
    ("QUOTA_SOFT_WINDOW", "2"),
    ("QUOTA_DELAY_MODE", "defer"),
    ("QUOTA_PACING", "off"),
];

/// The seed's example at a small scale: 2 scans within quota, 3 soft (1 s),
/// then hard (3 s).
pub const SEED_DELAYS: &[(&str, &str)] = &[
    ("QUOTA_ANON", "2"),
    ("QUOTA_SOFT_WINDOW", "3"),
    ("QUOTA_SOFT_DELAY_MS", "1000"),
    ("QUOTA_HARD_DELAY_MS", "3000"),
];

/// Sends 8 scans from one address, one at a time, to a gate configured with
/// [`TIERS`]: each is a 202 counted by the store (1…8) with the quota
/// headers, and the delays are none for 1–3, soft for 4–5, hard for 6–8.
pub async fn assert_tiers<S, Q>(gate: &Gate<S, Q>)
where
    S: quota_gate::io::store::QuotaStore,
    Q: ScanQueue,
{
    let answers = one_at_a_time(gate, (0..8).map(|_| scan_from("203.0.113.7"))).await;
    let mut delays = Vec::new();
    for (n, r) in (1u64..).zip(&answers) {
        assert_eq!(r.status(), 202, "{:?}", r.body());
        assert!(
            r.headers().get("x-stella-quota").is_none(),
            "store answered"
        );
        let body = json(r);
        assert_eq!(body["quota"]["used"], n);
        let remaining = 3u64.saturating_sub(n).to_string();
        assert_eq!(r.headers()["x-stella-quota-remaining"], remaining.as_str());
        assert_eq!(r.headers()["ratelimit-policy"], "\"daily\";q=3;w=86400");
        delays.push(body["delayMs"].as_u64().unwrap());
    }
    assert_eq!(delays, [0, 0, 0, 5000, 5000, 60000, 60000, 60000]);
}

/// Limits for the concurrency test: 100 within, 30 soft, the rest hard,
/// nothing slept, pacing on with room for the whole burst's backlog, and a
/// generous store timeout: the test is about exactness, not latency, and
/// connections opening at once on a loaded CI machine can take a while.
const CONCURRENCY_VARS: &[(&str, &str)] = &[
    ("QUOTA_ANON", "100"),
    ("QUOTA_SOFT_WINDOW", "30"),
    ("QUOTA_DELAY_MODE", "defer"),
    ("QUOTA_MAX_BACKLOG_MS", "86400000"),
    ("QUOTA_STORE_TIMEOUT_MS", "2000"),
];

/// An RFC 3339 instant as unix milliseconds.
pub fn unix_ms(rfc3339: &str) -> i64 {
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339:?}: {e}"));
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// Sends 400 scans from one subject at once, spread over eight gates that
/// `make_gate` builds from the variables it is given (each with its own
/// connection, as separate Lambda instances would have), and checks the
/// counts are 1…400 exactly once each, with 30 soft and 270 hard scans whose
/// start slots are all distinct and one delay apart (pacing).
pub async fn assert_400_concurrent_scans_count_exactly<Q: ScanQueue>(
    make_gate: impl Fn(&[(&str, &str)]) -> Gate<ValkeyStore, Q>,
) {
    let gates: Vec<_> = (0..8)
        .map(|_| Arc::new(make_gate(CONCURRENCY_VARS)))
        .collect();
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let gate = gates[i % gates.len()].clone();
            tokio::spawn(async move { json(&gate.handle(scan_from("203.0.113.50")).await) })
        })
        .collect();
    let mut counts = Vec::new();
    let mut slots = Vec::new();
    for t in tasks {
        let body = t.await.unwrap();
        let used = body["quota"]["used"].as_u64().expect("counted");
        counts.push(used);
        if used > 100 {
            let tier_delay = if used <= 130 { 5000 } else { 60000 };
            slots.push((unix_ms(body["notBefore"].as_str().unwrap()), tier_delay));
        } else {
            assert_eq!(body["delayMs"], 0, "within quota: no delay");
        }
    }
    counts.sort_unstable();
    assert_eq!(counts, (1..=400).collect::<Vec<u64>>());
    slots.sort_unstable();
    assert_eq!(slots.iter().filter(|(_, d)| *d == 5000).count(), 30);
    assert_eq!(slots.len(), 300);
    for pair in slots.windows(2) {
        let ((before, _), (after, delay)) = (pair[0], pair[1]);
        assert_eq!(after - before, delay, "slots one delay apart: {pair:?}");
    }
}

/// Each command's calls since Valkey's stats were last reset (`INFO
/// commandstats`, the command upper-cased), less the caller's own `INFO`
/// and `CONFIG RESETSTAT`, asked on `admin`.
pub async fn command_calls(
    admin: &mut redis::aio::MultiplexedConnection,
) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(command, _)| !matches!(*command, "config|resetstat" | "info"))
        .map(|(command, stats)| {
            let calls = stats
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.parse().ok())
                .expect("a calls= field");
            (command.to_uppercase(), calls)
        })
        .collect()
}

/// Every job queued on the stream `key`, oldest first.
pub async fn stream_jobs(server: &ValkeyServer, key: &str) -> Vec<serde_json::Value> {
    jobs_on(&mut server.client().await, key).await
}

/// Every job on the queue `key` through `conn` (standalone or cluster):
/// both lanes' streams, oldest entry first.
pub async fn jobs_on(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
) -> Vec<serde_json::Value> {
    let mut entries = Vec::new();
    for lane in [Lane::Within, Lane::Over] {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(lane_key(key, lane))
            .arg("-")
            .arg("+")
            .query_async(conn)
            .await
            .unwrap();
        entries.extend(reply.ids);
    }
    // Entry ids are `<ms>-<seq>`: oldest first across the two streams.
    let order = |id: &str| -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    };
    entries.sort_by_key(|e| order(&e.id));
    entries
        .iter()
        .map(|entry| serde_json::from_str(&entry.get::<String>("job").unwrap()).unwrap())
        .collect()
}

/// The body every valid test scan carries.
pub const SCAN_BODY: &str = r#"{"image":"registry.example.com/team/app:1.4.2"}"#;

/// `POST /scan` from `ip` with a valid body.
pub fn scan_from(ip: &str) -> GateRequest {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    GateRequest {
        method: Method::POST,
        path: "/scan".into(),
        headers,
        body: Bytes::from_static(SCAN_BODY.as_bytes()),
        peer: Some(ip.parse().unwrap()),
        ..GateRequest::default()
    }
}

/// `GET /quota` from `ip`.
pub fn quota_from(ip: &str) -> GateRequest {
    GateRequest {
        method: Method::GET,
        path: "/quota".into(),
        peer: Some(ip.parse().unwrap()),
        ..GateRequest::default()
    }
}

/// The same with `Authorization: Bearer <token>`.
pub fn scan_with_token(ip: &str, token: &str) -> GateRequest {
    let mut r = scan_from(ip);
    r.headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    r
}

/// A sample event's bytes.
pub fn event_text(name: &str) -> String {
    std::fs::read_to_string(root().join("events").join(name)).unwrap()
}

/// A sample event, parsed exactly as the Lambda runtime would.
pub fn event(name: &str) -> lambda_http::Request {
    lambda_http::request::from_str(&event_text(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The JSON body of a response.
pub fn json(response: &http::Response<Bytes>) -> serde_json::Value {
    serde_json::from_slice(response.body()).unwrap()
}

/// The path of a JWT test fixture.
pub fn fixture(name: &str) -> String {
    root()
        .join("tests/fixtures/jwt")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// The bearer token carried by a sample event.
pub fn event_token(name: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(&event_text(name)).unwrap();
    let auth = v["headers"]["authorization"].as_str().unwrap();
    auth.strip_prefix("Bearer ").unwrap().to_owned()
}

/// Mints a token with a test key; `alg` is RS256, ES256 or EdDSA.
pub fn mint(alg: jsonwebtoken::Algorithm, claims: serde_json::Value) -> String {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let (file, kid) = match alg {
        Algorithm::RS256 => ("rs256.key.pem", "rs-1"),
        Algorithm::ES256 => ("es256.key.pem", "es-1"),
        _ => ("ed25519.key.pem", "ed-1"),
    };
    let pem = std::fs::read(fixture(file)).unwrap();
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
        _ => EncodingKey::from_ed_pem(&pem),
    }
    .unwrap();
    let mut header = Header::new(alg);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Sends `requests` to `gate` all at once, each in a task of its own, and
/// returns each answer as it came (in request order).
pub async fn all_at_once<S, Q>(
    gate: &Arc<Gate<S, Q>>,
    requests: impl IntoIterator<Item = GateRequest>,
) -> Vec<http::Response<Bytes>>
where
    S: quota_gate::io::store::QuotaStore,
    Q: ScanQueue,
{
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let gate = gate.clone();
            tokio::spawn(async move { gate.handle(request).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for t in tasks {
        answers.push(t.await.expect("no panic"));
    }
    answers
}

/// Sends `requests` to `gate` one after another, each once the answer to
/// the one before is in, and returns the answers in order.
pub async fn one_at_a_time<S, Q>(
    gate: &Gate<S, Q>,
    requests: impl IntoIterator<Item = GateRequest>,
) -> Vec<http::Response<Bytes>>
where
    S: quota_gate::io::store::QuotaStore,
    Q: ScanQueue,
{
    let mut answers = Vec::new();
    for request in requests {
        answers.push(gate.handle(request).await);
    }
    answers
}

/// Each response's status and JSON body.
pub fn statuses_and_bodies(responses: &[http::Response<Bytes>]) -> Vec<(u16, serde_json::Value)> {
    responses
        .iter()
        .map(|r| (r.status().as_u16(), json(r)))
        .collect()
}

/// The whole seconds of a response's `Retry-After`.
pub fn retry_after(response: &http::Response<Bytes>) -> u64 {
    response.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Fails if `text` holds any of `secrets`, a token's signature, or a run of
/// 64 hex digits (a digest).
pub fn assert_nothing_personal(text: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(!text.contains(secret), "{secret} in:\n{text}");
        if let Some(signature) = secret.rsplit('.').next().filter(|s| s.len() > 16) {
            assert!(!text.contains(signature), "a token signature in:\n{text}");
        }
    }
    let mut run = 0;
    for c in text.chars() {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        assert!(run < 64, "a digest-like hex run in:\n{text}");
    }
}
