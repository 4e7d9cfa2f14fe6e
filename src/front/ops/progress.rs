//! Progress for long purges, on stderr so stdout keeps only the result. A counter with a rate, not
//! a bar: SCAN gives no total in advance.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TTY_INTERVAL: Duration = Duration::from_millis(100);
const LOG_INTERVAL: Duration = Duration::from_secs(5);

struct State {
    done: u64,
    last: Instant,
    drawn: bool,
    out: Box<dyn Write + Send>,
}

/// Counts purged keys and reports them.
#[derive(Clone)]
pub struct Progress {
    verb: &'static str,
    redraw: bool,
    interval: Duration,
    started: Instant,
    state: Arc<Mutex<State>>,
}

impl Progress {
    /// Reports to stderr, redrawing when stderr is a terminal.
    pub fn stderr(verb: &'static str) -> Self {
        let tty = std::io::stderr().is_terminal();
        let interval = if tty { TTY_INTERVAL } else { LOG_INTERVAL };
        Self::new(verb, Box::new(std::io::stderr()), tty, interval)
    }

    /// Reports to `out`; `redraw` rewrites one line in place.
    pub fn new(
        verb: &'static str,
        out: Box<dyn Write + Send>,
        redraw: bool,
        interval: Duration,
    ) -> Self {
        let now = Instant::now();
        Self {
            verb,
            redraw,
            interval,
            started: now,
            state: Arc::new(Mutex::new(State {
                done: 0,
                last: now,
                drawn: false,
                out,
            })),
        }
    }

    /// Adds one batch; reports if the interval has passed.
    pub fn add(&self, batch: u64) {
        // Progress is cosmetic: a poisoned lock or a closed stderr must not stop a purge.
        let Ok(mut s) = self.state.lock() else { return };
        s.done += batch;
        let now = Instant::now();
        if now.duration_since(s.last) < self.interval {
            return;
        }
        s.last = now;
        let line = self.line(s.done, now);
        let (clear, end) = if self.redraw {
            ("\x1b[2K", "\r")
        } else {
            ("", "\n")
        };
        let _ = write!(s.out, "{clear}{line}{end}");
        let _ = s.out.flush();
        s.drawn = true;
    }

    /// Keys counted so far.
    pub fn done(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.done)
    }

    /// Clears the status line.
    pub fn finish(&self) {
        let Ok(mut s) = self.state.lock() else { return };
        if self.redraw && s.drawn {
            let _ = write!(s.out, "\x1b[2K\r");
            let _ = s.out.flush();
        }
    }

    fn line(&self, done: u64, now: Instant) -> String {
        let secs = now.duration_since(self.started).as_secs_f64();
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        format!("{} {done} quota keys ({rate:.0}/s, {secs:.0} s)", self.verb)
    }
}
