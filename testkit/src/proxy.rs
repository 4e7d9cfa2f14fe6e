//! A small TCP proxy on loopback that can be switched between upstreams:
//! what the gate sees of ElastiCache's primary endpoint, which moves to the
//! promoted replica in a failover. A switch also cuts every connection to
//! the old upstream, as the old primary's death does. Between a replica and
//! its primary it makes a lagging replica: [`Proxy::cut`] partitions them,
//! [`Proxy::freeze`] holds every byte back on connections that stay open
//! (the primary still counts the replica as connected, and a write it sent
//! before the freeze may or may not have reached it). [`Proxy::slow`] holds
//! each answer back for a while: a store that answers within its timeout,
//! but late.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The proxy; it stops (and drops every connection) when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    upstream: watch::Sender<Option<SocketAddr>>,
    accept: JoinHandle<()>,
    /// Reads from clients: on loopback, with a client that waits for each
    /// answer, one a round trip.
    bursts: Arc<AtomicU64>,
    /// While true, no byte is forwarded either way.
    frozen: watch::Sender<bool>,
    /// How long each answer is held back.
    latency: watch::Sender<Duration>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("an address");
        let (tx, rx) = watch::channel(Some(upstream));
        let bursts = Arc::new(AtomicU64::new(0));
        let (frozen, frozen_rx) = watch::channel(false);
        let (latency, latency_rx) = watch::channel(Duration::ZERO);
        let link = Link {
            bursts: bursts.clone(),
            frozen: frozen_rx,
            latency: latency_rx,
        };
        let accept = tokio::spawn(accept_loop(listener, rx, link));
        Self {
            addr,
            upstream: tx,
            accept,
            bursts,
            frozen,
            latency,
        }
    }

    /// Holds every answer back `latency` from when the server sent it (each
    /// on its own: answers to concurrent commands are not queued behind
    /// each other's wait).
    pub fn slow(&self, latency: Duration) {
        self.latency.send_replace(latency);
    }

    /// How many reads the proxy made from its clients so far (a sequential
    /// client's round trips, on loopback).
    pub fn bursts(&self) -> u64 {
        self.bursts.load(Ordering::Relaxed)
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// New connections go to `upstream`; the open ones are cut.
    pub fn switch(&self, upstream: SocketAddr) {
        self.upstream.send_replace(Some(upstream));
    }

    /// Cuts every connection and refuses new ones: a partition.
    pub fn cut(&self) {
        self.upstream.send_replace(None);
    }

    /// Forwards nothing more, either way, until [`Proxy::cut`] or
    /// [`Proxy::switch`]: the connections stay open, so the far end still
    /// counts its peer as connected (a replica that lags, not one gone).
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// What every link of the proxy shares.
#[derive(Clone)]
struct Link {
    bursts: Arc<AtomicU64>,
    frozen: watch::Receiver<bool>,
    latency: watch::Receiver<Duration>,
}

async fn accept_loop(
    listener: TcpListener,
    upstream: watch::Receiver<Option<SocketAddr>>,
    link: Link,
) {
    let mut links = tokio::task::JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        let mut changed = upstream.clone();
        let target = *changed.borrow_and_update();
        let Link {
            bursts,
            frozen,
            latency,
        } = link.clone();
        let (mut thaw_up, mut thaw_down) = (frozen.clone(), frozen);
        links.spawn(async move {
            let Some(target) = target else {
                return;
            };
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            let up = async {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = from_client.read(&mut buf).await {
                    bursts.fetch_add(1, Ordering::Relaxed);
                    if thaw_up.wait_for(|f| !*f).await.is_err()
                        || to_server.write_all(&buf[..n]).await.is_err()
                    {
                        break;
                    }
                }
            };
            // Answers are read at once and written when their hold ends.
            let (held, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
            let read_down = async {
                // Dropped at the server's end, so `down` ends once it wrote all.
                let held = held;
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = from_server.read(&mut buf).await {
                    let at = Instant::now() + *latency.borrow();
                    if held.send((at, buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
                drop(held);
                std::future::pending::<()>().await;
            };
            let down = async {
                while let Some((at, bytes)) = due.recv().await {
                    tokio::time::sleep_until(at).await;
                    if thaw_down.wait_for(|f| !*f).await.is_err()
                        || to_client.write_all(&bytes).await.is_err()
                    {
                        break;
                    }
                }
            };
            tokio::select! {
                _ = up => {}
                _ = read_down => {}
                _ = down => {}
                _ = changed.changed() => {}
            }
        });
        // Reap the links that ended.
        while links.try_join_next().is_some() {}
    }
}
