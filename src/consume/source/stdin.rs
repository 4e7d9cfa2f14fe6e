//! The spool on standard input: `quota-gate serve | quota-gate consume --from -`.
//!
//! `serve` writes jobs and EMF lines to one stdout; lines without a
//! `scanId` (the EMF lines) are skipped, a line that has one but is not a
//! readable job is logged and skipped. A pipe cannot redeliver, so nothing is
//! acknowledged; jobs not started when the consumer stops are written back
//! to its standard output, one JSON line each, to be piped in again.

use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};
use tokio::sync::Mutex;

use super::{Delivery, Handle};
use crate::job::ScanJob;

/// Lines from standard input.
pub struct StdinSource {
    lines: Mutex<Lines<BufReader<Stdin>>>,
}

impl Default for StdinSource {
    fn default() -> Self {
        Self {
            lines: Mutex::new(BufReader::new(tokio::io::stdin()).lines()),
        }
    }
}

impl StdinSource {
    /// The next job, or `None` at the end of input.
    pub async fn next(&self) -> Result<Option<Vec<Delivery>>, String> {
        let mut lines = self.lines.lock().await;
        loop {
            let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? else {
                return Ok(None);
            };
            if let Some(d) = delivery(line) {
                return Ok(Some(vec![d]));
            }
        }
    }
}

/// The job on `line`, if it carries one.
fn delivery(line: String) -> Option<Delivery> {
    if !line.contains("\"scanId\"") {
        return None;
    }
    match ScanJob::from_json(&line) {
        Ok(job) => Some(Delivery {
            job,
            json: line,
            handle: Handle::Stdin,
        }),
        Err(e) => {
            tracing::error!(error = %e, "unreadable job line skipped");
            None
        }
    }
}

/// Writes a job not started back to standard output.
pub fn give_back(d: &Delivery) {
    let mut line = d.json.clone().into_bytes();
    line.push(b'\n');
    if crate::stdout::LineWriter::stdout().try_line(line).is_err() {
        tracing::error!(scan_id = %d.job.scan_id, "job not started and not written back");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// EMF lines pass by; job lines become deliveries; broken job lines are skipped.
    #[test]
    fn lines() {
        assert!(delivery(r#"{"_aws":{"Timestamp":1}}"#.into()).is_none());
        assert!(delivery(r#"{"scanId":"nope"}"#.into()).is_none());
        let job = r#"{"version":1,"scanId":"01a22ae3-0721-75a3-a454-7957ef912430","receivedAt":"2026-11-30T12:00:00.000Z","scope":"ip","digest":"d","tier":"soft","limit":1,"count":2,"delayMs":300,"deferredMs":300,"notBefore":"2026-11-30T12:00:00.300Z","request":{"image":"a"}}"#;
        let d = delivery(job.into()).unwrap();
        assert_eq!(d.job.not_before_ms % 1000, 300);
        assert_eq!(d.json, job);
    }
}
