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
//! **With `--journal PATH`**, every job is appended to the [`Journal`] and
//! `fsync`ed as soon as it is read, and each attempt's start and each job's
//! end are journaled too. At start the journal's unfinished jobs are run
//! first, each as a higher attempt than any it records (`SCAN_ATTEMPT` does
//! not repeat across a crash). So a consumer that is killed, or stopped,
//! loses none of the jobs it had read: only lines still in the pipe at a
//! crash, which the gate had answered 202 when it wrote them. A job read
//! while stopping that cannot be journaled is written back to standard
//! output instead.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use tokio::sync::Mutex;
use uuid::Uuid;

use super::input::Input;
use super::journal::{Journal, Replay};
use super::{Delivery, GivenUp, JobSource};
use crate::consume::error::ConsumeError;

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
            if let Some(d) = Delivery::of_spool_line(line) {
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
            Some(journal) => journal.job(d).await,
            None => Ok(()),
        }
    }

    /// While stopping: the job on `line` (if any) journaled, or else
    /// written back at once, and added to `out`.
    async fn keep_line(&self, line: String, out: &mut Vec<Delivery>) {
        if let Some(d) = Delivery::of_spool_line(line) {
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
            Some(journal) => journal.done(d.job.scan_id).await,
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
        if let Err(e) = journal.started(d.job.scan_id, attempt).await {
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
