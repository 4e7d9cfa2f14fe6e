//! A small TCP proxy on loopback that can be switched between upstreams:
//! what the gate sees of ElastiCache's primary endpoint, which moves to the
//! promoted replica in a failover. A switch also cuts every connection to
//! the old upstream, as the old primary's death does. Between a replica and
//! its primary it makes a lagging replica: [`Proxy::cut`] partitions them.

use std::net::SocketAddr;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The proxy; it stops (and drops every connection) when dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    upstream: watch::Sender<Option<SocketAddr>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("an address");
        let (tx, rx) = watch::channel(Some(upstream));
        let accept = tokio::spawn(accept_loop(listener, rx));
        Self {
            addr,
            upstream: tx,
            accept,
        }
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
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: watch::Receiver<Option<SocketAddr>>) {
    let mut links = tokio::task::JoinSet::new();
    while let Ok((client, _)) = listener.accept().await {
        let mut changed = upstream.clone();
        let target = *changed.borrow_and_update();
        links.spawn(async move {
            let Some(target) = target else {
                return;
            };
            let Ok(mut server) = TcpStream::connect(target).await else {
                return;
            };
            let mut client = client;
            tokio::select! {
                _ = copy_bidirectional(&mut client, &mut server) => {}
                _ = changed.changed() => {}
            }
        });
        // Reap the links that ended.
        while links.try_join_next().is_some() {}
    }
}
