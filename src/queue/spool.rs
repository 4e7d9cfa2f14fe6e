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
//! flush (after a batch of EMF lines only it lingers [`LINGER`], so a busy
//! server's lines share writes instead of waking the thread one by one).
//! When the channel is full:
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
        if let Some(thread) = &self.thread {
            thread.unpark();
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::mpsc::{Sender, channel};
    use std::time::Duration;

    use super::*;

    /// A sink whose writes block until the test lets them through, like a
    /// pipe nobody reads; what got through is kept.
    #[derive(Clone)]
    struct Stuck {
        gate: Arc<Mutex<std::sync::mpsc::Receiver<()>>>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Stuck {
        fn new() -> (Self, Sender<()>) {
            let (open, gate) = channel();
            let sink = Self {
                gate: Arc::new(Mutex::new(gate)),
                written: Arc::default(),
            };
            (sink, open)
        }

        fn lines(&self) -> usize {
            self.written
                .lock()
                .unwrap()
                .iter()
                .filter(|b| **b == b'\n')
                .count()
        }
    }

    impl Write for Stuck {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.gate.lock().unwrap().recv();
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn job() -> ScanJob {
        ScanJob {
            version: crate::job::JOB_VERSION,
            scan_id: uuid::Uuid::now_v7(),
            received_at: "2026-11-30T12:00:00Z".into(),
            scope: "ip",
            digest: "d".into(),
            tier: "within",
            limit: 33,
            count: 1,
            delay_ms: 0,
            deferred_ms: 0,
            not_before: "2026-11-30T12:00:00Z".into(),
            not_before_ms: 1_796_040_000_000,
            request: serde_json::Map::new(),
        }
    }

    /// With the writer stuck and its queue full, an enqueue fails at once, an
    /// EMF line is given back, and a job given up before the writer took it
    /// is never written.
    #[tokio::test]
    async fn full_queue_fails_fast_and_withdrawn_jobs_stay_unwritten() {
        let (sink, open) = Stuck::new();
        let spool = Spool::with_capacity(Box::new(sink.clone()), 2);
        // The first job is taken by the writer, which blocks writing it.
        let first = tokio::spawn({
            let spool = spool.clone();
            async move { spool.enqueue(&job()).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Two more fill the queue; they time out (the gate's enqueue timeout).
        for _ in 0..2 {
            let job = job();
            let waited = tokio::time::timeout(Duration::from_millis(50), spool.enqueue(&job));
            assert!(waited.await.is_err());
        }
        // Full: refused at once, whether job or EMF line.
        let started = std::time::Instant::now();
        assert!(spool.enqueue(&job()).await.is_err());
        assert!(spool.out.try_line(b"emf\n".to_vec()).is_err());
        assert!(started.elapsed() < Duration::from_millis(50));
        // The reader comes back: the first job is written and acknowledged,
        // the two given up are not written.
        for _ in 0..10 {
            let _ = open.send(());
        }
        assert!(first.await.unwrap().is_ok());
        // Once the writer has skipped the withdrawn ones, there is room again.
        let mut last = spool.enqueue(&job()).await;
        for _ in 0..100 {
            if last.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            last = spool.enqueue(&job()).await;
        }
        last.unwrap();
        assert_eq!(
            sink.lines(),
            2,
            "the first job and the last, nothing withdrawn"
        );
    }
}
