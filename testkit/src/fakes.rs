//! Stand-ins for the gate's outputs: queues that record, discard or refuse
//! jobs, and a sink that keeps what is written to it; and what a stand-in
//! store needs to carry a pacing step into a task of its own.

use std::io::Write;
use std::sync::{Arc, Mutex};

use quota_gate::io::meter::Meter;
use quota_gate::io::queue::{ScanJob, ScanQueue, SendError};
use quota_gate::io::store::{PaceArgs, PaceLane, QuotaKey};
use quota_gate::rules::delay::SleepAsk;
use quota_gate::rules::unix::{UnixMillis, UnixSecs};

/// A pacing step's [`PaceArgs`], owned: a store wrapper moves it into a
/// closure or task, then lends it out again with [`OwnedPace::args`]
/// (its levels' lines lent by [`OwnedPace::lanes`]).
#[derive(Debug, Clone)]
pub struct OwnedPace {
    key: QuotaKey,
    levels: Vec<(QuotaKey, u64, UnixSecs)>,
    record: Option<String>,
    arrival_ms: UnixMillis,
    delay_ms: u64,
    max_backlog_ms: u64,
    reset_at: UnixSecs,
    sleep_ask: Option<SleepAsk>,
}

impl OwnedPace {
    pub fn new(args: &PaceArgs<'_>) -> Self {
        Self {
            key: args.key.clone(),
            levels: args
                .levels
                .iter()
                .map(|l| (l.key.clone(), l.delay_ms, l.reset_at))
                .collect(),
            record: args.record.map(str::to_owned),
            arrival_ms: args.arrival_ms,
            delay_ms: args.delay_ms,
            max_backlog_ms: args.max_backlog_ms,
            reset_at: args.reset_at,
            sleep_ask: args.sleep_ask,
        }
    }

    /// The levels' lines, for [`OwnedPace::args`].
    pub fn lanes(&self) -> Vec<PaceLane<'_>> {
        self.levels
            .iter()
            .map(|(key, delay_ms, reset_at)| PaceLane {
                key,
                delay_ms: *delay_ms,
                reset_at: *reset_at,
            })
            .collect()
    }

    pub fn args<'a>(&'a self, lanes: &'a [PaceLane<'a>]) -> PaceArgs<'a> {
        PaceArgs {
            key: &self.key,
            levels: lanes,
            record: self.record.as_deref(),
            arrival_ms: self.arrival_ms,
            delay_ms: self.delay_ms,
            max_backlog_ms: self.max_backlog_ms,
            reset_at: self.reset_at,
            sleep_ask: self.sleep_ask,
        }
    }
}

/// A queue in memory: exactly the jobs the gate enqueued, nothing in the way.
#[derive(Clone, Default)]
pub struct RecordingQueue(Arc<Mutex<Vec<ScanJob>>>);

impl ScanQueue for RecordingQueue {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), SendError> {
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
    async fn enqueue(&self, _: &ScanJob) -> Result<(), SendError> {
        Ok(())
    }
}

/// A queue that refuses every job.
pub struct Refuse;

impl ScanQueue for Refuse {
    async fn enqueue(&self, _: &ScanJob) -> Result<(), SendError> {
        Err(SendError::Refused("refused by the test".into()))
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
