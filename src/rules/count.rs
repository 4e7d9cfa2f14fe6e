//! What the store answers of a counter: a count and each level's ([`Tally`]), or a [`Peek`].

use crate::rules::unix::{UnixMillis, UnixSecs};

/// The result of one increment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// The count after this increment (1 for the first scan of the period).
    pub used: u64,
    /// When the counter expires, as the store holds it.
    pub reset_at: UnixSecs,
    pub now: UnixSecs,
    /// Extra scans granted for this period (0: none), read in the same round trip.
    pub grant: u64,
}

impl Count {
    pub fn seconds_to_reset(&self) -> u64 {
        u64::try_from(self.reset_at.get() - self.now.get()).unwrap_or(0)
    }
}

/// What one count of a scan answered: the subject's, and each level's above it, in the order asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally {
    pub subject: Count,
    pub levels: Vec<LevelCount>,
}

/// One level's count; in a cluster a level lives on another node, whose answer may fail alone.
pub type LevelCount = Result<Count, NoAnswer>;

/// A count that got no answer: `may_land` when it was sent (it may still run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoAnswer {
    pub may_land: bool,
}

/// What `GET /quota` reads of a subject, in one round trip, changing nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peek {
    /// Scans counted this period (0: no counter yet).
    pub used: u64,
    /// When the counter expires; `None` without one (or one that never expires).
    pub reset_at: Option<UnixSecs>,
    pub slot_ms: Option<UnixMillis>,
    pub grant: u64,
}

/// A count read as the subject stands after it (no pacing slot known).
impl From<Count> for Peek {
    fn from(count: Count) -> Self {
        Self {
            used: count.used,
            reset_at: Some(count.reset_at),
            slot_ms: None,
            grant: count.grant,
        }
    }
}
