//! What a cluster does apart from standalone: each level above a subject lives in its own slot, so
//! it is counted, paced and refunded by its own request, all sent at once, each failing alone.

use redis::Value;

use super::ValkeyStore;
use crate::io::store::commands::{
    level_commands, level_of, pace_script, paced, refund_script, spread_excess, unpace,
};
use crate::io::store::quota_store::{CountArgs, PaceArgs, PaceLane, Refund, SendError};
use crate::rules::count::{LevelCount, NoAnswer};
use crate::rules::pace::Paced;
use crate::rules::record::RecordField;

impl ValkeyStore {
    /// Counts each level in its own request, all at once; a level that fails fails alone.
    pub(super) async fn count_levels(&self, args: &CountArgs<'_>) -> Vec<LevelCount> {
        let counts = args.levels.iter().map(|level| async move {
            let mut pipe = redis::Pipeline::with_capacity(3);
            level_commands(&mut pipe, &level.key, args);
            let reply = self.send::<Vec<Value>>(pipe).await;
            // A reply of the wrong shape is refused: it cannot land.
            reply
                .and_then(|r| level_of(&r, args.period_end, args.now))
                .map_err(|e| NoAnswer {
                    may_land: e.may_land(),
                })
        });
        futures_util::future::join_all(counts).await
    }

    /// A pacing step with each line paced on its own node, all at once; the scan waits for the
    /// latest. Refused on any line, the lines that took a slot give it back ([`unpace`]). Less
    /// strict than standalone's one script: a line's slot moves to its own start, not the scan's,
    /// so a scan another line held back may start within a delay of this line's next scan (each
    /// line still starts its scans one delay apart, so a network's rate holds).
    pub(super) async fn pace_in_cluster(
        &self,
        args: &PaceArgs<'_>,
        levels: &[PaceLane<'_>],
    ) -> Result<Paced, SendError> {
        let lines: Vec<PaceLane<'_>> = std::iter::once(args.subject())
            .chain(levels.iter().copied())
            .filter(|l| l.delay_ms > 0)
            .collect();
        let alone = PaceArgs {
            record: None,
            sleep_ask: None,
            ..*args
        };
        let steps = lines
            .iter()
            .map(|line| self.send::<Vec<i64>>(pace_script(std::slice::from_ref(line), &alone)));
        let replies = futures_util::future::try_join_all(steps).await?;
        let refused = replies
            .iter()
            .filter_map(|r| match paced(r) {
                Paced::Full { retry_after_ms, .. } => Some(retry_after_ms),
                Paced::Slot { .. } => None,
            })
            .max();
        if let Some(retry_after_ms) = refused {
            for (line, reply) in lines.iter().zip(&replies) {
                if let [1, wait, previous, ..] = reply[..] {
                    let taken = args.arrival_ms.get().saturating_add(wait);
                    let _: i64 = self.send(unpace(&line.key.slot, taken, previous)).await?;
                }
            }
            return Ok(Paced::Full {
                retry_after_ms,
                levels_ms: levels_excess(args, &replies),
            });
        }
        let wait = replies.iter().map(|r| r.get(1).copied().unwrap_or(0)).max();
        let delay_ms = u64::try_from(wait.unwrap_or(0)).unwrap_or(0);
        if let Some(record) = args.record {
            let mut cmd = redis::cmd("HSET");
            cmd.arg(record)
                .arg(RecordField::DelayMs.as_str())
                .arg(delay_ms);
            let _: i64 = self.send(cmd).await?;
        }
        // The sleep leases live in a slot of their own: asked once the wait is known.
        Ok(Paced::Slot {
            delay_ms,
            sleep_lease: self.sleep_lease_after(args, delay_ms).await,
        })
    }

    /// A refund in a cluster, where the levels live in other slots.
    pub(super) async fn refund_in_cluster(&self, refund: &Refund<'_>) -> Result<(), SendError> {
        // The subject's answer is the call's. One never sent took nothing back, so no level goes
        // yet (the caller sends it all again); a keyed one takes levels back only as the claim's
        // own (answered, not -2); an unkeyed one takes every level back, whatever its own fate.
        let subject = self.send::<i64>(refund_script(refund, &[])).await;
        let levels_go = match refund.record {
            None => !subject.as_ref().is_err_and(SendError::never_sent),
            Some(_) => subject.as_ref().is_ok_and(|taken| *taken != -2),
        };
        if levels_go {
            let refunds = refund.levels.iter().map(|&(key, period_end)| {
                let level = Refund {
                    key,
                    period_end,
                    levels: &[],
                    record: None,
                    now: refund.now,
                };
                self.send::<i64>(refund_script(&level, &[]))
            });
            let results = futures_util::future::join_all(refunds).await;
            for e in results.into_iter().filter_map(Result::err) {
                tracing::warn!(error = %e, "could not take a level's count back");
            }
        }
        subject.map(drop)
    }
}

/// Each level's own excess in a refused cluster step, in `args.levels`' order: its line's reply
/// (`{0, retry, excess}`, or a slot: 0); a level that was not a line had room.
fn levels_excess(args: &PaceArgs<'_>, replies: &[Vec<i64>]) -> Vec<u64> {
    // The subject's line, when it is one, comes first.
    let lines = replies.iter().skip(usize::from(args.delay_ms > 0));
    let excess = lines.map(|reply| match reply[..] {
        [0, _, excess] => u64::try_from(excess).unwrap_or(0),
        _ => 0,
    });
    spread_excess(args.levels, excess)
}
