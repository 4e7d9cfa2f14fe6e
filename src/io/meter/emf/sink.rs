//! Where EMF lines go: flushed before the call returns (Lambda freezes the process after the
//! response), or queued for a writer thread that never holds a request (`serve`, `consume`).

use std::io::Write;
use std::sync::{Arc, Mutex};

use metrics::Counter;

use crate::io::stdout::LineWriter;

/// Where EMF lines go.
#[derive(Clone)]
pub enum Sink {
    /// Written and flushed before [`Sink::write`] returns.
    Sync(Arc<Mutex<Box<dyn Write + Send>>>),
    /// Queued for a writer thread; dropped when the queue is full, and counted if a counter is set.
    Background(LineWriter, Option<Counter>),
}

impl Sink {
    /// A sink written and flushed in the caller's thread.
    pub fn sync(out: Box<dyn Write + Send>) -> Self {
        Self::Sync(Arc::new(Mutex::new(out)))
    }

    /// Writes one line, adding the newline. Best effort: a closed stdout must not fail a scan, and
    /// a full one loses metric lines, never jobs.
    pub fn write(&self, mut line: String) {
        line.push('\n');
        match self {
            Self::Sync(out) => {
                if let Ok(mut out) = out.lock() {
                    let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
                }
            }
            Self::Background(writer, dropped) => {
                if writer.try_line(line.into_bytes()).is_err()
                    && let Some(dropped) = dropped
                {
                    dropped.increment(1);
                }
            }
        }
    }
}
