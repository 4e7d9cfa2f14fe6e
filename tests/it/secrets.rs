//! Secrets by reference (`secretsmanager:<ARN or name>`, `ssm:<parameter>`),
//! read at start from a real moto server's Secrets Manager and Parameter
//! Store: in process through `io::secrets::resolve_with`, and from outside
//! through `quota-gate serve`, `consume` and the Lambda `bootstrap`; and
//! `file:<path>` references, mounted secret files, read by `serve`.
//!
//! What moto can and cannot stand for: it serves both stores as AWS does
//! (missing secrets and parameters, a secret scheduled for deletion, a
//! parameter's type), and with `INITIAL_NO_AUTH_ACTION_COUNT` it checks
//! signatures and IAM actions, so a principal without
//! `secretsmanager:GetSecretValue` is refused for real. It does not check a
//! policy's `Resource` for these services, nor KMS key policies, so the
//! template's grant of one ARN alone is checked by `tests/it/template.rs`, not here.
//!
//! The other credential the gate holds no value of: the ElastiCache IAM
//! authentication token (`VALKEY_AUTH=iam`), compared byte for byte with what
//! botocore signs for the same credentials, time, region, cache and user
//! (its use against a real Valkey is in `tests/it/tls.rs`).

use quota_gate_testkit as common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, UNIX_EPOCH};

use aws_credential_types::Credentials;
use common::moto::MotoServer;
use common::serve::spawn_serve;
use common::*;
use quota_gate::io::connection::iam::{TokenFor, token};
use quota_gate::io::secrets::resolve_with;

const HASH_SECRET: &str = "moto-held-hash-secret-7f3a9c1e5b2d4f60";
const VALKEY_PASSWORD: &str = "moto-held-valkey-password-c41d8e2a";

/// A lookup over `vars`.
fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The AWS environment of a child process that reads `moto`.
fn aws_env(moto: &MotoServer) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", moto.endpoint()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "testing".to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
    ]
}

/// A secret by ARN and by name, and a SecureString parameter, resolve to
/// their values; the configuration parsed from them uses them.
#[test]
fn references_resolve() {
    let moto = MotoServer::start();
    runtime().block_on(async {
        let arn = moto.create_secret("quota/hash", HASH_SECRET).await;
        let url = "redis://:pw@127.0.0.1:6390";
        moto.put_parameter("/quota/valkey-url", url, true).await;
        let sdk = moto.sdk_config().await;
        for hash in [
            format!("secretsmanager:{arn}"),
            "secretsmanager:quota/hash".into(),
        ] {
            let base = lookup(&[
                ("QUOTA_HASH_SECRET", &hash),
                ("VALKEY_URL", "ssm:/quota/valkey-url"),
                ("QUOTA_ANON", "7"),
            ]);
            let resolved = resolve_with(base, &sdk).await.unwrap();
            assert_eq!(resolved.from_store(), ["QUOTA_HASH_SECRET", "VALKEY_URL"]);
            assert!(!format!("{resolved:?}").contains(HASH_SECRET));
            let config = quota_gate::Config::from_lookup(|k| resolved.get(k)).unwrap();
            assert_eq!(config.hash_secret(), HASH_SECRET.as_bytes());
            assert_eq!(config.store.valkey.unwrap().url, url);
            assert_eq!(config.policy.quota_anon.get(), 7);
        }
    });
}

/// Every reference that cannot give a secret stops the start with the
/// variable's name, the reference and the store's reason, never a value:
/// a missing secret, a missing parameter, a secret scheduled for deletion
/// (moto refuses to read it, as AWS does), a plain `String` parameter (not
/// encrypted: refused by the gate), and a secret of blanks.
#[test]
fn unreadable_references_name_the_variable() {
    let moto = MotoServer::start();
    runtime().block_on(async {
        moto.create_secret("deleted", HASH_SECRET).await;
        moto.delete_secret("deleted").await;
        moto.create_secret("blank", " \n").await;
        moto.put_parameter("/plain", HASH_SECRET, false).await;
        let sdk = moto.sdk_config().await;
        let cases = [
            (
                "QUOTA_HASH_SECRET",
                "secretsmanager:missing",
                "ResourceNotFound",
            ),
            ("VALKEY_URL", "ssm:/missing", "ParameterNotFound"),
            (
                "QUOTA_HASH_SECRET",
                "secretsmanager:deleted",
                "marked deleted",
            ),
            ("QUOTA_HASH_SECRET", "ssm:/plain", "not a SecureString"),
            ("VALKEY_URL", "secretsmanager:blank", "empty"),
        ];
        for (var, reference, reason) in cases {
            let e = resolve_with(lookup(&[(var, reference)]), &sdk)
                .await
                .unwrap_err();
            let message = e.to_string();
            assert_eq!(e.var, var, "{message}");
            assert!(message.contains(reference), "{message}");
            assert!(message.contains(reason), "{reason}: {message}");
            assert!(!message.contains(HASH_SECRET), "{message}");
        }
    });
}

/// A principal whose policy does not allow `secretsmanager:GetSecretValue`
/// is refused by moto's IAM check (signatures and actions enforced after
/// the setup's three requests), and the start names the variable.
#[test]
fn a_principal_without_permission_is_refused() {
    let moto = MotoServer::start_with(&[("INITIAL_NO_AUTH_ACTION_COUNT", "3")]);
    let (key_id, secret_key) = moto.iam_user("gate"); // requests 1 and 2
    runtime().block_on(async {
        moto.create_secret("quota/hash", HASH_SECRET).await; // request 3
        let sdk = moto.sdk_config_as(&key_id, &secret_key).await;
        let base = lookup(&[("QUOTA_HASH_SECRET", "secretsmanager:quota/hash")]);
        let e = resolve_with(base, &sdk).await.unwrap_err();
        let message = e.to_string();
        assert_eq!(e.var, "QUOTA_HASH_SECRET", "{message}");
        assert!(message.contains("AccessDenied"), "{message}");
        assert!(!message.contains(HASH_SECRET), "{message}");
    });
}

/// `serve` started with references to moto counts and answers as with the
/// plain values (the same counters, so the same hash key and the same
/// password-protected Valkey), and nothing it printed at `RUST_LOG=trace`
/// holds the hash key or the password.
#[test]
fn serve_with_references_answers_as_with_values() {
    let (moto, valkey, plain_url) = stores_with_secrets();
    let plain = [
        ("QUOTA_HASH_SECRET", HASH_SECRET),
        ("VALKEY_URL", plain_url.as_str()),
    ];
    let (first, first_keys) = three_scans(&plain, &plain_url);
    let mut by_reference: Vec<(&str, String)> = aws_env(&moto);
    by_reference.push(("QUOTA_HASH_SECRET", "secretsmanager:quota/hash".into()));
    by_reference.push(("VALKEY_URL", "ssm:/quota/valkey-url".into()));
    by_reference.push(("RUST_LOG", "trace".into()));
    let vars: Vec<(&str, &str)> = by_reference.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (second, second_keys) = three_scans(&vars, &plain_url);
    assert_eq!(first, [(202, 1), (202, 2), (202, 3)]);
    assert_eq!(second.len(), 3);
    assert_eq!(second, [(202, 4), (202, 5), (202, 6)], "the same counter");
    assert_eq!(first_keys, second_keys, "the same digests");
    drop(valkey);
}

/// `file:` references (files ending in a newline, as mounted Docker and
/// Kubernetes secrets do) give `serve` the same counter and digests as the
/// values themselves; a missing file stops it (exit status 2) naming the
/// variable and the path, and no secret is printed.
#[test]
fn serve_with_secret_files_answers_as_with_values() {
    let valkey = ValkeyServer::start();
    let url = format!("redis://:{VALKEY_PASSWORD}@127.0.0.1:{}", valkey.port);
    runtime().block_on(async {
        let mut c = valkey.client().await;
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "requirepass", VALKEY_PASSWORD])
            .query_async(&mut c)
            .await
            .unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let (hash_file, url_file) = (dir.path().join("hash"), dir.path().join("url"));
    std::fs::write(&hash_file, format!("{HASH_SECRET}\n")).unwrap();
    std::fs::write(&url_file, format!("{url}\n")).unwrap();
    let plain = [
        ("QUOTA_HASH_SECRET", HASH_SECRET),
        ("VALKEY_URL", url.as_str()),
    ];
    let (first, first_keys) = three_scans(&plain, &url);
    let hash_ref = format!("file:{}", hash_file.display());
    let url_ref = format!("file:{}", url_file.display());
    let by_file = [
        ("QUOTA_HASH_SECRET", hash_ref.as_str()),
        ("VALKEY_URL", url_ref.as_str()),
        ("RUST_LOG", "trace"),
    ];
    let (second, second_keys) = three_scans(&by_file, &url);
    assert_eq!(first, [(202, 1), (202, 2), (202, 3)]);
    assert_eq!(second, [(202, 4), (202, 5), (202, 6)], "the same counter");
    assert_eq!(first_keys, second_keys, "the same digests");
    let missing = format!("file:{}", dir.path().join("absent").display());
    let out = Command::new(bin("quota-gate"))
        .arg("serve")
        .env_clear()
        .env("QUOTA_HASH_SECRET", &missing)
        .env("QUOTA_LISTEN", loopback(free_port()).to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let expected =
        format!("configuration error: QUOTA_HASH_SECRET: {missing}: cannot read the file");
    assert!(stderr.contains(&expected), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}

/// Moto holding the hash key (a secret) and the URL of a Valkey that asks for
/// a password (a SecureString); the Valkey and its URL with the password.
fn stores_with_secrets() -> (MotoServer, ValkeyServer, String) {
    let moto = MotoServer::start();
    let valkey = ValkeyServer::start();
    let url = format!("redis://:{VALKEY_PASSWORD}@127.0.0.1:{}", valkey.port);
    runtime().block_on(async {
        let mut c = valkey.client().await;
        let _: () = redis::cmd("CONFIG")
            .arg(&["SET", "requirepass", VALKEY_PASSWORD])
            .query_async(&mut c)
            .await
            .unwrap();
        moto.create_secret("quota/hash", HASH_SECRET).await;
        moto.put_parameter("/quota/valkey-url", &url, true).await;
    });
    (moto, valkey, url)
}

/// Three scans through a `serve` with `vars`: each answer's status and
/// `used`, and the `quota:*` keys in the Valkey at `url` after them. Fails if
/// anything the process printed holds a secret.
fn three_scans(vars: &[(&str, &str)], url: &str) -> (Vec<(u16, u64)>, BTreeSet<String>) {
    let (mut child, addr) = spawn_serve(vars);
    let answers = (0..3)
        .map(|_| {
            let (status, text) = client::send(
                addr,
                client::post_scan(SCAN_BODY).as_bytes(),
                Duration::from_secs(10),
            )
            .unwrap();
            let body: serde_json::Value =
                serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
            (status, body["quota"]["used"].as_u64().unwrap_or(0))
        })
        .collect();
    child.kill_now();
    let mut printed = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut printed)
        .unwrap();
    printed.push_str(&serve::stderr_of(&mut child));
    assert!(
        !printed.contains(HASH_SECRET),
        "the hash key in:\n{printed}"
    );
    assert!(
        !printed.contains(VALKEY_PASSWORD),
        "the password in:\n{printed}"
    );
    let keys = runtime().block_on(async {
        let mut c = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("quota:*")
            .query_async(&mut c)
            .await
            .unwrap();
        keys.into_iter().collect()
    });
    (answers, keys)
}

/// A reference that does not resolve stops `serve` and `consume` before
/// they start (exit status 2), naming the variable and the reference.
#[test]
fn a_bad_reference_stops_serve_and_consume() {
    let moto = MotoServer::start();
    let cases: [(&[&str], &str, &str); 2] = [
        (&["serve"], "QUOTA_HASH_SECRET", "secretsmanager:quota/none"),
        (
            &["consume", "--from", "-", "--exec", "true"],
            "VALKEY_URL",
            "ssm:/quota/none",
        ),
    ];
    for (args, var, reference) in cases {
        let out = Command::new(bin("quota-gate"))
            .args(args)
            .env_clear()
            .envs(aws_env(&moto))
            .env(var, reference)
            .env("QUOTA_LISTEN", loopback(free_port()).to_string())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("configuration error: {var}: {reference}: ")),
            "{stderr}"
        );
    }
}

/// A stand-in for the Lambda Runtime API: records when the first
/// `invocation/next` arrives (the end of init) and what an `init/error`
/// says; answers `next` with one sample event and records the response.
struct RuntimeApi {
    port: u16,
    calls: mpsc::Receiver<(Instant, String, String)>,
}

impl RuntimeApi {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, calls) = mpsc::channel();
        std::thread::spawn(move || {
            let answered = Arc::new(AtomicBool::new(false));
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (tx, answered) = (tx.clone(), answered.clone());
                std::thread::spawn(move || serve_runtime_api(stream, &tx, &answered));
            }
        });
        Self { port, calls }
    }

    fn next_call(&self) -> (Instant, String, String) {
        self.calls
            .recv_timeout(Duration::from_secs(30))
            .expect("a call to the Runtime API")
    }
}

/// One keep-alive connection of the runtime client: each request recorded;
/// the first `next` answered with a sample event, any later one never.
fn serve_runtime_api(
    mut stream: std::net::TcpStream,
    calls: &mpsc::Sender<(Instant, String, String)>,
    answered: &AtomicBool,
) {
    while let Some((head, body)) = read_request(&mut stream) {
        let line = head.lines().next().unwrap_or_default().to_owned();
        let next = line.contains("/invocation/next");
        if calls.send((Instant::now(), line, body)).is_err() {
            return;
        }
        if next && answered.swap(true, Ordering::SeqCst) {
            std::thread::sleep(Duration::from_secs(120));
            return;
        }
        let _ = if next {
            let event = event_text("http-api-v2-ipv4.json");
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nLambda-Runtime-Aws-Request-Id: r1\r\n\
                 Lambda-Runtime-Deadline-Ms: 0\r\n\
                 Lambda-Runtime-Invoked-Function-Arn: arn:aws:lambda:us-east-1:1:function:f\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{event}",
                event.len()
            )
        } else {
            stream.write_all(b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\n{}")
        };
    }
}

/// One HTTP/1.1 request: its head and its body (by `Content-Length`).
fn read_request(stream: &mut std::net::TcpStream) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap_or(0))
                })
                .unwrap_or(0usize);
            if body.len() >= length {
                return Some((head.to_owned(), body.to_owned()));
            }
        }
    }
}

/// `bootstrap` (`$QUOTA_GATE_BOOTSTRAP`, else the one built for the tests)
/// under `api` with `vars`, and the moment it was started.
fn spawn_bootstrap(api: &RuntimeApi, vars: &[(&str, String)]) -> (KillOnDrop, Instant) {
    let path = std::env::var_os("QUOTA_GATE_BOOTSTRAP")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| bin("bootstrap"));
    let mut command = Command::new(path);
    command
        .env_clear()
        .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{}", api.port))
        .env("AWS_LAMBDA_FUNCTION_NAME", "f")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    (KillOnDrop::new(command.spawn().unwrap()), started)
}

/// The Lambda `bootstrap` with references: it counts the sample event in
/// the password-protected Valkey under the moto-held key (the same counter
/// as with plain values), prints no secret; a bad reference is reported to
/// the Runtime API as the init error naming the variable.
#[test]
fn lambda_reads_references_at_init() {
    let (moto, valkey, plain_url) = stores_with_secrets();
    let mut by_reference = aws_env(&moto);
    by_reference.push(("QUOTA_HASH_SECRET", "secretsmanager:quota/hash".into()));
    by_reference.push(("VALKEY_URL", "ssm:/quota/valkey-url".into()));
    let plain = vec![
        ("QUOTA_HASH_SECRET", HASH_SECRET.to_owned()),
        ("VALKEY_URL", plain_url.clone()),
    ];
    for (vars, used) in [(plain, 1), (by_reference.clone(), 2)] {
        let api = RuntimeApi::start();
        let (mut child, _) = spawn_bootstrap(&api, &vars);
        let (_, first, _) = api.next_call();
        assert!(first.contains("/invocation/next"), "{first}");
        let (_, answer, body) = api.next_call();
        assert!(
            answer.contains("/invocation/r1/response"),
            "{answer}: {body}"
        );
        let response: serde_json::Value = serde_json::from_str(&body).unwrap();
        let scan: serde_json::Value =
            serde_json::from_str(response["body"].as_str().unwrap()).unwrap();
        assert_eq!(response["statusCode"], 202, "{body}");
        assert_eq!(scan["quota"]["used"], used, "{body}");
        child.kill_now();
        let mut printed = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut printed)
            .unwrap();
        printed.push_str(&serve::stderr_of(&mut child));
        assert!(
            !printed.contains(HASH_SECRET) && !printed.contains(VALKEY_PASSWORD),
            "{printed}"
        );
    }
    for (name, value) in &mut by_reference {
        if *name == "QUOTA_HASH_SECRET" {
            *value = "secretsmanager:quota/none".into();
        }
    }
    let api = RuntimeApi::start();
    let (mut child, _) = spawn_bootstrap(&api, &by_reference);
    let (_, call, body) = api.next_call();
    assert!(call.contains("/runtime/init/error"), "{call}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["errorType"], "Runtime.ConfigError");
    let message = error["errorMessage"].as_str().unwrap();
    assert!(
        message.starts_with("QUOTA_HASH_SECRET: secretsmanager:quota/none: "),
        "{message}"
    );
    assert_eq!(child.wait().unwrap().code(), Some(2));
    drop(valkey);
}

/// Init time (spawn to the first `invocation/next`), median of 7 cold
/// starts each: plain values, and the same two secrets by reference to moto
/// on loopback. Printed for docs/benchmarks.md (`-- --nocapture`; set
/// `QUOTA_GATE_BOOTSTRAP=target/release/bootstrap` to time a release build);
/// asserts only that references add less than 2 s.
#[test]
fn init_time_with_references() {
    let (moto, valkey, plain_url) = stores_with_secrets();
    let plain = vec![
        ("QUOTA_HASH_SECRET", HASH_SECRET.to_owned()),
        ("VALKEY_URL", plain_url.clone()),
    ];
    let mut by_reference = aws_env(&moto);
    by_reference.push(("QUOTA_HASH_SECRET", "secretsmanager:quota/hash".into()));
    by_reference.push(("VALKEY_URL", "ssm:/quota/valkey-url".into()));
    let median_init = |vars: &[(&str, String)]| {
        let mut times: Vec<Duration> = (0..7)
            .map(|_| {
                let api = RuntimeApi::start();
                let (_child, started) = spawn_bootstrap(&api, vars);
                let (at, call, _) = api.next_call();
                assert!(call.contains("/invocation/next"), "{call}");
                at - started
            })
            .collect();
        times.sort();
        times[3]
    };
    let plain_ms = median_init(&plain).as_secs_f64() * 1e3;
    println!("init, median of 7: plain values {plain_ms:.1} ms");
    let reference_ms = median_init(&by_reference).as_secs_f64() * 1e3;
    println!(
        "init, median of 7: by reference (Secrets Manager and SSM on moto, loopback) {reference_ms:.1} ms"
    );
    assert!(reference_ms < plain_ms + 2000.0);
    drop(valkey);
}

/// The same through the real runtime emulator (`cargo lambda watch
/// --only-lambda-apis`, `cargo lambda invoke`), as `tests/it/lambda_logs.rs`
/// runs it: `bootstrap` started with references to moto answers the sample
/// event 202 and counts it on the counter the plain values use. Needs
/// `cargo-lambda` on `PATH`.
#[test]
fn lambda_through_cargo_lambda_reads_references() {
    let (moto, valkey, plain_url) = stores_with_secrets();
    let mut emulator = common::lambda::Emulator::start();
    let mut by_reference = aws_env(&moto);
    by_reference.push(("QUOTA_HASH_SECRET", "secretsmanager:quota/hash".into()));
    by_reference.push(("VALKEY_URL", "ssm:/quota/valkey-url".into()));
    let plain = [
        ("QUOTA_HASH_SECRET", HASH_SECRET.to_owned()),
        ("VALKEY_URL", plain_url),
    ];
    for (vars, used) in [(&plain[..], 1), (&by_reference[..], 2)] {
        let mut bootstrap = KillOnDrop::new(
            Command::new(bin("bootstrap"))
                .env_clear()
                .env("AWS_LAMBDA_RUNTIME_API", emulator.runtime_api())
                .env("AWS_LAMBDA_FUNCTION_NAME", "_")
                .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
                .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
                .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let out = emulator.invoke("events/http-api-v2-ipv4.json");
        bootstrap.kill_now();
        let mut printed = String::new();
        bootstrap
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut printed)
            .unwrap();
        printed.push_str(&serve::stderr_of(&mut bootstrap));
        let answer = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}\n{printed}");
        let response: serde_json::Value = serde_json::from_str(&answer).unwrap();
        let body: serde_json::Value =
            serde_json::from_str(response["body"].as_str().unwrap()).unwrap();
        assert_eq!(response["statusCode"], 202, "{answer}");
        assert_eq!(body["quota"]["used"], used, "{answer}");
        assert!(
            !printed.contains(HASH_SECRET) && !printed.contains(VALKEY_PASSWORD),
            "{printed}"
        );
    }
    emulator.stop();
    drop(valkey);
}

/// botocore's ElastiCache IAM token (the AWS documentation's Python signer:
/// `SigV4QueryAuth` on `AWSRequest`, 900 s), its clock frozen at `at`.
fn botocore_token(request: TokenFor<'_>, credentials: &Credentials, at: u64) -> String {
    const SCRIPT: &str = r#"
import datetime, sys
from unittest import mock
import botocore.auth, botocore.awsrequest, botocore.credentials
user, cache, serverless, region, at, key, secret, session = sys.argv[1:]
params = {"Action": "connect", "User": user}
if serverless == "true":
    params["ResourceType"] = "ServerlessCache"
request = botocore.awsrequest.AWSRequest(method="GET", url=f"https://{cache}/", params=params)
credentials = botocore.credentials.Credentials(key, secret, session or None)
now = datetime.datetime.fromtimestamp(int(at), datetime.timezone.utc)
with mock.patch("botocore.auth.get_current_datetime", return_value=now):
    botocore.auth.SigV4QueryAuth(credentials, "elasticache", region, expires=900).add_auth(request)
sys.stdout.write(request.url.removeprefix("https://"))
"#;
    let out = Command::new(root().join(".tools/venv/bin/python"))
        .args(["-c", SCRIPT, request.user, request.cache])
        .arg(request.serverless.to_string())
        .args([request.region, &at.to_string()])
        .args([credentials.access_key_id(), credentials.secret_access_key()])
        .arg(credentials.session_token().unwrap_or_default())
        .output()
        .expect("the venv's python (scripts/test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The token is ElastiCache's, byte for byte botocore's: serverless and
/// not, with and without a session token (one with characters a query must
/// escape), a user id that must be escaped too. And it is a function of its
/// time: a second later, another token.
#[test]
fn iam_token_is_botocores() {
    let at = 1_796_083_200; // a fixed instant (UTC midnight), so the test is repeatable
    let session = Credentials::new(
        "ASIAEXAMPLEKEY123456",
        "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        Some("IQoJb3JpZ2luX2VjE/session+token==".to_owned()),
        None,
        "test",
    );
    let long_lived = Credentials::new("AKIAEXAMPLEKEY123456", "c2VjcmV0/key+", None, None, "test");
    for credentials in [&session, &long_lived] {
        for (user, cache, serverless, region) in [
            (
                "quota-gate-valkey-gate",
                "quota-gate-valkey",
                true,
                "us-east-1",
            ),
            ("gate user", "replication-group-1", false, "eu-west-2"),
        ] {
            let request = TokenFor {
                user,
                cache,
                serverless,
                region,
            };
            let time = UNIX_EPOCH + Duration::from_secs(at);
            let ours = token(request, credentials, time).unwrap();
            assert_eq!(
                ours,
                botocore_token(request, credentials, at),
                "{request:?}"
            );
            assert!(
                ours.starts_with(&format!("{cache}/?Action=connect&User=")),
                "{ours}"
            );
            assert_eq!(ours.contains("ResourceType=ServerlessCache"), serverless);
            assert!(ours.contains("X-Amz-Expires=900"), "{ours}");
            let later = token(request, credentials, time + Duration::from_secs(1)).unwrap();
            assert_ne!(later, ours);
        }
    }
}
