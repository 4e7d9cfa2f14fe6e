//! The local spool: one JSON line per job on standard output, through the shared [`LineWriter`];
//! `notBefore` carries the deferral, as a pipe cannot hold a line back. A job is answered 202 only
//! once its line is written and flushed; a full writer fails the enqueue at once, and a job given
//! up before the writer took it is withdrawn, so a 503's "not queued" stays true.

use std::io::Write;

use crate::io::stdout::{LINE_QUEUE, LineWriter, WriteError};

use super::job_queue::{ScanQueue, SendError};
use crate::rules::job::ScanJob;

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
        Self {
            out: LineWriter::spawn("spool", out, LINE_QUEUE),
        }
    }
}

impl ScanQueue for Spool {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), SendError> {
        let mut line = serde_json::to_vec(job).map_err(|e| SendError::NotSent(e.to_string()))?;
        line.push(b'\n');
        // A line refused by the writer was never written.
        self.out.write_acknowledged(line).await.map_err(|e| {
            SendError::NotSent(match e {
                WriteError::Full => {
                    "spool full: standard output is not being read fast enough".into()
                }
                WriteError::Stopped => "spool writer has stopped".into(),
                WriteError::Failed(e) => format!("spool write failed: {e}"),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{Sender, channel};
    use std::sync::{Arc, Mutex};
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
            version: crate::rules::job::JOB_VERSION,
            scan_id: uuid::Uuid::now_v7(),
            received_at: "2026-11-30T12:00:00Z".into(),
            scope: crate::rules::scope::Scope::Ip,
            digest: "d".into(),
            tier: crate::rules::job::JobTier::Within,
            limit: 33,
            count: 1,
            delay_ms: 0,
            deferred_ms: 0,
            not_before: "2026-11-30T12:00:00Z".into(),
            not_before_ms: 1_796_040_000_000,
            request: serde_json::from_str("{}").unwrap(),
            trace: None,
            lane: None,
            tenant: None,
        }
    }

    /// With the writer stuck and its queue full, an enqueue fails at once, an
    /// EMF line is given back, and a job given up before the writer took it
    /// is never written.
    #[tokio::test]
    async fn full_queue_fails_fast_and_withdrawn_jobs_stay_unwritten() {
        let (sink, open) = Stuck::new();
        let spool = Spool {
            out: LineWriter::spawn("spool", Box::new(sink.clone()), 2),
        };
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
