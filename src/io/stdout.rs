//! The process's bounded, non-blocking line writer for standard output (and
//! `serve`'s stderr), shared by the stdout spool, the EMF metrics and the
//! `quota-gate` command's logs, so their lines never interleave and no
//! request ever waits on a pipe.
//!
//! A pipe that nobody reads fills up after 64 KiB, and a `write` to it then
//! blocks. So no request writes to stdout itself: lines go through a
//! [`LineWriter`], a bounded channel ([`LINE_QUEUE`] lines) drained by one
//! writer thread that batches whatever is waiting into one `write` and one
//! flush (after a batch of plain lines only it lingers `LINGER`, so a busy
//! server's lines share writes instead of waking the thread one by one).
//! When the channel is full:
//! - a plain line ([`LineWriter::try_line`], an EMF or log line) is given
//!   back, and the caller drops and counts it;
//! - an acknowledged line ([`LineWriter::write_acknowledged`], a spooled job)
//!   fails at once with [`WriteError::Full`].
//!
//! An acknowledged line is acknowledged only once the writer thread has
//! written and flushed it. One whose wait is given up (dropped) before the
//! writer took it is withdrawn, never written.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};

use tokio::sync::oneshot;

/// Lines that may wait for the writer thread before new ones are refused.
pub const LINE_QUEUE: usize = 4096;
/// Most bytes gathered into one `write`.
const BATCH_BYTES: usize = 256 * 1024;
/// How long the writer waits after a batch of EMF lines only, so the next
/// ones gather into one write: a writer thread blocked on the channel is
/// woken (a futex syscall and a context switch) by every line, which cost
/// `serve` several µs per request under load. Jobs are never held back by
/// it: a job unparks the writer.
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

const PENDING: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// Tells a waiting enqueue whether its line was written and flushed.
type Ack = oneshot::Sender<Result<(), String>>;

/// One line for the writer thread.
struct Entry {
    line: Vec<u8>,
    /// For a job: the acknowledgement, sent once the line is written and
    /// flushed (or failed), and the withdrawal flag.
    ack: Option<(Ack, Arc<AtomicU8>)>,
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
        let thread = match spawned {
            Ok(handle) => Some(handle.thread().clone()),
            Err(e) => {
                // Without a thread every line is refused (the channel
                // disconnects): jobs fail with 503, EMF lines are counted as dropped.
                tracing::error!(error = %e, "cannot start the {name} writer thread");
                None
            }
        };
        Self { tx, thread }
    }

    /// The process's one writer for standard output, shared by the spool and
    /// the EMF lines so their lines never interleave.
    pub fn stdout() -> Self {
        static STDOUT: OnceLock<LineWriter> = OnceLock::new();
        STDOUT
            .get_or_init(|| Self::spawn("stdout", Box::new(std::io::stdout()), LINE_QUEUE))
            .clone()
    }

    /// Hands `line` (newline included) to the writer, or gives it back when
    /// the channel is full or the writer is gone. Never blocks.
    pub fn try_line(&self, line: Vec<u8>) -> Result<(), Vec<u8>> {
        self.tx
            .try_send(Entry { line, ack: None })
            .map_err(|e| match e {
                TrySendError::Full(e) | TrySendError::Disconnected(e) => e.line,
            })
    }

    /// Hands `line` (a job's) to the writer and waits until it is written
    /// and flushed. Fails at once when the channel is full. Dropping the
    /// future before the writer took the line withdraws it.
    pub async fn write_acknowledged(&self, line: Vec<u8>) -> Result<(), WriteError> {
        let (ack_tx, ack_rx) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(PENDING));
        self.tx
            .try_send(Entry {
                line,
                ack: Some((ack_tx, state.clone())),
            })
            .map_err(|e| match e {
                TrySendError::Full(_) => WriteError::Full,
                TrySendError::Disconnected(_) => WriteError::Stopped,
            })?;
        if let Some(thread) = &self.thread {
            thread.unpark();
        }
        let withdraw = Withdraw(state);
        let written = ack_rx.await;
        std::mem::forget(withdraw);
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(WriteError::Failed(e)),
            Err(_) => Err(WriteError::Stopped),
        }
    }
}

impl LineWriter {
    /// Waits (at most `within`) until every line handed over so far is
    /// written and flushed: for a clean exit. False if the writer is stuck.
    pub async fn drain(&self, within: std::time::Duration) -> bool {
        tokio::time::timeout(within, self.write_acknowledged(Vec::new()))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

/// Withdraws a job not yet taken by the writer when its enqueue is dropped.
struct Withdraw(Arc<AtomicU8>);

impl Drop for Withdraw {
    fn drop(&mut self) {
        let _ = self
            .0
            .compare_exchange(PENDING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// The writer thread: waits for a line, gathers what else is waiting, writes
/// the batch at once, flushes, then acknowledges the batch's jobs.
fn drain(rx: Receiver<Entry>, mut out: Box<dyn Write + Send>) {
    let mut batch = Vec::with_capacity(64 * 1024);
    let mut acks = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        loop {
            if let Some(entry) = next.take() {
                take(entry, &mut batch, &mut acks);
            }
            if batch.len() >= BATCH_BYTES {
                break;
            }
            match rx.try_recv() {
                Ok(entry) => next = Some(entry),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
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
fn take(entry: Entry, batch: &mut Vec<u8>, acks: &mut Vec<oneshot::Sender<Result<(), String>>>) {
    match entry.ack {
        None => batch.extend_from_slice(&entry.line),
        Some((ack, state)) => {
            if state
                .compare_exchange(PENDING, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                batch.extend_from_slice(&entry.line);
                acks.push(ack);
            }
        }
    }
}
