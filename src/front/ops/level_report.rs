//! What an operator sees of one level above the subject: the `level` lines of `inspect --ip` and
//! the report of `inspect --network`.

use serde::Serialize;

use super::valkey_admin::Snapshot;
use crate::config::Config;
use crate::io::store::resets_at;
use crate::rules::level::Level;
use crate::rules::unix::UnixSecs;

/// What `inspect` shows of one level (also its `--json` form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LevelReport {
    /// The level's name (`v4/24`, `anon`), as `quota.level` says it.
    pub level: String,
    pub key: String,
    /// Whether the counter exists this period.
    pub exists: bool,
    pub used: u64,
    /// The ceiling with the grant added.
    pub limit: u32,
    pub base_limit: u32,
    pub grant: u64,
    pub grant_expires_at: Option<String>,
    pub remaining: u64,
    /// RFC 3339, UTC; with no counter, when one opened now would expire.
    pub reset_at: Option<String>,
    /// How far ahead the pacing slot is, in ms.
    pub backlog_ms: u64,
}

impl LevelReport {
    /// The report of `level` from a store snapshot read at `now`.
    pub fn new(config: &Config, level: &Level, snapshot: Option<&Snapshot>, now: UnixSecs) -> Self {
        let s = snapshot.cloned().unwrap_or_default();
        let limit = u64::from(level.limits.limit.get()).saturating_add(s.peek.grant);
        Self {
            level: level.name.label(),
            key: level.key.counter.clone(),
            exists: s.counter,
            used: s.peek.used,
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            base_limit: level.limits.limit.get(),
            grant: s.peek.grant,
            grant_expires_at: s.grant_expires_at.map(rfc3339),
            remaining: limit.saturating_sub(s.peek.used),
            reset_at: s.reset_at(config, now),
            backlog_ms: s.backlog_ms(now),
        }
    }

    /// One line: `v4/24: used 3 of 264, remaining 261, resets …`.
    pub fn line(&self) -> String {
        let limit = limit_row(self.limit, self.base_limit, self.grant);
        let reset = self.reset_at.as_deref().unwrap_or("never (reset it)");
        let mut line = format!(
            "{}: used {} of {limit}, remaining {}, resets {reset}",
            self.level, self.used, self.remaining
        );
        if self.backlog_ms > 0 {
            line.push_str(&format!(", backlog {} ms", self.backlog_ms));
        }
        line
    }

    /// The human form of `inspect --network`.
    pub fn render(&self) -> String {
        let unknown = " (no expiry: grant it again)";
        let grant = grant_row(self.grant, self.grant_expires_at.as_deref(), unknown);
        aligned([
            ("level", self.line()),
            ("key", self.key.clone()),
            ("grant", grant),
        ])
    }
}

/// One aligned `label  value` line per row.
pub(super) fn aligned<'a>(rows: impl IntoIterator<Item = (&'a str, String)>) -> String {
    rows.into_iter()
        .map(|(label, value)| format!("{label:<11} {value}\n"))
        .collect()
}

/// A `grant` line: the extra scans and until when (`unknown`: what is said with no expiry).
pub(super) fn grant_row(grant: u64, expires_at: Option<&str>, unknown: &str) -> String {
    match (grant, expires_at) {
        (0, _) => "-".to_owned(),
        (n, Some(at)) => format!("+{n} scans this period, until {at}"),
        (n, None) => format!("+{n} scans{unknown}"),
    }
}

/// A `limit` line: the ceiling, and with a grant what it is made of.
pub fn limit_row(limit: u32, base: u32, grant: u64) -> String {
    match grant {
        0 => limit.to_string(),
        n => format!("{limit} ({base} + {n} granted)"),
    }
}

/// An instant as reports give it: RFC 3339, UTC.
pub(super) fn rfc3339(at: UnixSecs) -> String {
    crate::gate::respond::rfc3339(at.get())
}

impl Snapshot {
    /// When the period ends, as answers report `resetAt`: with no counter, when one opened `now`
    /// would expire; `None` for a counter that (wrongly) never expires.
    pub(super) fn reset_at(&self, config: &Config, now: UnixSecs) -> Option<String> {
        let expires_at = self.peek.reset_at;
        if self.counter && expires_at.is_none() {
            return None;
        }
        Some(rfc3339(resets_at(config.policy.reset, expires_at, now)))
    }

    /// How far ahead of `now` the pacing slot is, in ms: the wait a scan arriving now would add.
    pub(super) fn backlog_ms(&self, now: UnixSecs) -> u64 {
        self.peek.slot_ms.map_or(0, |slot| {
            u64::try_from(slot.get() - now.millis().get()).unwrap_or(0)
        })
    }
}
