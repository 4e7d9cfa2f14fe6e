//! The spool on standard input (`quota-gate serve | quota-gate consume --from -`), for local use: a
//! pipe cannot redeliver. Lines without a `scanId` (EMF lines) are skipped.
//! Every job line taken is the consumer's from then on: at a stop, [`drain`](JobSource::drain)
//! gives back the jobs read, the lines still in the pipe (until quiet for [`DRAIN_IDLE`], or
//! [`DRAIN_MAX`] in all) and every line [`Input`] had taken. Without `--journal` they are written
//! back to standard output (best effort) and a killed consumer loses what it held; with it every
//! job is journaled as soon as it is read and replayed at start as a higher attempt.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use tokio::sync::Mutex;
use uuid::Uuid;

use super::input::Input;
use super::journal::Journal;
use super::{Delivery, GivenUp, JobSource};
use crate::consume::error::ConsumeError;
use crate::consume::sync::lock;

/// On stop, lines are read until none comes for this long (also the wait for a started line's end)…
pub const DRAIN_IDLE: Duration = Duration::from_millis(200);

/// … or for this long in all, so a writer that keeps writing cannot keep the consumer reading.
pub const DRAIN_MAX: Duration = Duration::from_secs(2);

/// Lines from standard input, journaled if asked.
pub struct StdinSource {
    lines: Mutex<Input>,
    journal: Journal,
    /// Jobs taken and not handed out yet.
    ahead: std::sync::Mutex<Ahead>,
}

#[derive(Default)]
struct Ahead {
    /// The journal's unfinished jobs, handed out before standard input's.
    replay: Vec<Delivery>,
    /// A line read and not yet handed out: a stop may have cancelled its journaling.
    read: Option<Delivery>,
}

impl StdinSource {
    /// Standard input, with the journal at `journal` (replayed now) if any; and the highest attempt
    /// each unfinished journaled job started, so a replay runs a later one.
    pub async fn open(journal: Option<&Path>) -> Result<(Self, HashMap<Uuid, u64>), ConsumeError> {
        let (journal, replay) = Journal::open(journal).await?;
        if !replay.jobs.is_empty() {
            let jobs = replay.jobs.len();
            tracing::info!(jobs, "replaying the journal's unfinished jobs");
        }
        let source = Self {
            lines: Mutex::new(Input::stdin()),
            journal,
            ahead: std::sync::Mutex::new(Ahead {
                replay: replay.jobs,
                read: None,
            }),
        };
        Ok((source, replay.started))
    }

    async fn read_line(&self) -> Result<Option<String>, ConsumeError> {
        let line = self.lines.lock().await.next_line().await;
        line.map_err(|e| ConsumeError::Stdin(e.to_string()))
    }

    /// The next job line, kept in [`Ahead::read`] until handed out; `None` at the end of input.
    async fn read_job(&self) -> Result<Option<Delivery>, ConsumeError> {
        if let Some(d) = lock(&self.ahead).read.clone() {
            return Ok(Some(d));
        }
        while let Some(line) = self.read_line().await? {
            if let Some(d) = Delivery::of_spool_line(line) {
                // No await since the read: a cancelled read took no line or left it here.
                lock(&self.ahead).read = Some(d.clone());
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    /// While stopping: the job `d` (if any) journaled or written back, and added to `out`.
    async fn keep(&self, d: Option<Delivery>, out: &mut Vec<Delivery>) {
        let Some(d) = d else { return };
        if let Err(e) = self.journal.job(&d).await {
            tracing::error!(error = %e, scan_id = %d.job.scan_id, "cannot journal a job read while stopping; writing it back");
            write_back(&d);
        }
        out.push(d);
    }
}

impl JobSource for StdinSource {
    type Handle = ();

    fn name(&self) -> &'static str {
        "stdin"
    }

    async fn next(&self, _max: usize) -> Result<Option<Vec<Delivery>>, ConsumeError> {
        let replay = std::mem::take(&mut lock(&self.ahead).replay);
        if !replay.is_empty() {
            return Ok(Some(replay));
        }
        let Some(d) = self.read_job().await? else {
            return Ok(None);
        };
        // Journaled more than once if a stop cut this short and `drain` journals it again:
        // compaction keeps one per scanId.
        self.journal.job(&d).await?;
        lock(&self.ahead).read = None;
        Ok(Some(vec![d]))
    }

    async fn ack(&self, d: &Delivery) -> Result<(), ConsumeError> {
        self.journal.done(d.job.scan_id).await
    }

    async fn extend(&self, _d: &Delivery) -> Result<(), ConsumeError> {
        Ok(())
    }

    /// Journaled before the scanner starts, so a replay after a crash takes a higher attempt.
    async fn started(&self, d: &Delivery, attempt: u64) {
        if let Err(e) = self.journal.started(d.job.scan_id, attempt).await {
            tracing::warn!(error = %e, scan_id = %d.job.scan_id, "cannot journal a scan's start; a replay may repeat its attempt number");
        }
    }

    async fn dead_letter(&self, d: &Delivery, why: GivenUp<'_>) -> Result<(), ConsumeError> {
        let GivenUp { failures, error } = why;
        tracing::error!(scan_id = %d.job.scan_id, failures, error, "spooled job given up");
        self.ack(d).await
    }

    /// Journaled: it stays there, and the next start runs it; otherwise written back to stdout.
    async fn give_back(&self, d: &Delivery, _wait: Duration) {
        if !self.journal.is_kept() {
            write_back(d);
        }
    }

    /// The jobs taken and not handed out (journaled now if they may not be), then the lines still
    /// in the pipe and those the reading took; standard input is not read again after.
    async fn drain(&self) -> Vec<Delivery> {
        let (mut out, read) = {
            let mut ahead = lock(&self.ahead);
            (std::mem::take(&mut ahead.replay), ahead.read.take())
        };
        // A read a stop cut short: its journaling may not have landed.
        self.keep(read, &mut out).await;
        // New lines until quiet or the cap, keeping DRAIN_IDLE to finish a started line.
        let until = tokio::time::Instant::now() + DRAIN_MAX.saturating_sub(DRAIN_IDLE);
        while let Some(quiet) = drain_wait(until) {
            let Ok(Ok(Some(line))) = tokio::time::timeout(quiet, self.read_line()).await else {
                break;
            };
            self.keep(Delivery::of_spool_line(line), &mut out).await;
        }
        let taken = self.lines.lock().await.close(DRAIN_IDLE).await;
        for line in taken {
            self.keep(Delivery::of_spool_line(line), &mut out).await;
        }
        out
    }
}

/// The drain's wait for the next line: [`DRAIN_IDLE`], capped by `until`; `None` once past it.
fn drain_wait(until: tokio::time::Instant) -> Option<Duration> {
    let left = until.saturating_duration_since(tokio::time::Instant::now());
    (!left.is_zero()).then(|| left.min(DRAIN_IDLE))
}

fn write_back(d: &Delivery) {
    if !super::input::write_back_line(d.json.clone()) {
        tracing::error!(scan_id = %d.job.scan_id, "job not started and not written back");
    }
}
