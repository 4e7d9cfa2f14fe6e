//! Where a caller's quota stands, and the IETF `RateLimit-Policy` (one policy per level) and
//! `RateLimit` (the one with the fewest remaining) headers written from it.

use crate::config::ResetPolicy;
use crate::io::store::resets_at;
use crate::rules::count::Peek;
use crate::rules::decide::Limits;
use crate::rules::level::{Level, LevelName, PolicyName};
use crate::rules::unix::UnixSecs;

/// The seconds in the policy window the headers advertise.
const WINDOW_SECS: u64 = crate::rules::unix::DAY_SECS.unsigned_abs();

/// A level above the subject and where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelStanding {
    pub name: LevelName,
    pub used: u64,
    pub standing: Standing,
}

impl LevelStanding {
    /// Where `level` stands when its store reads `peek` at `now`.
    pub fn of(level: &Level, peek: &Peek, reset: ResetPolicy, now: UnixSecs) -> Self {
        Self {
            name: level.name,
            used: peek.used,
            standing: Standing::of(Some(peek), level.limits, reset, now),
        }
    }
}

/// `RateLimit-Policy`: one policy per line, `(name, limit)`, as
/// `"daily";q=33;w=86400, "v4-24";q=264;w=86400`.
pub fn policy(lines: impl IntoIterator<Item = (LevelName, u32)>) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(96);
    for (name, limit) in lines {
        let sep = if out.is_empty() { "" } else { ", " };
        let _ = write!(
            out,
            "{sep}\"{}\";q={limit};w={WINDOW_SECS}",
            PolicyName(name)
        );
    }
    out
}

/// `RateLimit` for the policy `name`: `remaining` scans for `seconds_to_reset` more seconds.
pub fn ratelimit(name: LevelName, remaining: u64, seconds_to_reset: u64) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(48);
    let _ = write!(
        out,
        "\"{}\";r={remaining};t={seconds_to_reset}",
        PolicyName(name)
    );
    out
}

/// The line `RateLimit` reports: fewest remaining; on a tie the subject's, then the first level's.
pub fn fewest_remaining(standing: &Standing, levels: &[LevelStanding]) -> (LevelName, Standing) {
    let remaining = |(_, s): &(LevelName, Standing)| s.remaining;
    // `min_by_key` keeps its first argument on a tie: the one found first.
    let fewer =
        |least, l: &LevelStanding| std::cmp::min_by_key(least, (l.name, l.standing), remaining);
    levels.iter().fold((LevelName::Subject, *standing), fewer)
}

/// Where a subject's quota stands, as every answer's quota headers say it (an exempt caller's too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// The daily ceiling, with any grant.
    pub limit: u32,
    pub remaining: u64,
    /// Unix seconds.
    pub reset_at: i64,
    pub seconds_to_reset: u64,
    /// The store did not answer: the whole limit remains, marked `X-Stella-Quota: unavailable`.
    pub unavailable: bool,
}

impl Standing {
    /// Where a subject stands whose store read `peek` at `now` (`None`: the store did not answer).
    pub fn of(peek: Option<&Peek>, limits: Limits, reset: ResetPolicy, now: UnixSecs) -> Self {
        let (limit, used, expiry) = match peek {
            Some(p) => (limits.with_grant(p.grant).limit.get(), p.used, p.reset_at),
            None => (limits.limit.get(), 0, None),
        };
        let reset_at = resets_at(reset, expiry, now);
        Self {
            limit,
            remaining: u64::from(limit).saturating_sub(used),
            reset_at: reset_at.get(),
            seconds_to_reset: u64::try_from(reset_at.get() - now.get()).unwrap_or(0),
            unavailable: peek.is_none(),
        }
    }
}
