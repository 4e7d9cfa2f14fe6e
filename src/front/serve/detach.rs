//! A scan that outlives its client: the gate's handling of a request runs
//! in a task of its own, which the connection only awaits. When the client
//! goes away, hyper drops the wait, not the task, so a scan once counted
//! runs to its end (job queued, keyed answer saved). The simulator
//! (`tests/it/sim.rs`) drops the same wait at random moments.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::task::{JoinError, JoinHandle};
use tokio_util::task::TaskTracker;

/// The wait on a detached scan; dropping it leaves the scan running.
pub struct Detached<T> {
    task: JoinHandle<T>,
}

/// Runs `scan` in a task of `scans` (shutdown waits for them) and returns
/// the wait on its answer. `Err` only if the task panicked or the runtime
/// is shutting down: whether its job landed is then not known.
pub fn detach<T, F>(scans: &TaskTracker, scan: F) -> Detached<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    Detached {
        task: scans.spawn(scan),
    }
}

impl<T> Future for Detached<T> {
    type Output = Result<T, JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.task).poll(cx)
    }
}

impl<T> Drop for Detached<T> {
    fn drop(&mut self) {
        if crate::bug!(DisconnectDropsScan) {
            self.task.abort();
        }
    }
}
