//! Stand-ins for the gate's outputs: queues that record, discard or refuse
//! jobs, and a sink that keeps what is written to it.

use std::io::Write;
use std::sync::{Arc, Mutex};

use quota_gate::meter::Meter;
use quota_gate::queue::{QueueError, ScanJob, ScanQueue};

/// A queue in memory: exactly the jobs the gate enqueued, nothing in the way.
#[derive(Clone, Default)]
pub struct RecordingQueue(Arc<Mutex<Vec<ScanJob>>>);

impl ScanQueue for RecordingQueue {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), QueueError> {
        self.0.lock().unwrap().push(job.clone());
        Ok(())
    }
}

impl RecordingQueue {
    pub fn jobs(&self) -> Vec<ScanJob> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn last(&self) -> ScanJob {
        self.0.lock().unwrap().last().cloned().expect("a job")
    }

    /// The jobs as the queue's consumers see them (JSON).
    pub fn json(&self) -> Vec<serde_json::Value> {
        self.jobs()
            .iter()
            .map(|j| serde_json::to_value(j).unwrap())
            .collect()
    }
}

/// A queue that accepts every job and keeps none.
pub struct Discard;

impl ScanQueue for Discard {
    async fn enqueue(&self, _: &ScanJob) -> Result<(), QueueError> {
        Ok(())
    }
}

/// A queue that refuses every job.
pub struct Refuse;

impl ScanQueue for Refuse {
    async fn enqueue(&self, _: &ScanJob) -> Result<(), QueueError> {
        Err(QueueError::Backend("refused by the test".into()))
    }
}

/// A sink the test can read while something else holds it: a meter's EMF
/// lines, a purge's progress.
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    /// A meter writing its EMF lines here.
    pub fn meter(&self) -> Meter {
        Meter::new("StellaOps/Quota", Some(Box::new(self.clone())))
    }

    /// Everything written so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// How many lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}
