//! What an operator sees of one level above the subject: the `level` lines of `inspect --ip` and
//! the report of `inspect --network`.

use serde::Serialize;

use super::valkey_admin::Snapshot;
use super::{aligned, grant_row, limit_row, rfc3339};
use crate::config::Config;
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
