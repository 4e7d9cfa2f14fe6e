//! The Valkey store's commands and the reading of their replies, with no I/O.

use redis::Value;

use super::quota_store::{CountArgs, PaceArgs, PaceLane, Refund, SendError};
use crate::config::ResetPolicy;
use crate::io::clock::rfc3339;
use crate::io::connection::{eval, sized_cmd};
use crate::rules::count::{Count, LevelCount, Peek, Tally};
use crate::rules::delay::{
    ASLEEP_KEY, LoneSleepAsk, SLEEP_LEASE_GRACE, SleepLease, sleep_lease_until,
};
use crate::rules::key::QuotaKey;
use crate::rules::pace::Paced;
use crate::rules::unix::{UnixMillis, UnixSecs, duration_ms};

/// `pace.lua` and `take_sleep_lease.lua` call `take_sleep_lease`, defined once in
/// `sleep_lease.lua`.
pub(super) const PACE: &str = concat!(include_str!("sleep_lease.lua"), include_str!("pace.lua"));
const TAKE_SLEEP_LEASE: &str = concat!(
    include_str!("sleep_lease.lua"),
    include_str!("take_sleep_lease.lua")
);
const UNPACE: &str = include_str!("unpace.lua");
pub(super) const REFUND: &str = include_str!("refund.lua");

pub(super) fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

pub(super) fn unexpected(what: &str) -> SendError {
    SendError::Refused(format!("unexpected reply to {what}"))
}

/// Each command sized at once (numbers and words: 48 bytes of room).
fn sized(name: &str, args: usize, key: &str) -> redis::Cmd {
    sized_cmd(name, args, key.len() + 48)
}

/// `EXPIREAT <key> <period end> NX`: an expiry only where there is none.
fn expire_nx(pipe: &mut redis::Pipeline, key: &str, period_end: UnixSecs) {
    pipe.add_command(sized("EXPIREAT", 4, key))
        .arg(key)
        .arg(period_end.get())
        .arg("NX")
        .ignore();
}

/// The subject's count, answering `[used, expiry, grant]`. Under `rolling` a grant made before the
/// period's first scan gets the counter's expiry here; under `utc-day` `grant` gave it one itself.
pub(super) fn subject_commands(pipe: &mut redis::Pipeline, args: &CountArgs<'_>) {
    let key = args.key;
    // Plain `INCR`, not the `INCRBY 1` `pipe().incr` sends: one argument less for Valkey to parse.
    pipe.add_command(sized("INCR", 2, &key.counter))
        .arg(&key.counter);
    expire_nx(pipe, &key.counter, args.period_end);
    pipe.add_command(sized("SET", 7, &key.first_seen))
        .arg(&key.first_seen)
        .arg(rfc3339(args.now.get()))
        .arg("EXAT")
        .arg(args.period_end.get())
        .arg("NX")
        .ignore()
        .add_command(sized("EXPIRETIME", 2, &key.counter))
        .arg(&key.counter);
    if args.reset == ResetPolicy::Rolling {
        expire_nx(pipe, &key.grant, args.period_end);
    }
    pipe.add_command(sized("GET", 2, &key.grant))
        .arg(&key.grant);
}

/// A level's count: `INCR`, its expiry if it has none, and under `rolling` `EXPIRETIME` (under
/// `utc-day` its period ends with the subject's). No grant key is read: a level's grant is held in
/// its counter (`ops/grant_level.lua`), so the count reads used − granted.
pub(super) fn level_commands(pipe: &mut redis::Pipeline, key: &QuotaKey, args: &CountArgs<'_>) {
    pipe.add_command(sized("INCR", 2, &key.counter))
        .arg(&key.counter);
    expire_nx(pipe, &key.counter, args.period_end);
    if args.reset == ResetPolicy::Rolling {
        pipe.add_command(sized("EXPIRETIME", 2, &key.counter))
            .arg(&key.counter);
    }
}

/// How many replies [`level_commands`] answers: `EXPIRETIME`'s too under `rolling`.
pub(super) fn level_width(reset: ResetPolicy) -> usize {
    1 + usize::from(reset == ResetPolicy::Rolling)
}

/// One count from its `[used, expiry, grant]` reply, read at `now`.
pub(super) fn count_of(reply: &[Value], now: UnixSecs) -> Result<Count, SendError> {
    match reply {
        [used, reset_at, grant] => Ok(Count {
            used: u64::try_from(int(used)).map_err(|_| unexpected("count"))?,
            reset_at: UnixSecs(int(reset_at)),
            now,
            grant: u64::try_from(int(grant)).unwrap_or(0),
        }),
        _ => Err(unexpected("count")),
    }
}

/// A level's count from its `[held]` or `[held, expiry]` reply, `period_end` standing in for an
/// expiry not read. The counter holds used − granted: a negative one is a grant not yet used up.
pub(super) fn level_of(
    reply: &[Value],
    period_end: UnixSecs,
    now: UnixSecs,
) -> Result<Count, SendError> {
    let (held, reset_at) = match reply {
        [held] => (int(held), period_end),
        [held, expiry] => (int(held), UnixSecs(int(expiry))),
        _ => return Err(unexpected("a level's count")),
    };
    Ok(Count {
        used: held.max(0).unsigned_abs(),
        reset_at,
        now,
        grant: held.min(0).unsigned_abs(),
    })
}

/// A standalone count's reply: the subject's three replies, then `width` for each level.
pub(super) fn tally(
    reply: &[Value],
    args: &CountArgs<'_>,
    width: usize,
) -> Result<Tally, SendError> {
    let (subject, levels) = reply
        .split_at_checked(3)
        .ok_or_else(|| unexpected("count"))?;
    let subject = count_of(subject, args.now)?;
    let mut levels: Vec<LevelCount> = levels
        .chunks_exact(width)
        .map(|r| level_of(r, args.period_end, args.now).map(Ok))
        .collect::<Result<_, _>>()?;
    in_subject_period(&mut levels, &subject, args);
    Ok(Tally { subject, levels })
}

/// Under `utc-day` a level's period ends with its subject's: one reset instant in every answer.
pub(super) fn in_subject_period(levels: &mut [LevelCount], subject: &Count, args: &CountArgs<'_>) {
    if args.reset == ResetPolicy::UtcDay {
        for level in levels.iter_mut().flatten() {
            level.reset_at = subject.reset_at;
        }
    }
}

/// Where a counter's grant is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantHeld {
    /// Beside the counter: a subject's, read with every count.
    Beside,
    /// Taken off the counter, which holds used − granted: a level's.
    InCounter,
}

/// A read of a counter, answering `[used, expiry, slot, grant]`, changing nothing.
pub(crate) fn peek_commands(pipe: &mut redis::Pipeline, key: &QuotaKey) {
    pipe.cmd("GET")
        .arg(&key.counter)
        .cmd("EXPIRETIME")
        .arg(&key.counter)
        .cmd("GET")
        .arg(&key.slot)
        .cmd("GET")
        .arg(&key.grant);
}

/// A read from its `[used, expiry, slot, grant]` reply.
pub(crate) fn peek_of(reply: &[Value], held: GrantHeld) -> Result<Peek, SendError> {
    let [used, reset_at, slot, grant] = reply else {
        return Err(unexpected("a read"));
    };
    let present = |v: &Value| !matches!(v, Value::Nil);
    let counter = present(used).then(|| int(used));
    let grant = int(grant).max(0);
    let used = match held {
        GrantHeld::Beside => counter.unwrap_or(0),
        GrantHeld::InCounter => counter.map_or(0, |h| h.saturating_add(grant)),
    };
    Ok(Peek {
        used: used.max(0).unsigned_abs(),
        // -1: no expiry; -2: no counter.
        reset_at: counter
            .and(Some(int(reset_at)))
            .filter(|at| *at >= 0)
            .map(UnixSecs),
        slot_ms: present(slot).then(|| UnixMillis(int(slot))),
        grant: grant.unsigned_abs(),
    })
}

/// A pacing step over `lanes` (the first may carry `args.record`) and the sleep lease
/// `args.sleep_ask` asks for.
pub(super) fn pace_script(lanes: &[PaceLane<'_>], args: &PaceArgs<'_>) -> redis::Cmd {
    let mut keys: Vec<&str> = lanes.iter().map(|l| l.key.slot.as_str()).collect();
    keys.extend(args.record);
    if args.sleep_ask.is_some() {
        keys.push(ASLEEP_KEY);
    }
    let mut cmd = eval(PACE, &keys);
    cmd.arg(lanes.len())
        .arg(args.arrival_ms.get())
        .arg(args.max_backlog_ms);
    for lane in lanes {
        cmd.arg(lane.delay_ms).arg(lane.reset_at.get());
    }
    cmd.arg(u8::from(args.record.is_some()));
    match args.sleep_ask {
        Some(ask) => cmd
            .arg(ask.budget_ms)
            .arg(ask.max_asleep)
            .arg(ask.id.to_string())
            .arg(duration_ms(SLEEP_LEASE_GRACE)),
        None => cmd.arg(0).arg(0).arg("").arg(0),
    };
    cmd
}

/// A pacing step's reply: `{1, delay, previous, sleep lease taken, asleep}`, or `{0, retry after,
/// each line's excess…}`; a refusal's `levels_ms` are the lines' after the first, in the order
/// sent.
pub(super) fn paced(reply: &[i64]) -> Paced {
    let ms = |i: usize| u64::try_from(reply.get(i).copied().unwrap_or(0)).unwrap_or(0);
    if reply.first() == Some(&1) {
        let sleep_lease = reply
            .get(3)
            .filter(|taken| **taken >= 0)
            .map(|taken| SleepLease {
                taken: *taken == 1,
                asleep: u32::try_from(ms(4)).unwrap_or(u32::MAX),
            });
        return Paced::Slot {
            delay_ms: ms(1),
            sleep_lease,
        };
    }
    Paced::Full {
        retry_after_ms: ms(1),
        levels_ms: (3..reply.len()).map(ms).collect(),
    }
}

/// A sleep lease asked alone (`take_sleep_lease.lua`).
pub(super) fn take_sleep_lease_script(lone: &LoneSleepAsk) -> redis::Cmd {
    let ask = &lone.ask;
    let mut cmd = eval(TAKE_SLEEP_LEASE, &[ASLEEP_KEY]);
    cmd.arg(lone.arrival.get())
        .arg(sleep_lease_until(lone.arrival, lone.wait_ms, ask.budget_ms).get())
        .arg(ask.max_asleep)
        .arg(ask.id.to_string());
    cmd
}

/// `take_sleep_lease.lua`'s `{taken, asleep}` reply.
pub(super) fn sleep_lease_of(reply: &[i64]) -> Result<SleepLease, SendError> {
    match reply {
        [taken, asleep] => Ok(SleepLease {
            taken: *taken == 1,
            asleep: u32::try_from(*asleep).unwrap_or(u32::MAX),
        }),
        _ => Err(unexpected("a sleep lease")),
    }
}

/// `levels_ms` in `levels`' order: 0 for a level that was not a line, the next `excess` otherwise.
pub(super) fn spread_excess(
    levels: &[PaceLane<'_>],
    excess: impl IntoIterator<Item = u64>,
) -> Vec<u64> {
    let mut lines = excess.into_iter();
    levels
        .iter()
        .map(|l| match l.delay_ms {
            0 => 0,
            _ => lines.next().unwrap_or(0),
        })
        .collect()
}

/// Gives back a slot a refused scan took on one line (cluster mode) if nobody took a later one.
pub(super) fn unpace(slot: &str, taken: i64, previous: i64) -> redis::Cmd {
    let mut cmd = eval(UNPACE, &[slot]);
    cmd.arg(taken).arg(previous);
    cmd
}

/// A refund's script: the subject's count, each of `levels` (standalone: one slot), the record's
/// guard; each counter with its grant key (one holding a grant stays) and any first-seen key.
pub(super) fn refund_script(refund: &Refund<'_>, levels: &[(&QuotaKey, UnixSecs)]) -> redis::Cmd {
    let counters = std::iter::once((refund.key, refund.period_end)).chain(levels.iter().copied());
    let mut keys = Vec::with_capacity(3 + 2 * levels.len());
    let mut periods = Vec::with_capacity(1 + levels.len());
    for (key, period_end) in counters {
        keys.extend([key.counter.as_str(), key.grant.as_str()]);
        let first_seen = !key.first_seen.is_empty();
        if first_seen {
            keys.push(&key.first_seen);
        }
        periods.push((period_end, u8::from(first_seen)));
    }
    keys.extend(refund.record.map(|(r, _)| r));
    let scan_id = refund.record.map(|(_, id)| id.to_string());
    let mut cmd = eval(REFUND, &keys);
    cmd.arg(scan_id.unwrap_or_default()).arg(periods.len());
    for (period_end, first_seen) in periods {
        cmd.arg(period_end.get()).arg(first_seen);
    }
    cmd
}
