//! The local spool: one JSON line per job on standard output.
//!
//! For local runs and piping into another tool; `notBefore` on each line
//! carries the deferral, since a pipe cannot hold a line back.

use std::io::Write;
use std::sync::{Arc, Mutex};

use super::{QueueError, ScanJob, ScanQueue};

/// Writes jobs as JSON lines.
#[derive(Clone)]
pub struct Spool {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl Default for Spool {
    fn default() -> Self {
        Self::new(Box::new(std::io::stdout()))
    }
}

impl Spool {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out: Arc::new(Mutex::new(out)),
        }
    }
}

impl ScanQueue for Spool {
    async fn enqueue(&self, job: &ScanJob) -> Result<(), QueueError> {
        let mut line = serde_json::to_vec(job).map_err(|e| QueueError::Backend(e.to_string()))?;
        line.push(b'\n');
        let mut out = self
            .out
            .lock()
            .map_err(|_| QueueError::Backend("spool lock poisoned".into()))?;
        out.write_all(&line)
            .and_then(|()| out.flush())
            .map_err(|e| QueueError::Backend(format!("spool write failed: {e}")))
    }
}
