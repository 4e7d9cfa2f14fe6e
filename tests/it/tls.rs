//! `rediss://` with rustls against real servers: `stunnel4` terminates TLS in
//! front of `valkey-server` (the pinned build has no TLS of its own), with a
//! test CA and server certificate made by `openssl` at test time.
//!
//! ElastiCache IAM authentication (`VALKEY_AUTH=iam`) against the same: the
//! Valkey stands in for ElastiCache with an ACL user whose password is the
//! token expected for a fixed clock and fixed credentials (the token itself
//! is checked against botocore in `tests/it/secrets.rs`), so a wrong token is
//! refused for real. The signer's clock, credentials and renewal interval
//! are the `testing` feature's (`IamSigner::for_tests`).
//!
//! `consume --post https://…` against the same `stunnel4` in front of a
//! plain HTTP scanner: trusted through `--post-ca`, refused with another CA.

use quota_gate_testkit as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use common::cluster::ValkeyCluster;
use common::*;
use quota_gate::config::IamConfig;
use quota_gate::gate::Gate;
use quota_gate::io::connection::Valkey;
use quota_gate::io::connection::iam::{IamSigner, TokenFor, token};
use quota_gate::io::meter::Meter;
use quota_gate::io::queue::stream::StreamQueue;
use quota_gate::io::store::valkey::ValkeyStore;

/// A throw-away CA and a server certificate for 127.0.0.1 and localhost.
struct TestPki {
    /// Removed on drop.
    _tmp: tempfile::TempDir,
    dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl is installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestPki {
    fn new(name: &str) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("quota-gate-pki-{name}-"))
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_path_buf();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
        openssl(
            &dir,
            &[
                &["req", "-x509", "-nodes", "-days", "2"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.pem",
                    "-subj",
                    "/CN=quota-gate test CA",
                ],
            ]
            .concat(),
        );
        openssl(
            &dir,
            &[
                &["req", "-nodes"][..],
                &ec,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=localhost",
                ],
            ]
            .concat(),
        );
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "server.ext",
                "-out",
                "server.pem",
            ],
        );
        Self { _tmp: tmp, dir }
    }

    fn ca(&self) -> String {
        self.dir.join("ca.pem").to_string_lossy().into_owned()
    }
}

/// `stunnel4` accepting TLS on `port` and forwarding to a plain backend, killed on drop.
struct TlsProxy {
    port: u16,
    _child: KillOnDrop,
}

impl TlsProxy {
    fn start(pki: &TestPki, port: u16, backend: u16) -> Self {
        let conf = pki.dir.join(format!("stunnel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "foreground = yes\npid =\noutput = {dir}/stunnel-{port}.log\n\
                 [valkey]\naccept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{backend}\n\
                 cert = {dir}/server.pem\nkey = {dir}/server.key\n",
                dir = pki.dir.display()
            ),
        )
        .unwrap();
        let child = Command::new("stunnel4")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("stunnel4 is installed (scripts/test installs it)");
        let mut child = KillOnDrop::new(child);
        assert!(
            wait_for_listener(&mut child, loopback(port), Duration::from_secs(10)),
            "stunnel did not start"
        );
        Self {
            port,
            _child: child,
        }
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }
}

/// Over rediss:// with VALKEY_TLS_CA the gate counts and queues exactly as over plain TCP.
#[tokio::test]
async fn counts_over_tls() {
    let pki = TestPki::new("standalone");
    let server = ValkeyServer::start();
    let proxy = TlsProxy::start(&pki, free_port(), server.port);
    let (url, ca) = (proxy.url(), pki.ca());
    // The first call pays for the handshake: allow for a loaded machine.
    let gate = stream_gate(&[
        ("VALKEY_URL", &url),
        ("VALKEY_TLS_CA", &ca),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
    ]);
    for n in 1..=3u64 {
        let r = gate.handle(scan_from("203.0.113.7")).await;
        assert_eq!(r.status(), 202);
        assert!(r.headers().get("x-stella-quota").is_none(), "counted");
        assert_eq!(json(&r)["quota"]["used"], n);
    }
    assert_eq!(stream_jobs(&server, "jobs").await.len(), 3);
    // The counter, its first-seen key, and its /24's counter.
    assert_eq!(gate.store().purge(false, None).await.unwrap(), 3);
}

/// A server the trusted roots do not vouch for is never used: not with the platform's
/// roots, not with another CA. The gate fails open without counting.
#[tokio::test]
async fn untrusted_server_is_refused() {
    let pki = TestPki::new("trusted");
    let other = TestPki::new("other");
    let server = ValkeyServer::start();
    let proxy = TlsProxy::start(&pki, free_port(), server.port);
    let (url, other_ca) = (proxy.url(), other.ca());
    for vars in [
        vec![("VALKEY_URL", url.as_str())],
        vec![
            ("VALKEY_URL", url.as_str()),
            ("VALKEY_TLS_CA", other_ca.as_str()),
        ],
    ] {
        let mut vars = vars;
        // The count gives up after 1 s, the enqueue at the 2.5 s ceiling.
        vars.extend([
            ("QUOTA_STORE_TIMEOUT_MS", "1000"),
            ("QUOTA_GATEWAY_TIMEOUT_MS", "2500"),
        ]);
        let gate = stream_gate(&vars);
        let r = gate.handle(scan_from("203.0.113.8")).await;
        // The queue shares the refused connection, so the scan is not accepted either.
        assert_eq!(r.status(), 503, "{vars:?}");
    }
    let mut c = server.client().await;
    let keys: Vec<String> = redis::AsyncCommands::keys(&mut c, "*").await.unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}

/// A VALKEY_TLS_CA that is no certificate fails at start, naming the variable.
#[test]
fn bad_ca_fails_at_start() {
    let pki = TestPki::new("bad");
    let bogus = pki.dir.join("bogus.pem");
    std::fs::write(
        &bogus,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let bogus = bogus.to_string_lossy().into_owned();
    for cluster in ["false", "true"] {
        let config = config(&[
            ("VALKEY_URL", "rediss://127.0.0.1:6379"),
            ("VALKEY_CLUSTER", cluster),
            ("VALKEY_TLS_CA", &bogus),
        ]);
        match Valkey::from_config(&config) {
            Err(e) => assert_eq!(e.var, "VALKEY_TLS_CA", "{e}"),
            Ok(_) => panic!("a bogus CA was accepted (cluster={cluster})"),
        }
    }
}

/// A three-node cluster, every node behind a TLS proxy of `pki` and
/// announcing the proxy's port: the cluster, the TLS ports, the proxies.
fn cluster_behind_tls(pki: &TestPki) -> (ValkeyCluster, Vec<u16>, Vec<TlsProxy>) {
    let tls_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let cluster = ValkeyCluster::start_with(|i| {
        vec![
            "--cluster-announce-port".to_owned(),
            tls_ports[i].to_string(),
        ]
    });
    let proxies = cluster
        .nodes
        .iter()
        .zip(&tls_ports)
        .map(|(node, port)| TlsProxy::start(pki, *port, node.port))
        .collect();
    (cluster, tls_ports, proxies)
}

/// Cluster and TLS together, as on ElastiCache Serverless: every node behind TLS,
/// announcing its TLS port; counting, queueing and a per-primary purge all work.
#[tokio::test]
async fn cluster_over_tls() {
    let pki = TestPki::new("cluster");
    let (cluster, tls_ports, _proxies) = cluster_behind_tls(&pki);
    let url = format!("rediss://127.0.0.1:{}", tls_ports[0]);
    let ca = pki.ca();
    let gate = stream_gate(&[
        ("VALKEY_URL", &url),
        ("VALKEY_CLUSTER", "true"),
        ("VALKEY_TLS_CA", &ca),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
    ]);
    for i in 0..30 {
        let r = gate.handle(scan_from(&format!("198.51.100.{i}"))).await;
        assert_eq!(r.status(), 202, "scan {i}: {}", json(&r));
        assert!(r.headers().get("x-stella-quota").is_none(), "counted");
    }
    let body = json(&gate.handle(scan_from("198.51.100.0")).await);
    assert_eq!(body["quota"]["used"], 2);
    assert_eq!(cluster.nodes_holding("quota:*"), 3);
    // Two keys a subject, and their /24's counter.
    assert_eq!(gate.store().purge(false, None).await.unwrap(), 61);
    assert!(cluster.keys("quota:*").is_empty());
    // Read back over the gate's own TLS connection: the nodes announce only TLS ports.
    let mut conn = gate.store().valkey().connection().await.unwrap();
    let jobs: u64 = redis::AsyncCommands::xlen(&mut conn, "jobs").await.unwrap();
    assert_eq!(jobs, 31);
}

const IAM_USER: &str = "quota-gate-iam";
const IAM_CACHE: &str = "quota-cache";
/// The signer's clock at the start, a fixed instant (UTC midnight).
const T0: u64 = 1_796_083_200;

/// A Valkey behind TLS standing in for ElastiCache, and the clock the
/// gates' tokens are signed as of.
struct IamRig {
    pki: TestPki,
    server: ValkeyServer,
    proxy: TlsProxy,
    now: Arc<AtomicU64>,
}

fn credentials() -> Credentials {
    let session = Some("IQoJb3JpZ2luX2VjE/session+token==".to_owned());
    Credentials::new(
        "ASIAEXAMPLEKEY123456",
        "c2VjcmV0/key+",
        session,
        None,
        "test",
    )
}

/// The token a signer makes at `at` seconds.
fn iam_token(at: u64) -> String {
    let request = TokenFor {
        user: IAM_USER,
        cache: IAM_CACHE,
        serverless: true,
        region: "us-east-1",
    };
    token(
        request,
        &credentials(),
        UNIX_EPOCH + Duration::from_secs(at),
    )
    .unwrap()
}

impl IamRig {
    fn start(name: &str) -> Self {
        let pki = TestPki::new(name);
        let server = ValkeyServer::start();
        let proxy = TlsProxy::start(&pki, free_port(), server.port);
        Self {
            pki,
            server,
            proxy,
            now: Arc::new(AtomicU64::new(T0)),
        }
    }

    /// `ACL SETUSER` of the IAM user with `rules` (its passwords).
    async fn user(&self, rules: &[String]) {
        let mut cmd = redis::cmd("ACL");
        cmd.arg(&["SETUSER", IAM_USER, "on", "~*", "&*", "+@all"])
            .arg(rules);
        let () = self.server.query(&cmd).await;
    }

    /// Refused sign-ins so far (`acl_access_denied_auth`).
    async fn refused(&self) -> u64 {
        let info: String = self.server.query(redis::cmd("INFO").arg("stats")).await;
        info.lines()
            .find_map(|l| l.strip_prefix("acl_access_denied_auth:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    }

    /// The Valkey of a gate signing in as the IAM user over TLS, its tokens
    /// signed as of the rig's clock (less `skew` seconds), renewed every `renew`.
    fn valkey(&self, skew: u64, renew: Duration) -> (quota_gate::config::Config, Valkey) {
        let (url, ca) = (self.proxy.url(), self.pki.ca());
        let vars = [("VALKEY_URL", url.as_str()), ("VALKEY_TLS_CA", ca.as_str())];
        iam_valkey(&vars, self.now.clone(), skew, renew)
    }

    fn gate(&self, renew: Duration) -> Gate<ValkeyStore, StreamQueue> {
        let (config, valkey) = self.valkey(0, renew);
        let queue = StreamQueue::new(valkey.clone(), "jobs");
        Gate::new(
            config,
            ValkeyStore::new(valkey),
            queue,
            Meter::new("test", None),
        )
        .unwrap()
    }
}

/// The Valkey `vars` name, signing in as the IAM user, its tokens signed as
/// of `now` (less `skew` seconds) and renewed every `renew`.
fn iam_valkey(
    vars: &[(&str, &str)],
    now: Arc<AtomicU64>,
    skew: u64,
    renew: Duration,
) -> (quota_gate::config::Config, Valkey) {
    let iam_vars = [
        ("VALKEY_AUTH", "iam"),
        ("VALKEY_USER", IAM_USER),
        ("VALKEY_CACHE_NAME", IAM_CACHE),
        ("VALKEY_CACHE_SERVERLESS", "true"),
        ("SCAN_QUEUE_URL", "valkey-stream:jobs"),
        ("QUOTA_STORE_TIMEOUT_MS", "2000"),
    ];
    let config = config(&with_vars(&iam_vars, vars));
    let iam: IamConfig = config.store.valkey.as_ref().unwrap().iam.clone().unwrap();
    let clock =
        Arc::new(move || UNIX_EPOCH + Duration::from_secs(now.load(Ordering::SeqCst) - skew));
    let provider = SharedCredentialsProvider::new(credentials());
    let signer = IamSigner::for_tests(iam, provider, "us-east-1", clock, renew);
    let valkey = Valkey::from_config_signed(&config, signer)
        .unwrap()
        .unwrap();
    (config, valkey)
}

/// Scans from `ip` until one is counted, for at most `within`.
async fn counted(gate: &Gate<ValkeyStore, StreamQueue>, ip: &str, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        let r = gate.handle(scan_from(ip)).await;
        if r.status() == 202 && r.headers().get("x-stella-quota").is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// With `VALKEY_AUTH=iam` the gate signs in over TLS with the token of its
/// clock and counts. A token the server does not take (signed a second
/// off) is refused: the error names the user and the cache, and a flood of
/// requests waiting for the connection does not make it retry at once.
#[tokio::test]
async fn iam_signs_in_with_its_token_and_a_wrong_one_is_refused() {
    let rig = IamRig::start("iam");
    rig.user(&[format!(">{}", iam_token(T0))]).await;
    let gate = rig.gate(Duration::from_secs(3600));
    for n in 1..=3u64 {
        let r = gate.handle(scan_from("203.0.113.9")).await;
        assert!(r.headers().get("x-stella-quota").is_none(), "counted");
        assert_eq!(json(&r)["quota"]["used"], n);
    }
    assert_eq!(rig.refused().await, 0);
    let (_, wrong) = rig.valkey(1, Duration::from_secs(3600));
    let err = wrong
        .connection()
        .await
        .err()
        .expect("a wrong token is refused");
    let why = err.to_string();
    assert!(why.contains(IAM_USER) && why.contains(IAM_CACHE), "{why}");
    assert!(why.contains("WRONGPASS"), "{why}");
    for _ in 0..20 {
        let _ = wrong.connected(Duration::from_millis(100)).await;
    }
    // Two seconds of waiting callers: attempts at 0, 1 s and 3 s at most.
    let refused = rig.refused().await;
    assert!((1..=3).contains(&refused), "{refused} refused sign-ins");
}

/// A live connection signs in again before its token runs out, with a new
/// token, and no request fails meanwhile; a reconnect signs anew.
#[tokio::test]
async fn iam_renews_live_connections_and_reconnects_sign_anew() {
    let rig = IamRig::start("iam-renew");
    let t1 = T0 + 600;
    rig.user(&[format!(">{}", iam_token(T0))]).await;
    let gate = rig.gate(Duration::from_millis(200));
    assert!(counted(&gate, "203.0.113.10", Duration::from_secs(5)).await);
    // Ten minutes on: the server takes the new token too, then only it.
    rig.user(&[format!(">{}", iam_token(t1))]).await;
    rig.now.store(t1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    rig.user(&[format!("<{}", iam_token(T0))]).await;
    let mut admin = rig.server.client().await;
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut admin)
        .await
        .unwrap();
    for i in 0..30 {
        let r = gate.handle(scan_from("203.0.113.11")).await;
        assert!(
            r.headers().get("x-stella-quota").is_none(),
            "scan {i} was not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let renewals = command_calls(&mut admin)
        .await
        .get("AUTH")
        .copied()
        .unwrap_or(0);
    assert!(renewals >= 3, "{renewals} renewals in 1.5 s");
    assert_eq!(rig.refused().await, 0, "a renewal used the old token");
    // A gate that renews hourly, connected on the T1 token; then only a later token is taken.
    drop(gate);
    let gate = rig.gate(Duration::from_secs(3600));
    assert!(counted(&gate, "203.0.113.12", Duration::from_secs(5)).await);
    let t2 = t1 + 600;
    rig.user(&["resetpass".to_owned(), format!(">{}", iam_token(t2))])
        .await;
    rig.now.store(t2, Ordering::SeqCst);
    let killed: u64 = redis::cmd("CLIENT")
        .arg(&["KILL", "USER", IAM_USER])
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(killed >= 1);
    assert!(
        counted(&gate, "203.0.113.13", Duration::from_secs(5)).await,
        "no reconnect"
    );
    assert_eq!(rig.refused().await, 0, "the reconnect used an old token");
}

/// As on ElastiCache Serverless: a cluster behind TLS, the IAM user on every
/// node (ACLs are per node). Every node connection the cluster client opens
/// signs in with the token, so scans count on all three primaries, each
/// through a connection of the IAM user, and none is refused.
#[tokio::test]
async fn iam_cluster_over_tls() {
    let pki = TestPki::new("iam-cluster");
    let (cluster, tls_ports, _proxies) = cluster_behind_tls(&pki);
    let password = format!(">{}", iam_token(T0));
    for node in &cluster.nodes {
        let mut cmd = redis::cmd("ACL");
        cmd.arg(&["SETUSER", IAM_USER, "on", "~*", "&*", "+@all", &password]);
        let () = node.query(&cmd).await;
    }
    let (url, ca) = (format!("rediss://127.0.0.1:{}", tls_ports[0]), pki.ca());
    let vars = [
        ("VALKEY_URL", url.as_str()),
        ("VALKEY_TLS_CA", ca.as_str()),
        ("VALKEY_CLUSTER", "true"),
    ];
    let (config, valkey) = iam_valkey(
        &vars,
        Arc::new(AtomicU64::new(T0)),
        0,
        Duration::from_secs(3600),
    );
    let queue = StreamQueue::new(valkey.clone(), "jobs");
    let gate = Gate::new(
        config,
        ValkeyStore::new(valkey),
        queue,
        Meter::new("test", None),
    )
    .unwrap();
    for i in 0..30 {
        let r = gate.handle(scan_from(&format!("198.51.100.{i}"))).await;
        assert_eq!(r.status(), 202, "scan {i}: {}", json(&r));
        assert!(
            r.headers().get("x-stella-quota").is_none(),
            "scan {i} was not counted"
        );
    }
    assert_eq!(cluster.nodes_holding("quota:*"), 3);
    // The gate's connection to each primary is the IAM user's (the test's
    // own connections are the default user's).
    for (i, node) in cluster.nodes.iter().enumerate() {
        let clients: String = node.query(redis::cmd("CLIENT").arg("LIST")).await;
        assert!(
            clients.contains(&format!("user={IAM_USER}")),
            "node {i}:\n{clients}"
        );
        let stats: String = node.query(redis::cmd("INFO").arg("stats")).await;
        assert!(
            stats.contains("acl_access_denied_auth:0"),
            "node {i} refused a sign-in"
        );
    }
}

/// A plain HTTP scanner on a port of its own: answers every `POST` 204 and
/// counts the requests that reached it (each on its own connection or not).
struct HttpScanner {
    port: u16,
    posts: Arc<AtomicU64>,
}

impl HttpScanner {
    fn start() -> Self {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let posts = Arc::new(AtomicU64::new(0));
        let seen = posts.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn);
                    loop {
                        let mut length = 0;
                        let mut line = String::new();
                        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                            if line == "\r\n" {
                                break;
                            }
                            let lower = line.to_ascii_lowercase();
                            if let Some(n) = lower.strip_prefix("content-length:") {
                                length = n.trim().parse().unwrap_or(0);
                            }
                            line.clear();
                        }
                        if line != "\r\n" {
                            return;
                        }
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        seen.fetch_add(1, Ordering::SeqCst);
                        let _ = reader
                            .get_mut()
                            .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n");
                    }
                });
            }
        });
        Self { port, posts }
    }

    fn posts(&self) -> u64 {
        self.posts.load(Ordering::SeqCst)
    }
}

/// `consume --post https://…` hands a job to a scanner behind TLS whose
/// certificate chains to `--post-ca`; checked against another CA, the
/// scanner is never reached and the failure names the certificate.
#[tokio::test(flavor = "multi_thread")]
async fn consume_posts_over_https() {
    use common::consumer::{StreamRig, job, now_ms};
    let pki = TestPki::new("post");
    let other = TestPki::new("post-other");
    let scanner = HttpScanner::start();
    let proxy = TlsProxy::start(&pki, free_port(), scanner.port);
    let url = format!("https://localhost:{}/scan", proxy.port);
    let (ca, other_ca) = (pki.ca(), other.ca());
    let untrusted = StreamRig::start();
    let args = |ca| ["--post", &url, "--post-ca", ca, "--backoff", "100ms"].map(str::to_owned);
    let refused = args(&other_ca);
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    let _refused = untrusted.consume("x", &refused, &[]);
    untrusted.queue(&[job(now_ms())]).await;
    untrusted
        .scanner
        .wait_for_log("x", "scan failed", Duration::from_secs(15));
    let errors = untrusted.scanner.errors_of("x");
    assert!(errors.contains("certificate"), "{errors}");
    assert_eq!(scanner.posts(), 0);
    let trusted = StreamRig::start();
    let accepted = args(&ca);
    let accepted: Vec<&str> = accepted.iter().map(String::as_str).collect();
    let _accepted = trusted.consume("y", &accepted, &[]);
    trusted.queue(&[job(now_ms()), job(now_ms())]).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while scanner.posts() < 2 || trusted.pending().await > 0 {
        assert!(
            Instant::now() < deadline,
            "{}",
            trusted.scanner.errors_of("y")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(scanner.posts(), 2);
}

/// A `--post-ca` that cannot be read, or is given for plain HTTP, stops the
/// consumer at start in one line.
#[test]
fn a_bad_post_ca_stops_the_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "no certificate here\n").unwrap();
    let empty = empty.to_string_lossy().into_owned();
    let cases = [
        (
            "https://localhost:1/scan",
            "/nonexistent/ca.pem",
            "--post-ca /nonexistent/ca.pem",
        ),
        (
            "https://localhost:1/scan",
            empty.as_str(),
            "holds no PEM certificate",
        ),
        (
            "http://localhost:1/scan",
            empty.as_str(),
            "--post-ca is for an https://",
        ),
    ];
    for (url, ca, expected) in cases {
        let out = Command::new(bin("quota-gate"))
            .args(["consume", "--from", "-", "--post", url, "--post-ca", ca])
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
}
