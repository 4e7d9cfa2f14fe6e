//! The spool's journal (`consume --from - --journal PATH`): what makes a pipe's jobs survive the
//! consumer. Each job as read, a `{"started":"<scanId>","attempt":n}` line before each attempt and
//! a `{"done":"<scanId>"}` line once it ran or was given up are appended and `fsync`ed before they
//! count; [`Journal::open`] replays the unfinished jobs and rewrites the file with only those.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use uuid::Uuid;

use super::Delivery;
use crate::consume::error::ConsumeError;

fn done_line(scan: Uuid) -> String {
    serde_json::json!({ "done": scan }).to_string()
}

fn started_line(scan: Uuid, attempt: u64) -> String {
    serde_json::json!({ "started": scan, "attempt": attempt }).to_string()
}

#[derive(Deserialize)]
struct Done {
    done: Uuid,
}

#[derive(Deserialize)]
struct Started {
    started: Uuid,
    attempt: u64,
}

/// What a journal holds at start: its unfinished jobs, in order, and each one's highest attempt.
#[derive(Default)]
pub struct Replay {
    pub jobs: Vec<Delivery>,
    pub started: HashMap<Uuid, u64>,
}

/// The append-only journal file (none without `--journal`: nothing is kept); every line is
/// `fsync`ed before it counts.
pub struct Journal {
    file: Option<Arc<std::sync::Mutex<std::fs::File>>>,
}

fn journal_error(e: impl ToString) -> ConsumeError {
    ConsumeError::Journal(e.to_string())
}

impl Journal {
    /// Reads `path` if it exists, rewrites it with only the unfinished jobs, opens it to append.
    pub async fn open(path: Option<&Path>) -> Result<(Self, Replay), ConsumeError> {
        let Some(path) = path.map(Path::to_owned) else {
            return Ok((Self { file: None }, Replay::default()));
        };
        let opened = tokio::task::spawn_blocking(move || compact(&path)).await;
        let (file, replay) = opened.map_err(journal_error)?.map_err(journal_error)?;
        let file = Some(Arc::new(std::sync::Mutex::new(file)));
        Ok((Self { file }, replay))
    }

    /// Whether there is a journal file.
    pub fn is_kept(&self) -> bool {
        self.file.is_some()
    }

    /// `d`, as it was read.
    pub async fn job(&self, d: &Delivery) -> Result<(), ConsumeError> {
        self.append(d.json.clone()).await
    }

    /// `scan` is finished: a replay leaves it out.
    pub async fn done(&self, scan: Uuid) -> Result<(), ConsumeError> {
        self.append(done_line(scan)).await
    }

    /// Attempt `attempt` at `scan` starts: a replay runs a higher one.
    pub async fn started(&self, scan: Uuid, attempt: u64) -> Result<(), ConsumeError> {
        self.append(started_line(scan, attempt)).await
    }

    async fn append(&self, mut line: String) -> Result<(), ConsumeError> {
        let Some(file) = self.file.clone() else {
            return Ok(());
        };
        line.push('\n');
        tokio::task::spawn_blocking(move || {
            let mut file = file
                .lock()
                .map_err(|_| std::io::Error::other("journal lock poisoned"))?;
            file.write_all(line.as_bytes())?;
            file.sync_data()
        })
        .await
        .map_err(journal_error)?
        .map_err(journal_error)
    }
}

/// The journal's unfinished jobs (and their attempts), and the journal rewritten with just them.
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
            writeln!(out, "{}", d.json)?;
            if let Some(n) = replay.started.get(&d.job.scan_id) {
                writeln!(out, "{}", started_line(d.job.scan_id, *n))?;
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

/// The jobs of `text` without a done line, once each, in order, with each one's highest attempt.
fn unfinished(text: &str) -> Replay {
    let done: HashSet<Uuid> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Done>(l).ok())
        .map(|d| d.done)
        .collect();
    let mut seen = HashSet::new();
    let jobs: Vec<Delivery> = text
        .lines()
        .filter_map(|l| Delivery::of_spool_line(l.to_owned()))
        .filter(|d| !done.contains(&d.job.scan_id) && seen.insert(d.job.scan_id))
        .collect();
    let mut started = HashMap::new();
    let starts = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Started>(l).ok());
    // `seen` holds only unfinished jobs.
    for s in starts.filter(|s| seen.contains(&s.started)) {
        let n: &mut u64 = started.entry(s.started).or_default();
        *n = (*n).max(s.attempt);
    }
    Replay { jobs, started }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consume::source::tests::JOB;

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
