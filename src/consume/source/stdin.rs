//! The spool on standard input: `quota-gate serve | quota-gate consume --from -`.
//!
//! `serve` writes jobs and EMF lines to one stdout; lines without a
//! `scanId` (the EMF lines) are skipped, a line that has one but is not a
//! readable job is logged and skipped. A pipe cannot redeliver, and what
//! sits in it dies with the consumer, so the spool is for local use.
//!
//! Standard input is read through [`Input`]: a stop never waits for a line
//! to come, and a line is taken from the pipe only while the consumer still
//! hands lines out. Every job line taken is the consumer's from then on,
//! whenever the stop comes: a read that a stop cuts short (before or while
//! its job is journaled) leaves the job here, and
//! [`drain`](JobSource::drain) gives it back with the lines still in the
//! pipe, read until it stays quiet for [`DRAIN_IDLE`] or [`DRAIN_MAX`] has
//! passed, and then with every line the reading had taken and not handed
//! out (whole lines buffered, the line the reading thread held, a line
//! already started, finished within [`DRAIN_IDLE`]; a line that a terminal
//! or socket gives the thread later is written back, see [`Input`]). The
//! one exception: a line whose end does not reach the pipe within that
//! wait. Its start is dropped (an error logs its size) and its rest is left
//! in the pipe, a broken line for the next reader. What the pipe (or a
//! file) still holds after that was never taken, and stays there.
//!
//! **Without `--journal`**, nothing is acknowledged, and jobs not started
//! when the consumer stops (including the lines the drain reads) are
//! written back to its standard output, one JSON line each, to be piped in
//! again (best effort: a line the stdout writer has no room for is logged
//! as not written back). A consumer that is killed loses every job it held.
//!
//! **With `--journal PATH`**, every job is appended to the journal and
//! `fsync`ed as soon as it is read, a `{"started":"<scanId>","attempt":n}`
//! line before each attempt's scanner starts, and a `{"done":"<scanId>"}`
//! line once it ran (or was given up). At start the journal is read, its
//! unfinished jobs are run first, each as a higher attempt than any it
//! records (`SCAN_ATTEMPT` does not repeat across a crash), and it is
//! rewritten with only those and their last start (a temporary file
//! renamed over it). So a consumer that is killed, or stopped, loses none
//! of the jobs it had read: only lines still in the pipe at a crash, which
//! the gate had answered 202 when it wrote them. A job read while stopping
//! that cannot be journaled is written back to standard output instead.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::Mutex;
use uuid::Uuid;

use super::input::Input;
use super::{Delivery, GivenUp, JobSource};
use crate::consume::error::ConsumeError;
use crate::job::ScanJob;

/// On stop, buffered lines are read until none comes for this long…
/// It is also how long the end of a line already started is waited for.
pub const DRAIN_IDLE: Duration = Duration::from_millis(200);

/// … or for this long in all (new lines until [`DRAIN_IDLE`] before it,
/// then only the end of a line already started): a writer that keeps
/// writing does not keep a stopping consumer reading; what it wrote after
/// stays in the pipe.
pub const DRAIN_MAX: Duration = Duration::from_secs(2);

/// Lines from standard input, journaled if asked.
pub struct StdinSource {
    lines: Mutex<Input>,
    journal: Option<Journal>,
    /// Jobs taken and not handed out yet.
    ahead: std::sync::Mutex<Ahead>,
    /// The highest attempt the journal says each replayed job started.
    started: HashMap<Uuid, u64>,
}

/// Jobs the source holds before handing them out.
#[derive(Default)]
struct Ahead {
    /// The journal's unfinished jobs, handed out before standard input's.
    replay: Vec<Delivery>,
    /// A line read and not yet handed out: its journaling may not have
    /// finished (a stop cancels a read at any point).
    read: Option<Delivery>,
}

impl StdinSource {
    /// Standard input, with the journal at `journal` (replayed now) if any.
    pub async fn open(journal: Option<&Path>) -> Result<Self, ConsumeError> {
        let (journal, replay) = match journal {
            None => (None, Replay::default()),
            Some(path) => {
                let (journal, replay) = Journal::open(path.to_owned()).await?;
                if !replay.jobs.is_empty() {
                    tracing::info!(
                        jobs = replay.jobs.len(),
                        "replaying the journal's unfinished jobs"
                    );
                }
                (Some(journal), replay)
            }
        };
        Ok(Self {
            lines: Mutex::new(Input::stdin()),
            journal,
            ahead: std::sync::Mutex::new(Ahead {
                replay: replay.jobs,
                read: None,
            }),
            started: replay.started,
        })
    }

    /// The highest attempt number the journal says each of its unfinished
    /// jobs started with, so a replay runs as a later attempt.
    pub fn started_attempts(&self) -> impl Iterator<Item = (Uuid, u64)> + '_ {
        self.started.iter().map(|(scan, n)| (*scan, *n))
    }

    fn ahead(&self) -> std::sync::MutexGuard<'_, Ahead> {
        self.ahead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn read_line(&self) -> Result<Option<String>, ConsumeError> {
        let mut lines = self.lines.lock().await;
        lines
            .next_line()
            .await
            .map_err(|e| ConsumeError::Stdin(e.to_string()))
    }

    /// The next job line, kept in [`Ahead::read`] until handed out; `None`
    /// at the end of input.
    async fn read_job(&self) -> Result<Option<Delivery>, ConsumeError> {
        if let Some(d) = self.ahead().read.clone() {
            return Ok(Some(d));
        }
        loop {
            let Some(line) = self.read_line().await? else {
                return Ok(None);
            };
            if let Some(d) = delivery(line) {
                // No await between the read and this: a cancelled read
                // either took no line or left it here.
                self.ahead().read = Some(d.clone());
                return Ok(Some(d));
            }
        }
    }

    /// Journals `d` (if there is a journal) before anyone acts on it.
    async fn keep(&self, d: &Delivery) -> Result<(), ConsumeError> {
        match &self.journal {
            Some(journal) => journal.append(d.json.clone()).await,
            None => Ok(()),
        }
    }

    /// While stopping: the job on `line` (if any) journaled, or else
    /// written back at once, and added to `out`.
    async fn keep_line(&self, line: String, out: &mut Vec<Delivery>) {
        if let Some(d) = delivery(line) {
            self.keep_or_write_back(&d).await;
            out.push(d);
        }
    }

    /// While stopping: `d` journaled, or else written back at once.
    async fn keep_or_write_back(&self, d: &Delivery) {
        if let Err(e) = self.keep(d).await {
            tracing::error!(error = %e, scan_id = %d.job.scan_id, "cannot journal a job read while stopping; writing it back");
            write_back(d);
        }
    }
}

impl JobSource for StdinSource {
    type Handle = ();

    fn name(&self) -> &'static str {
        "stdin"
    }

    async fn next(&self, _max: usize) -> Result<Option<Vec<Delivery>>, ConsumeError> {
        let replay = std::mem::take(&mut self.ahead().replay);
        if !replay.is_empty() {
            return Ok(Some(replay));
        }
        let Some(d) = self.read_job().await? else {
            return Ok(None);
        };
        // Journaled more than once if a stop cut this short and `drain`
        // journals it again: compaction keeps one per scanId.
        self.keep(&d).await?;
        self.ahead().read = None;
        Ok(Some(vec![d]))
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

    /// Journaled (`{"started":"<scanId>","attempt":n}`) before the scanner
    /// starts, so a replay after a crash takes a higher attempt.
    async fn started(&self, d: &Delivery, attempt: u64) {
        let Some(journal) = &self.journal else {
            return;
        };
        if let Err(e) = journal.append(started_line(d.job.scan_id, attempt)).await {
            tracing::warn!(error = %e, scan_id = %d.job.scan_id, "cannot journal a scan's start; a replay may repeat its attempt number");
        }
    }

    async fn dead_letter(&self, d: &Delivery, why: GivenUp<'_>) -> Result<(), ConsumeError> {
        let GivenUp { failures, error } = why;
        tracing::error!(scan_id = %d.job.scan_id, failures, error, "spooled job given up");
        self.ack(d).await
    }

    /// Journaled: it stays there, and the next start runs it. Otherwise
    /// written back to standard output.
    async fn give_back(&self, d: &Delivery, _wait: Duration) {
        if self.journal.is_none() {
            write_back(d);
        }
    }

    /// The jobs taken and not handed out (journaled now if they may not
    /// be), the lines still in the pipe, read until it stays quiet or the
    /// cap, and the lines the reading took and had not handed out; then
    /// standard input is not read again.
    async fn drain(&self) -> Vec<Delivery> {
        let (mut out, read) = {
            let mut ahead = self.ahead();
            (std::mem::take(&mut ahead.replay), ahead.read.take())
        };
        // A read a stop cut short: its journaling may not have landed.
        if let Some(d) = read {
            self.keep_or_write_back(&d).await;
            out.push(d);
        }
        // New lines until quiet or the cap, keeping DRAIN_IDLE of it to
        // finish a line already started.
        let until = tokio::time::Instant::now() + DRAIN_MAX.saturating_sub(DRAIN_IDLE);
        while let Some(quiet) = drain_wait(until) {
            let Ok(Ok(Some(line))) = tokio::time::timeout(quiet, self.read_line()).await else {
                break;
            };
            self.keep_line(line, &mut out).await;
        }
        let taken = self.lines.lock().await.close(DRAIN_IDLE).await;
        for line in taken {
            self.keep_line(line, &mut out).await;
        }
        out
    }
}

/// How long the drain waits for the next line: [`DRAIN_IDLE`], or what is
/// left until `until`; `None` once it has come.
fn drain_wait(until: tokio::time::Instant) -> Option<Duration> {
    let left = until.saturating_duration_since(tokio::time::Instant::now());
    (!left.is_zero()).then(|| left.min(DRAIN_IDLE))
}

/// `d` written back to standard output, to be piped in again.
fn write_back(d: &Delivery) {
    if !super::input::write_back_line(d.json.clone()) {
        tracing::error!(scan_id = %d.job.scan_id, "job not started and not written back");
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

fn started_line(scan: Uuid, attempt: u64) -> String {
    serde_json::json!({ "started": scan, "attempt": attempt }).to_string()
}

/// A journal line that says a job is finished.
#[derive(Deserialize)]
struct Done {
    done: Uuid,
}

/// A journal line that says an attempt at a job started.
#[derive(Deserialize)]
struct Started {
    started: Uuid,
    attempt: u64,
}

/// What a journal holds at start: its unfinished jobs, in order, and the
/// highest attempt each started with (if it did).
#[derive(Default)]
struct Replay {
    jobs: Vec<Delivery>,
    started: HashMap<Uuid, u64>,
}

/// The append-only journal file; every line is `fsync`ed before it counts.
struct Journal {
    file: Arc<std::sync::Mutex<std::fs::File>>,
}

impl Journal {
    /// Reads `path` (if it exists), rewrites it with only the unfinished
    /// jobs, and opens it for appending; returns those jobs, in order.
    async fn open(path: PathBuf) -> Result<(Self, Replay), ConsumeError> {
        let opened = tokio::task::spawn_blocking(move || compact(&path))
            .await
            .map_err(|e| ConsumeError::Journal(e.to_string()))?;
        let (file, replay) = opened.map_err(|e| ConsumeError::Journal(e.to_string()))?;
        Ok((
            Self {
                file: Arc::new(std::sync::Mutex::new(file)),
            },
            replay,
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

/// The journal's unfinished jobs (and the attempts they started), and the
/// journal rewritten with just them.
fn compact(path: &Path) -> std::io::Result<(std::fs::File, Replay)> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let replay = unfinished(&text);
    let tmp = path.with_extension("compacting");
    {
        let mut out = std::fs::File::create(&tmp)?;
        for d in &replay.jobs {
            out.write_all(d.json.as_bytes())?;
            out.write_all(b"\n")?;
            if let Some(n) = replay.started.get(&d.job.scan_id) {
                out.write_all(started_line(d.job.scan_id, *n).as_bytes())?;
                out.write_all(b"\n")?;
            }
        }
        out.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    let file = std::fs::OpenOptions::new().append(true).open(path)?;
    Ok((file, replay))
}

/// The jobs of the journal `text` without a done line, once each, in
/// order, and the highest attempt each started with.
fn unfinished(text: &str) -> Replay {
    let done: HashSet<Uuid> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Done>(l).ok())
        .map(|d| d.done)
        .collect();
    let mut seen = HashSet::new();
    let jobs: Vec<Delivery> = text
        .lines()
        .filter_map(|l| delivery(l.to_owned()))
        .filter(|d| !done.contains(&d.job.scan_id) && seen.insert(d.job.scan_id))
        .collect();
    let mut started = HashMap::new();
    for s in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Started>(l).ok())
    {
        if seen.contains(&s.started) && !done.contains(&s.started) {
            let n: &mut u64 = started.entry(s.started).or_default();
            *n = (*n).max(s.attempt);
        }
    }
    Replay { jobs, started }
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
        let (_, replay) = compact(&path).unwrap();
        assert_eq!(replay.jobs.len(), 1);
        assert_eq!(replay.jobs[0].json, other);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{other}\n")
        );
        let (_, again) = compact(&path).unwrap();
        assert_eq!(again.jobs.len(), 1);
    }

    /// The attempts a journal says its unfinished jobs started are kept
    /// (the highest of each) through compaction; a finished job's are not.
    #[test]
    fn journal_keeps_started_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let (a, b) = (
            "01a22ae3-0721-75a3-a454-7957ef912430",
            "01a22ae3-0721-75a3-a454-7957ef912431",
        );
        let other = JOB.replace(a, b);
        let started = |id: &str, n| started_line(id.parse().unwrap(), n);
        let lines = [
            JOB.to_owned(),
            started(a, 1),
            other.clone(),
            started(b, 2),
            started(b, 1),
            done_line(a.parse().unwrap()),
        ];
        std::fs::write(&path, lines.join("\n")).unwrap();
        let (_, replay) = compact(&path).unwrap();
        let want = HashMap::from([(b.parse().unwrap(), 2)]);
        assert_eq!(replay.started, want);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{other}\n{}\n", started(b, 2))
        );
        assert_eq!(compact(&path).unwrap().1.started, want);
    }
}
