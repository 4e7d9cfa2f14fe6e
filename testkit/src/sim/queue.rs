//! The simulated scan queue: a keyed job lands at most once per `scanId`,
//! checked when it lands, as every queue's consumers deduplicate; each send
//! given a seeded fate on the wire. It leaves out the stream's marker per
//! idempotency record (which would also catch a retry under a fresh
//! `scanId`): the gate's one `scanId` per key is checked as SQS, which has
//! no such marker, relies on it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quota_gate::gate::ENQUEUE_TIMEOUT;
use quota_gate::io::connection::{SendError, not_connected};
use quota_gate::io::queue::{Once, ScanJob, ScanQueue};
use uuid::Uuid;

use super::wire::{Conn, Fate, Faults};

/// Every job that landed, in order, and the `scanId`s queued "once".
#[derive(Debug, Default)]
pub struct Jobs {
    pub landed: Vec<ScanJob>,
    once: HashSet<Uuid>,
}

/// The queue one gate sees: its connection (the store's, for a stream on
/// the same Valkey), the shared jobs.
pub struct SimQueue {
    pub jobs: Arc<Mutex<Jobs>>,
    pub conn: Arc<Conn>,
    pub faults: Arc<Faults>,
}

impl SimQueue {
    async fn send(&self, job: &ScanJob, once: bool) -> Result<(), SendError> {
        let jobs = self.jobs.clone();
        let job = job.clone();
        let effect = Box::new(move || {
            let mut jobs = jobs.lock().unwrap();
            if !once || jobs.once.insert(job.scan_id) {
                jobs.landed.push(job);
            }
        });
        // The stream's own bound on a send; the gate's is shorter.
        let within = ENQUEUE_TIMEOUT + Duration::from_secs(1);
        match self.faults.draw(within) {
            Fate::NotSent(after) => {
                tokio::time::sleep(after).await;
                Err(not_connected("sim: no connection".into()))
            }
            Fate::Refused => {
                self.conn.write(None, None);
                Err(SendError::Refused("sim: refused".into()))
            }
            Fate::Answered(after) => {
                self.conn.write(Some(effect), None);
                tokio::time::sleep(after.min(Duration::from_millis(50))).await;
                Ok(())
            }
            Fate::Unanswered(land) => {
                self.conn.write(Some(effect), Some(land));
                tokio::time::sleep(within).await;
                Err(SendError::Unanswered)
            }
        }
    }
}

impl ScanQueue for SimQueue {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), SendError> {
        self.send(job, false).await
    }

    async fn enqueue_once(&self, job: &ScanJob, _: Once<'_>) -> Result<Uuid, SendError> {
        self.send(job, true).await.map(|()| job.scan_id)
    }
}
