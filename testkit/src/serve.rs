//! `quota-gate serve` as a child process, killed on drop, a [`Flood`] of
//! clients that never read, and a [`Dribble`] of clients that never finish
//! their headers.

use std::future::Future;
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{KillOnDrop, bin, free_port, loopback, wait_for_listener};

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
    // A port is free when handed out, and may be taken before serve binds it (a listener a test
    // binds to port 0): serve then exits, and starts again on another.
    for _ in 0..5 {
        let addr = loopback(free_port());
        let child = command
            .env_clear()
            .env("QUOTA_LISTEN", addr.to_string())
            .envs(vars.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop::new(child);
        if wait_for_listener(&mut child, addr, Duration::from_secs(10)) {
            return (child, addr);
        }
    }
    panic!("serve did not listen");
}

/// Everything `child` (a `serve`) wrote to its stderr, once a `SIGTERM` has
/// ended it: a clean stop flushes its log writer, where a `SIGKILL` may lose
/// the last lines. One that has not stopped within 20 s (past its drain
/// bound) is killed, so a hung stop fails the test instead of holding it.
pub fn stderr_after_term(child: &mut Child) -> String {
    let mut pipe = child.stderr.take().expect("stderr piped");
    let reader = std::thread::spawn(move || {
        let mut stderr = String::new();
        let _ = pipe.read_to_string(&mut stderr);
        stderr
    });
    crate::consumer::signal(child.id(), "TERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().ok().flatten().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve did not stop within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    reader.join().expect("the stderr reader")
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
pub struct Flood(Swarm);

/// The receive buffer of a flood socket.
const FLOOD_RECV_BUFFER: u32 = 4096;

impl Flood {
    /// `connections` sockets to `addr`, each sending `request` `pipelined`
    /// times at once, then one more every 500 ms (never reading), which is
    /// how it learns that the server has closed it.
    pub fn start(addr: SocketAddr, connections: usize, pipelined: usize, request: &str) -> Self {
        let burst = Arc::new(request.repeat(pipelined).into_bytes());
        let one = Arc::new(request.as_bytes().to_vec());
        Self(Swarm::start(connections, move |closed| {
            hold(addr, burst.clone(), one.clone(), closed)
        }))
    }

    /// How many of the flood's connections the server has closed so far.
    pub fn closed(&self) -> usize {
        self.0.closed()
    }

    /// Closes every flood socket; how many the server had closed.
    pub fn stop(self) -> usize {
        self.0.stop()
    }
}

/// Slowloris: clients that send a request line and then one byte of a
/// header every second, never finishing the headers; a connection the
/// server closes is opened again `reopen_after` later, so the dribble holds
/// its size until stopped.
pub struct Dribble(Swarm);

impl Dribble {
    /// `connections` dribbling sockets to `addr`.
    pub fn start(addr: SocketAddr, connections: usize, reopen_after: Duration) -> Self {
        Self(Swarm::start(connections, move |closed| {
            dribble(addr, reopen_after, closed)
        }))
    }

    /// How many of the dribbling connections the server has closed so far.
    pub fn closed(&self) -> usize {
        self.0.closed()
    }

    /// Closes every dribbling socket; how many the server had closed.
    pub fn stop(self) -> usize {
        self.0.stop()
    }
}

/// Client connections, each a task on a runtime of its own thread that
/// counts the times the server closed it, until stopped.
struct Swarm {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    closed: Arc<AtomicUsize>,
}

impl Swarm {
    /// `connections` tasks made by `client`, given the closed counter.
    fn start<F, C>(connections: usize, client: C) -> Self
    where
        F: Future<Output = ()> + 'static,
        C: Fn(Arc<AtomicUsize>) -> F + Send + 'static,
    {
        let closed = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let counter = closed.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async move {
                for _ in 0..connections {
                    tokio::task::spawn_local(client(counter.clone()));
                }
                let _ = stopped.await;
            });
            // Dropping the tasks and the runtime drops every socket.
        });
        Self {
            stop: Some(stop),
            thread: Some(thread),
            closed,
        }
    }

    fn closed(&self) -> usize {
        self.closed.load(Ordering::Relaxed)
    }

    fn stop(mut self) -> usize {
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

impl Drop for Swarm {
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

/// One dribbling connection: a request line, then a header name one byte a
/// second; it learns that the server closed it from a read (end of stream
/// or an error) between bytes, and opens another `reopen_after` later.
async fn dribble(addr: SocketAddr, reopen_after: Duration, closed: Arc<AtomicUsize>) {
    loop {
        if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
            let mut sent = stream
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
                .await;
            let mut answer = [0u8; 512];
            while sent.is_ok() {
                let read = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut answer));
                match read.await {
                    Err(_elapsed) => sent = stream.write_all(b"x").await,
                    Ok(_closed_or_answered) => break,
                }
            }
            closed.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(reopen_after).await;
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
