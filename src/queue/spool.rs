//! The local spool: one JSON line per job on standard output, and the
//! bounded, non-blocking line writer it shares with the EMF metrics.
//!
//! For local runs and piping into another tool; `notBefore` on each line
//! carries the deferral, since a pipe cannot hold a line back.
//!
//! # Never blocking a request on a pipe
//!
//! A pipe that nobody reads fills up after 64 KiB, and a `write` to it then
//! blocks. So no request writes to stdout itself: lines go through a
//! [`LineWriter`], a bounded channel ([`LINE_QUEUE`] lines) drained by one
//! writer thread that batches whatever is waiting into one `write` and one
//! flush. When the channel is full:
//! - an EMF line ([`LineWriter::try_line`]) is dropped, and the caller counts it;
//! - a spooled job cannot be dropped: [`Spool::enqueue`] fails at once with a
//!   [`QueueError`], and the gate refunds the count and answers 503.
//!
//! A job is answered 202 only once the writer thread has written and flushed
//! its line (an acknowledgement per job). A job whose enqueue is given up
//! (the gate's enqueue timeout) before the writer took it is withdrawn, so a
//! 503 that says "not queued" stays true when the reader wakes up.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};

use tokio::sync::oneshot;

use super::{QueueError, ScanJob, ScanQueue};

/// Lines that may wait for the writer thread before new ones are refused.
pub const LINE_QUEUE: usize = 4096;
/// Most bytes gathered into one `write`.
const BATCH_BYTES: usize = 256 * 1024;

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

/// A bounded, non-blocking path to one output stream, drained by a thread.
#[derive(Clone)]
pub struct LineWriter {
    tx: SyncSender<Entry>,
}

impl LineWriter {
    /// A writer thread over `out`, with room for `capacity` waiting lines.
    pub fn spawn(name: &str, out: Box<dyn Write + Send>, capacity: usize) -> Self {
        let (tx, rx) = sync_channel(capacity);
        let spawned = std::thread::Builder::new()
            .name(format!("{name}-writer"))
            .spawn(move || drain(rx, out));
        if let Err(e) = spawned {
            // Without a thread every line is refused (the channel disconnects):
            // jobs fail with 503, EMF lines are counted as dropped.
            tracing::error!(error = %e, "cannot start the {name} writer thread");
        }
        Self { tx }
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

    /// Hands a job's line to the writer and waits until it is written and
    /// flushed. Fails at once when the channel is full. Dropping the future
    /// before the writer took the line withdraws it.
    async fn write_acknowledged(&self, line: Vec<u8>) -> Result<(), QueueError> {
        let (ack_tx, ack_rx) = oneshot::channel();
        let state = Arc::new(AtomicU8::new(PENDING));
        self.tx
            .try_send(Entry {
                line,
                ack: Some((ack_tx, state.clone())),
            })
            .map_err(|e| match e {
                TrySendError::Full(_) => QueueError::Backend(
                    "spool full: standard output is not being read fast enough".into(),
                ),
                TrySendError::Disconnected(_) => {
                    QueueError::Backend("spool writer has stopped".into())
                }
            })?;
        let withdraw = Withdraw(state);
        let written = ack_rx.await;
        std::mem::forget(withdraw);
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(QueueError::Backend(format!("spool write failed: {e}"))),
            Err(_) => Err(QueueError::Backend("spool writer has stopped".into())),
        }
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
        for ack in acks.drain(..) {
            let _ = ack.send(result.clone());
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

/// Writes jobs as JSON lines.
#[derive(Clone)]
pub struct Spool {
    out: LineWriter,
}

impl Default for Spool {
    /// Standard output, through the process's shared [`LineWriter::stdout`].
    fn default() -> Self {
        Self {
            out: LineWriter::stdout(),
        }
    }
}

impl Spool {
    /// Jobs to `out`, through a writer thread of their own.
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self::with_capacity(out, LINE_QUEUE)
    }

    /// The same, with room for `capacity` lines waiting to be written.
    pub fn with_capacity(out: Box<dyn Write + Send>, capacity: usize) -> Self {
        Self {
            out: LineWriter::spawn("spool", out, capacity),
        }
    }

    /// Jobs through an existing writer.
    pub fn from_writer(out: LineWriter) -> Self {
        Self { out }
    }
}

impl ScanQueue for Spool {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), QueueError> {
        let mut line = serde_json::to_vec(job).map_err(|e| QueueError::Backend(e.to_string()))?;
        line.push(b'\n');
        self.out.write_acknowledged(line).await
    }
}
