//! A scan that outlives its client: when the client goes away hyper drops the wait, not the task,
//! so a counted scan runs to its end (job queued, keyed answer saved).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::task::{JoinError, JoinHandle};
use tokio_util::task::TaskTracker;

/// The wait on a detached scan; dropping it leaves the scan running.
pub struct Detached<T> {
    task: JoinHandle<T>,
}

/// Runs `scan` in a task of `scans` and returns the wait on its answer. `Err` only on a panic or
/// runtime shutdown, when whether its job landed is not known.
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
