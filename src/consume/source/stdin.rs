//! The spool on standard input: `quota-gate serve | quota-gate consume --from -`.
//!
//! `serve` writes jobs and EMF lines to one stdout; lines without a
//! `scanId` (the EMF lines) are skipped, a line that has one but is not a
//! readable job is logged and skipped. A pipe cannot redeliver, and what
//! sits in it dies with the consumer, so the spool is for local use.
//!
//! **Without `--journal`**, nothing is acknowledged, and jobs not started
//! when the consumer stops (including lines still buffered in the pipe,
//! read until it stays quiet for [`DRAIN_IDLE`]) are written back to its
//! standard output, one JSON line each, to be piped in again. A consumer
//! that is killed loses every job it held.
//!
//! **With `--journal PATH`**, every job is appended to the journal and
//! `fsync`ed as soon as it is read, and a `{"done":"<scanId>"}` line is
//! appended once it ran (or was given up). At start the journal is read,
//! its unfinished jobs are run first, and it is rewritten with only those
//! (a temporary file renamed over it). So a consumer that is killed, or
//! stopped, loses none of the jobs it had read: only lines still in the
//! pipe at a crash, which the gate had answered 202 when it wrote them.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader, Lines, Stdin};
use tokio::sync::Mutex;
use uuid::Uuid;

use super::{Delivery, GivenUp, JobSource};
use crate::consume::error::ConsumeError;
use crate::job::ScanJob;

/// On stop, buffered lines are read until none comes for this long.
pub const DRAIN_IDLE: Duration = Duration::from_millis(200);

/// Lines from standard input, journaled if asked.
pub struct StdinSource {
    lines: Mutex<Lines<BufReader<Stdin>>>,
    journal: Option<Journal>,
    /// The journal's unfinished jobs, handed out before standard input's.
    replay: Mutex<Vec<Delivery>>,
}

impl StdinSource {
    /// Standard input, with the journal at `journal` (replayed now) if any.
    pub async fn open(journal: Option<&Path>) -> Result<Self, ConsumeError> {
        let (journal, replay) = match journal {
            None => (None, Vec::new()),
            Some(path) => {
                let (journal, pending) = Journal::open(path.to_owned()).await?;
                if !pending.is_empty() {
                    tracing::info!(
                        jobs = pending.len(),
                        "replaying the journal's unfinished jobs"
                    );
                }
                (Some(journal), pending)
            }
        };
        Ok(Self {
            lines: Mutex::new(BufReader::new(tokio::io::stdin()).lines()),
            journal,
            replay: Mutex::new(replay),
        })
    }

    async fn read_line(&self) -> Result<Option<String>, ConsumeError> {
        let mut lines = self.lines.lock().await;
        lines
            .next_line()
            .await
            .map_err(|e| ConsumeError::Stdin(e.to_string()))
    }

    /// Journals `d` (if there is a journal) before anyone acts on it.
    async fn keep(&self, d: &Delivery) -> Result<(), ConsumeError> {
        match &self.journal {
            Some(journal) => journal.append(d.json.clone()).await,
            None => Ok(()),
        }
    }
}

impl JobSource for StdinSource {
    type Handle = ();

    fn name(&self) -> &'static str {
        "stdin"
    }

    async fn next(&self, _max: usize) -> Result<Option<Vec<Delivery>>, ConsumeError> {
        {
            let mut replay = self.replay.lock().await;
            if !replay.is_empty() {
                return Ok(Some(std::mem::take(&mut *replay)));
            }
        }
        loop {
            let Some(line) = self.read_line().await? else {
                return Ok(None);
            };
            if let Some(d) = delivery(line) {
                self.keep(&d).await?;
                return Ok(Some(vec![d]));
            }
        }
    }

    async fn ack(&self, d: &Delivery) -> Result<(), ConsumeError> {
        match &self.journal {
            Some(journal) => journal.append(done_line(d.job.scan_id)).await,
            None => Ok(()),
        }
    }

    async fn extend(&self, _d: &Delivery) -> Result<(), ConsumeError> {
        Ok(())
    }

    async fn dead_letter(&self, d: &Delivery, why: GivenUp<'_>) -> Result<(), ConsumeError> {
        let GivenUp { failures, error } = why;
        tracing::error!(scan_id = %d.job.scan_id, failures, error, "spooled job given up");
        self.ack(d).await
    }

    /// Journaled: it stays there, and the next start runs it. Otherwise
    /// written back to standard output.
    async fn give_back(&self, d: &Delivery, _wait: Duration) {
        if self.journal.is_some() {
            return;
        }
        let mut line = d.json.clone().into_bytes();
        line.push(b'\n');
        if crate::stdout::LineWriter::stdout().try_line(line).is_err() {
            tracing::error!(scan_id = %d.job.scan_id, "job not started and not written back");
        }
    }

    /// The lines already in the pipe, read until it stays quiet.
    async fn drain(&self) -> Vec<Delivery> {
        let mut out = std::mem::take(&mut *self.replay.lock().await);
        while let Ok(Ok(Some(line))) = tokio::time::timeout(DRAIN_IDLE, self.read_line()).await {
            if let Some(d) = delivery(line) {
                if let Err(e) = self.keep(&d).await {
                    tracing::error!(error = %e, scan_id = %d.job.scan_id, "cannot journal a job read while stopping");
                }
                out.push(d);
            }
        }
        out
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
            handle: (),
        }),
        Err(e) => {
            tracing::error!(error = %e, "unreadable job line skipped");
            None
        }
    }
}

fn done_line(scan: Uuid) -> String {
    serde_json::json!({ "done": scan }).to_string()
}

/// A journal line that says a job is finished.
#[derive(Deserialize)]
struct Done {
    done: Uuid,
}

/// The append-only journal file; every line is `fsync`ed before it counts.
struct Journal {
    file: Arc<std::sync::Mutex<std::fs::File>>,
}

impl Journal {
    /// Reads `path` (if it exists), rewrites it with only the unfinished
    /// jobs, and opens it for appending; returns those jobs, in order.
    async fn open(path: PathBuf) -> Result<(Self, Vec<Delivery>), ConsumeError> {
        let opened = tokio::task::spawn_blocking(move || compact(&path))
            .await
            .map_err(|e| ConsumeError::Journal(e.to_string()))?;
        let (file, pending) = opened.map_err(|e| ConsumeError::Journal(e.to_string()))?;
        Ok((
            Self {
                file: Arc::new(std::sync::Mutex::new(file)),
            },
            pending,
        ))
    }

    async fn append(&self, mut line: String) -> Result<(), ConsumeError> {
        line.push('\n');
        let file = self.file.clone();
        tokio::task::spawn_blocking(move || {
            let mut file = file
                .lock()
                .map_err(|_| std::io::Error::other("journal lock poisoned"))?;
            file.write_all(line.as_bytes())?;
            file.sync_data()
        })
        .await
        .map_err(|e| ConsumeError::Journal(e.to_string()))?
        .map_err(|e| ConsumeError::Journal(e.to_string()))
    }
}

/// The journal's unfinished jobs, and the journal rewritten with just them.
fn compact(path: &Path) -> std::io::Result<(std::fs::File, Vec<Delivery>)> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let done: HashSet<Uuid> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Done>(l).ok())
        .map(|d| d.done)
        .collect();
    let mut seen = HashSet::new();
    let pending: Vec<Delivery> = text
        .lines()
        .filter_map(|l| delivery(l.to_owned()))
        .filter(|d| !done.contains(&d.job.scan_id) && seen.insert(d.job.scan_id))
        .collect();
    let tmp = path.with_extension("compacting");
    {
        let mut out = std::fs::File::create(&tmp)?;
        for d in &pending {
            out.write_all(d.json.as_bytes())?;
            out.write_all(b"\n")?;
        }
        out.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    let file = std::fs::OpenOptions::new().append(true).open(path)?;
    Ok((file, pending))
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"{"version":1,"scanId":"01a22ae3-0721-75a3-a454-7957ef912430","receivedAt":"2026-11-30T12:00:00.000Z","scope":"ip","digest":"d","tier":"soft","limit":1,"count":2,"delayMs":300,"deferredMs":300,"notBefore":"2026-11-30T12:00:00.300Z","request":{"image":"a"}}"#;

    /// EMF lines pass by; job lines become deliveries; broken job lines are skipped.
    #[test]
    fn lines() {
        assert!(delivery(r#"{"_aws":{"Timestamp":1}}"#.into()).is_none());
        assert!(delivery(r#"{"scanId":"nope"}"#.into()).is_none());
        let d = delivery(JOB.into()).unwrap();
        assert_eq!(d.job.not_before_ms % 1000, 300);
        assert_eq!(d.json, JOB);
    }

    /// A journal keeps the jobs without a done line, once each, in order,
    /// and is rewritten with just them.
    #[test]
    fn journal_compacts_to_unfinished_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let other = JOB.replace(
            "01a22ae3-0721-75a3-a454-7957ef912430",
            "01a22ae3-0721-75a3-a454-7957ef912431",
        );
        let done = done_line("01a22ae3-0721-75a3-a454-7957ef912430".parse().unwrap());
        std::fs::write(&path, format!("{JOB}\n{other}\n{other}\n{done}\n{{\"half")).unwrap();
        let (_, pending) = compact(&path).unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].json, other);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{other}\n")
        );
        let (_, again) = compact(&path).unwrap();
        assert_eq!(again.len(), 1);
    }
}
