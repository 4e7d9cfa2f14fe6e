//! `quota-gate serve` as a child process, killed on drop, and a [`Flood`]
//! of clients that never read.

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::{KillOnDrop, bin, free_port, loopback, wait_for_port};

/// `quota-gate serve` with nothing configured but `vars`, on a free port,
/// listening; stdout and stderr are piped for the test to read (a test that
/// never reads them has a stuck reader).
pub fn spawn_serve(vars: &[(&str, &str)]) -> (KillOnDrop, SocketAddr) {
    spawn(Command::new(bin("quota-gate")).arg("serve"), vars)
}

/// The same under `ulimit -n open_files`.
pub fn spawn_serve_with_open_files(
    open_files: u32,
    vars: &[(&str, &str)],
) -> (KillOnDrop, SocketAddr) {
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(format!("ulimit -n {open_files} && exec \"$0\" serve"))
        .arg(bin("quota-gate"));
    spawn(&mut command, vars)
}

fn spawn(command: &mut Command, vars: &[(&str, &str)]) -> (KillOnDrop, SocketAddr) {
    let addr = loopback(free_port());
    let child = command
        .env_clear()
        .env("QUOTA_LISTEN", addr.to_string())
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let child = KillOnDrop::new(child);
    assert!(
        wait_for_port(addr, Duration::from_secs(10)),
        "serve did not listen"
    );
    (child, addr)
}

/// Everything `child` wrote to its (piped) stderr, once it has closed it.
pub fn stderr_of(child: &mut Child) -> String {
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

/// Clients that pipeline requests and never read the answers, each socket
/// with a 4 KiB receive buffer, so the server's answers soon have nowhere to
/// go; a connection the server lets go is opened again at once, so the
/// flood holds its size until stopped.
pub struct Flood {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    closed: Arc<AtomicUsize>,
}

/// The receive buffer of a flood socket.
const FLOOD_RECV_BUFFER: u32 = 4096;

impl Flood {
    /// `connections` sockets to `addr`, each sending `request` `pipelined`
    /// times at once, then one more every 500 ms (never reading), which is
    /// how it learns that the server has closed it.
    pub fn start(addr: SocketAddr, connections: usize, pipelined: usize, request: &str) -> Self {
        let burst = Arc::new(request.repeat(pipelined).into_bytes());
        let one = Arc::new(request.as_bytes().to_vec());
        let closed = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let counter = closed.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                for _ in 0..connections {
                    tokio::spawn(hold(addr, burst.clone(), one.clone(), counter.clone()));
                }
                let _ = stopped.await;
            });
            // Dropping the runtime drops every socket.
        });
        Self {
            stop: Some(stop),
            thread: Some(thread),
            closed,
        }
    }

    /// How many of the flood's connections the server has closed so far.
    pub fn closed(&self) -> usize {
        self.closed.load(Ordering::Relaxed)
    }

    /// Closes every flood socket; how many the server had closed.
    pub fn stop(mut self) -> usize {
        self.halt();
        self.closed()
    }

    fn halt(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One flood connection, reopened whenever the server closes it.
async fn hold(addr: SocketAddr, burst: Arc<Vec<u8>>, one: Arc<Vec<u8>>, closed: Arc<AtomicUsize>) {
    loop {
        let Ok(mut stream) = flood_socket(addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if stream.write_all(&burst).await.is_ok() {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if stream.write_all(&one).await.is_err() {
                    break;
                }
            }
        }
        closed.fetch_add(1, Ordering::Relaxed);
    }
}

async fn flood_socket(addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_recv_buffer_size(FLOOD_RECV_BUFFER)?;
    socket.connect(addr).await
}
