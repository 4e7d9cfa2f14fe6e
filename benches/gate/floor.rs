//! The HTTP floor: what HTTP alone costs here. A child process of the bench
//! binary runs a minimal hyper server on the same runtime settings and the
//! same connection setup as `quota-gate serve` (`src/front/cli.rs`,
//! `src/front/serve/`: one single-threaded Tokio runtime per CPU on one shared
//! listening socket, `TCP_NODELAY`, hyper's HTTP/1.1 connection watched for
//! graceful shutdown), reads the request's
//! body as `serve` does (at most 64 KiB + 1 bytes) and answers every request
//! with a fixed 202. Same load generator, same request: the difference to
//! `serve` is the gate.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ::http::{HeaderValue, Request, Response, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use quota_gate_testkit::{KillOnDrop, client, free_port, loopback};

/// A body of about the gate's size, so the write is comparable.
const BODY: &str = r#"{"scanId":"0192f3a4-0000-7000-8000-000000000000","status":"queued","delayMs":0,"sleptMs":0,"deferredMs":0,"quota":{"scope":"ip","limit":33,"used":1,"remaining":32,"resetAt":"2026-12-01T00:00:00Z"}}"#;

/// Child mode: serves the floor on `addr` until killed.
pub fn child(addr: &str) -> Result<(), String> {
    let addr: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    // The workers `quota-gate serve` runs (src/front/cli.rs): one single-threaded
    // runtime per CPU, all accepting on one listening socket.
    let listener = std::net::TcpListener::bind(addr).map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let workers = std::thread::available_parallelism().map_or(1, usize::from);
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let listener = listener.try_clone().map_err(|e| e.to_string())?;
            Ok(std::thread::spawn(move || worker(listener)))
        })
        .collect::<Result<_, String>>()?;
    for thread in threads {
        thread
            .join()
            .map_err(|_| "a floor worker panicked".to_owned())??;
    }
    Ok(())
}

/// One worker: accepts and serves until killed.
fn worker(listener: std::net::TcpListener) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let listener = TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        let connections = GracefulShutdown::new();
        loop {
            let Ok((stream, _peer)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let connection = connections.watch(
                http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(answer)),
            );
            tokio::spawn(async move {
                let _ = connection.await;
            });
        }
    })
}

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = Limited::new(request.into_body(), 64 * 1024 + 1)
        .collect()
        .await
        .map(|c| c.to_bytes().len())
        .unwrap_or(0);
    std::hint::black_box(body);
    let mut r = Response::new(Full::new(Bytes::from_static(BODY.as_bytes())));
    *r.status_mut() = StatusCode::ACCEPTED;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

/// A running floor server, killed on drop.
pub struct Floor {
    pub addr: SocketAddr,
    child: KillOnDrop,
}

impl Floor {
    pub fn spawn() -> Result<Self, String> {
        let addr = loopback(free_port());
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .env(super::CHILD_ENV, format!("floor:{addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("spawn floor: {e}"))?;
        let floor = Self {
            addr,
            child: KillOnDrop::new(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let request = client::scan_request(None);
        loop {
            match client::once(addr, request.as_bytes(), Duration::from_secs(2)) {
                Ok(202) => return Ok(floor),
                _ if Instant::now() > deadline => {
                    return Err("the HTTP floor did not answer within 10 s".into());
                }
                _ => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}
