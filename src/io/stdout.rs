//! The process's bounded, non-blocking line writer for stdout (and `serve`'s stderr), shared by the
//! spool, the EMF metrics and the logs, so their lines never interleave and no request waits on a
//! pipe. One thread drains a bounded channel; when it is full a plain line is given back to drop
//! and count, and an acknowledged one fails at once. An acknowledged line is acknowledged only once
//! written and flushed; one whose wait is dropped before the writer took it is never written.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};

use tokio::sync::oneshot;

/// Lines that may wait for the writer thread before new ones are refused.
pub const LINE_QUEUE: usize = 4096;
/// Most bytes gathered into one `write`.
const BATCH_BYTES: usize = 256 * 1024;
/// How long the writer waits after a batch of plain lines only, so the next ones share a write
/// instead of waking the thread one by one. A job unparks the writer: jobs never wait on it.
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// Tells a waiting enqueue whether its line was written and flushed.
type Ack = oneshot::Sender<Result<(), String>>;

/// One line for the writer thread.
struct Entry {
    line: Vec<u8>,
    /// A job's acknowledgement (sent once written and flushed, or failed), and whether the writer
    /// took it or its enqueue withdrew it (whichever sets it first).
    ack: Option<(Ack, Arc<AtomicBool>)>,
}

/// Why an acknowledged line was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The channel is full: the output is not being read fast enough.
    #[error("full: the output is not being read fast enough")]
    Full,
    /// The writer thread has stopped (or never started).
    #[error("the writer has stopped")]
    Stopped,
    /// The write or the flush failed.
    #[error("write failed: {0}")]
    Failed(String),
}

/// A bounded, non-blocking path to one output stream, drained by a thread.
#[derive(Clone)]
pub struct LineWriter {
    tx: SyncSender<Entry>,
    /// The writer thread, unparked by a job so it never lingers on one.
    thread: Option<std::thread::Thread>,
}

impl LineWriter {
    /// A writer thread over `out`, with room for `capacity` waiting lines.
    pub fn spawn(name: &str, out: Box<dyn Write + Send>, capacity: usize) -> Self {
        let (tx, rx) = sync_channel(capacity);
        let spawned = std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || drain(rx, out));
        // No thread: every line is refused (jobs get 503, EMF lines count as dropped).
        let thread = spawned
            .inspect_err(|e| tracing::error!(error = %e, "cannot start the {name} writer thread"))
            .ok()
            .map(|handle| handle.thread().clone());
        Self { tx, thread }
    }

    /// The process's one writer for standard output.
    pub fn stdout() -> Self {
        static STDOUT: OnceLock<LineWriter> = OnceLock::new();
        STDOUT
            .get_or_init(|| Self::spawn("stdout", Box::new(std::io::stdout()), LINE_QUEUE))
            .clone()
    }

    /// Hands `line` (newline included) to the writer, or gives it back if it cannot; never blocks.
    pub fn try_line(&self, line: Vec<u8>) -> Result<(), Vec<u8>> {
        self.tx
            .try_send(Entry { line, ack: None })
            .map_err(|e| match e {
                TrySendError::Full(e) | TrySendError::Disconnected(e) => e.line,
            })
    }

    /// Hands a job's `line` to the writer and waits until it is flushed; fails at once if full.
    pub async fn write_acknowledged(&self, line: Vec<u8>) -> Result<(), WriteError> {
        let (ack_tx, ack_rx) = oneshot::channel();
        let settled = Arc::new(AtomicBool::new(false));
        self.tx
            .try_send(Entry {
                line,
                ack: Some((ack_tx, settled.clone())),
            })
            .map_err(|e| match e {
                TrySendError::Full(_) => WriteError::Full,
                TrySendError::Disconnected(_) => WriteError::Stopped,
            })?;
        if let Some(thread) = &self.thread {
            thread.unpark();
        }
        // Dropped after the writer took the line, it finds the flag set already.
        let _withdraw = Withdraw(settled);
        ack_rx
            .await
            .map_err(|_| WriteError::Stopped)?
            .map_err(WriteError::Failed)
    }

    /// Waits at most `within` until every line handed over so far is flushed; false if stuck.
    pub async fn drain(&self, within: std::time::Duration) -> bool {
        tokio::time::timeout(within, self.write_acknowledged(Vec::new()))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Withdraws a job not yet taken by the writer when its enqueue is dropped.
struct Withdraw(Arc<AtomicBool>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The writer thread: gathers what waits into one write and flush, then acknowledges the jobs.
fn drain(rx: Receiver<Entry>, mut out: Box<dyn Write + Send>) {
    let mut batch = Vec::with_capacity(64 * 1024);
    let mut acks = Vec::new();
    while let Ok(first) = rx.recv() {
        take(first, &mut batch, &mut acks);
        while batch.len() < BATCH_BYTES
            && let Ok(entry) = rx.try_recv()
        {
            take(entry, &mut batch, &mut acks);
        }
        let result = if batch.is_empty() {
            Ok(())
        } else {
            out.write_all(&batch)
                .and_then(|()| out.flush())
                .map_err(|e| e.to_string())
        };
        batch.clear();
        let only_lines = acks.is_empty();
        for ack in acks.drain(..) {
            let _ = ack.send(result.clone());
        }
        if only_lines {
            std::thread::park_timeout(LINGER);
        }
    }
}

/// Adds `entry` to the batch, unless it is a job already withdrawn.
fn take(entry: Entry, batch: &mut Vec<u8>, acks: &mut Vec<Ack>) {
    if let Some((ack, settled)) = entry.ack {
        if settled.swap(true, Ordering::AcqRel) {
            return;
        }
        acks.push(ack);
    }
    batch.extend_from_slice(&entry.line);
}
