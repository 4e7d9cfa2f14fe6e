//! `rediss://` with rustls against real servers: `stunnel4` terminates TLS in
//! front of `valkey-server` (the pinned build has no TLS of its own), with a
//! test CA and server certificate made by `openssl` at test time.

use quota_gate_testkit as common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::ValkeyCluster;
use common::*;
use quota_gate::io::connection::Valkey;

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
        let proxy = Self {
            port,
            _child: KillOnDrop::new(child),
        };
        assert!(
            wait_for_port(loopback(port), Duration::from_secs(10)),
            "stunnel did not start"
        );
        proxy
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
        vars.push(("QUOTA_STORE_TIMEOUT_MS", "1000"));
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

/// Cluster and TLS together, as on ElastiCache Serverless: every node behind TLS,
/// announcing its TLS port; counting, queueing and a per-primary purge all work.
#[tokio::test]
async fn cluster_over_tls() {
    let pki = TestPki::new("cluster");
    let tls_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let cluster = ValkeyCluster::start_with(|i| {
        vec![
            "--cluster-announce-port".to_owned(),
            tls_ports[i].to_string(),
        ]
    });
    let _proxies: Vec<TlsProxy> = cluster
        .nodes
        .iter()
        .zip(&tls_ports)
        .map(|(node, port)| TlsProxy::start(&pki, *port, node.port))
        .collect();
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
