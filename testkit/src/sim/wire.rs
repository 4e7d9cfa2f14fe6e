//! The simulated wire: a seeded fate for every command, and connections
//! that land what was sent in the order it was sent.
//!
//! The two facts the settlement rules rest on are modelled, and nothing
//! more: a command that was never sent has no effect, ever; a command that
//! was sent and not answered may still take effect later, but only in its
//! place in its connection's order (before anything sent after it that
//! lands), or never (its connection died with it).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A small, fast, seeded generator (SplitMix64): the same seed, the same
/// schedule.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Uniform in `lo..=hi` milliseconds.
    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// What happens to one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Runs, and the answer comes after this long.
    Answered(Duration),
    /// Never written: no connection, found out after this long.
    NotSent(Duration),
    /// The server answers with an error; nothing changes.
    Refused,
    /// Written, and the caller waits in vain; the command lands as `Land` says.
    Unanswered(Land),
}

/// When a sent, unanswered command takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Land {
    Never,
    /// When the `k`-th command after it is written on its connection, or
    /// after the given time, whichever comes first.
    AfterCommands(u64, Duration),
    /// This long after it was sent (a slow server, past the caller's timeout).
    After(Duration),
}

/// The fault plan of one schedule: before `until`, a command fails with
/// probability `percent`; after it, everything is answered. During the
/// `stall` (a stopped server, as `SIGSTOP` makes one) nothing lands on any
/// connection: what is sent then lands when it ends, in order.
pub struct Faults {
    rng: Mutex<Rng>,
    percent: u64,
    until: Instant,
    stall: Option<(Instant, Instant)>,
    start: Instant,
}

impl Faults {
    pub fn new(seed: u64, percent: u64, until: Instant, stall: Option<(Instant, Instant)>) -> Self {
        Self {
            rng: Mutex::new(Rng::new(seed)),
            percent,
            until,
            stall,
            start: Instant::now(),
        }
    }

    /// Whether the faults are over at `now`: past the fault window and any stall.
    pub fn over(&self, now: Instant) -> bool {
        now >= self.until && self.stall.is_none_or(|(_, to)| now >= to)
    }

    /// When the schedule started.
    pub fn start(&self) -> Instant {
        self.start
    }

    /// The fate of a command sent now by a caller that waits `timeout`.
    /// A late command lands soon after its caller gave up (a server is
    /// slow for everyone, so one connection's command does not lag the
    /// others' by seconds), or when the stall ends.
    pub fn draw(&self, timeout: Duration) -> Fate {
        let now = Instant::now();
        let mut rng = self.rng.lock().unwrap();
        if let Some((from, to)) = self.stall
            && (from..to).contains(&now)
        {
            return Fate::Unanswered(Land::After(to - now + rng.ms(0, 5)));
        }
        let quick = timeout.as_millis() as u64 / 2;
        if now >= self.until || !rng.chance(self.percent) {
            return Fate::Answered(rng.ms(0, quick));
        }
        let timeout_ms = timeout.as_millis() as u64;
        let late = rng.ms(0, 3 * timeout_ms);
        match rng.below(5) {
            0 => Fate::NotSent(rng.ms(0, timeout_ms)),
            1 => Fate::Refused,
            2 => Fate::Unanswered(Land::Never),
            3 => Fate::Unanswered(Land::AfterCommands(1 + rng.below(3), late)),
            _ => Fate::Unanswered(Land::After(late)),
        }
    }
}

type Effect = Box<dyn FnOnce() + Send>;

struct Pending {
    seq: u64,
    /// Lands once this many commands have been written on the connection.
    due: Option<u64>,
    /// `None`: never lands.
    effect: Option<Effect>,
}

#[derive(Default)]
struct Line {
    written: u64,
    pending: VecDeque<Pending>,
}

impl Line {
    /// Lands, in order, everything written up to `seq`.
    fn land_through(&mut self, seq: u64) {
        while self.pending.front().is_some_and(|p| p.seq <= seq) {
            if let Some(effect) = self.pending.pop_front().and_then(|p| p.effect) {
                effect();
            }
        }
    }
}

/// One simulated connection: what was written on it lands in order.
#[derive(Default)]
pub struct Conn {
    line: Mutex<Line>,
}

impl Conn {
    /// Writes a command whose `effect` lands as `land` says (`None`:
    /// now, in order, as an answered command does), and returns its place.
    pub fn write(self: &Arc<Self>, effect: Option<Effect>, land: Option<Land>) -> u64 {
        let mut line = self.line.lock().unwrap();
        line.written += 1;
        let seq = line.written;
        let (due, effect) = match land {
            None | Some(Land::After(_)) => (None, effect),
            Some(Land::Never) => (None, None),
            Some(Land::AfterCommands(k, _)) => (Some(seq + k), effect),
        };
        line.pending.push_back(Pending { seq, due, effect });
        // Commands whose k-th successor this is land now, in order.
        let written = line.written;
        if let Some(through) = line
            .pending
            .iter()
            .filter(|p| p.due.is_some_and(|d| d <= written))
            .map(|p| p.seq)
            .max()
        {
            line.land_through(through);
        }
        if land.is_none() {
            line.land_through(seq);
        }
        drop(line);
        if let Some(Land::After(after) | Land::AfterCommands(_, after)) = land {
            let conn = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                conn.land_through(seq);
            });
        }
        seq
    }

    pub fn land_through(&self, seq: u64) {
        self.line.lock().unwrap().land_through(seq);
    }

    /// The server has caught up: everything still due lands.
    pub fn land_all(&self) {
        self.land_through(u64::MAX);
    }
}

/// A slot an effect fills with the command's answer.
pub struct Answer<T>(Arc<Mutex<Option<T>>>);

impl<T> Answer<T> {
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(None)))
    }

    pub fn sender(&self) -> Arc<Mutex<Option<T>>> {
        self.0.clone()
    }

    pub fn take(&self) -> Option<T> {
        self.0.lock().unwrap().take()
    }
}

impl<T> Default for Answer<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs a future that completes without waiting (the in-memory store's
/// calls never wait) to its end, now.
pub fn ready<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        std::task::Poll::Pending => unreachable!("the in-memory store never waits"),
    }
}
