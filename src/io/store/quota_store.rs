//! The request path's store, [`QuotaStore`], and its calls' arguments. A `now` argument is the
//! in-memory store's clock; Valkey uses its own.

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use crate::config::ResetPolicy;
pub use crate::io::connection::SendError;
use crate::rules::count::{LevelCount, Peek, Tally};
use crate::rules::delay::{LoneSleepAsk, SleepAsk, SleepLease};
use crate::rules::key::QuotaKey;
use crate::rules::level::Level;
use crate::rules::pace::Paced;
use crate::rules::record::{Claim, Claimed, Field, RecordError};
use crate::rules::unix::{UnixMillis, UnixSecs};

/// One count: the subject, the levels above it, and the expiry a new counter gets.
#[derive(Debug, Clone, Copy)]
pub struct CountArgs<'a> {
    pub key: &'a QuotaKey,
    /// Counted with the subject; the answer has a [`LevelCount`] for each, in this order.
    pub levels: &'a [Level],
    /// The expiry a counter without one gets (`EXPIREAT … NX`).
    pub period_end: UnixSecs,
    pub now: UnixSecs,
    /// `QUOTA_RESET`: under `utc-day` a level's period end is known in advance, never read back.
    pub reset: ResetPolicy,
}

/// One pacing step ([`crate::rules::pace::next_start`]) over the subject's and levels' lines.
#[derive(Debug, Clone, Copy)]
pub struct PaceArgs<'a> {
    pub key: &'a QuotaKey,
    /// The levels' lines; one with no delay (within its limit) holds nothing back.
    pub levels: &'a [PaceLane<'a>],
    /// The record of a keyed scan, to note its delay in.
    pub record: Option<&'a str>,
    pub arrival_ms: UnixMillis,
    /// The subject's tier delay (0: within its limit, not a line it waits in).
    pub delay_ms: u64,
    /// The longest delay that may be given (`QUOTA_MAX_BACKLOG_MS`).
    pub max_backlog_ms: u64,
    /// The counter's expiry: the slot key expires with it.
    pub reset_at: UnixSecs,
    /// A sleep lease to ask for in the same step (`None`: the scan will not sleep, as in `defer`
    /// mode).
    pub sleep_ask: Option<SleepAsk>,
}

impl PaceArgs<'_> {
    /// The subject's own line.
    pub fn subject(&self) -> PaceLane<'_> {
        PaceLane {
            key: self.key,
            delay_ms: self.delay_ms,
            reset_at: self.reset_at,
        }
    }
}

/// A level's line in one pacing step.
#[derive(Debug, Clone, Copy)]
pub struct PaceLane<'a> {
    pub key: &'a QuotaKey,
    /// The level's tier delay (0: within its limit).
    pub delay_ms: u64,
    /// The level counter's expiry: its slot expires with it.
    pub reset_at: UnixSecs,
}

/// One refund: a count of `period_end`'s period, one at each of `levels`, and a keyed scan's
/// record; a keyed refund whose record is gone or another attempt's takes back nothing at all.
#[derive(Debug, Clone, Copy)]
pub struct Refund<'a> {
    pub key: &'a QuotaKey,
    pub period_end: UnixSecs,
    /// The levels to take a count back from, each with the period it counted in.
    pub levels: &'a [(&'a QuotaKey, UnixSecs)],
    /// The record's key and the scanId it must still name.
    pub record: Option<(&'a str, Uuid)>,
    pub now: UnixSecs,
}

/// One record update: `fields` set on `record`.
#[derive(Debug, Clone, Copy)]
pub struct RecordUpdate<'a> {
    pub record: &'a str,
    pub fields: &'a [Field],
    pub now: UnixSecs,
}

/// One take-over of a `pending` record whose lease ran out.
#[derive(Debug, Clone, Copy)]
pub struct TakeOver<'a> {
    pub record: &'a str,
    /// The lease the record must still hold: the one seen.
    pub expected_until_ms: UnixMillis,
    pub lease_until_ms: UnixMillis,
    pub now: UnixSecs,
}

/// A failed count: the subject's error, and each level's fate where it is known apart.
#[derive(Debug)]
pub struct CountFailed {
    pub error: SendError,
    /// `None`: every level shared the subject's fate; `Some`: each level's own (cluster), in order.
    pub levels: Option<Vec<LevelCount>>,
}

impl From<SendError> for CountFailed {
    fn from(error: SendError) -> Self {
        Self {
            error,
            levels: None,
        }
    }
}

/// For the operator tools' commands, off the request path: nothing is settled after a failure.
impl From<redis::RedisError> for SendError {
    fn from(e: redis::RedisError) -> Self {
        if e.is_timeout() {
            Self::Unanswered
        } else {
            Self::Refused(e.to_string())
        }
    }
}

/// A hash that is not a valid record is the store's answer, and final.
impl From<RecordError> for SendError {
    fn from(e: RecordError) -> Self {
        Self::Refused(e.to_string())
    }
}

pub trait QuotaStore: Send + Sync + 'static {
    /// Starts connecting on the current runtime, so the first request finds a connection.
    fn warm_up(&self) {}

    /// Whether the store answers a command within `within` now (`GET /readyz`).
    fn ready(&self, _within: Duration) -> impl Future<Output = Result<(), SendError>> + Send {
        async { Ok(()) }
    }

    /// Whether every call bounds its own wait, so the gate need not arm a second timer around it:
    /// the in-memory store answers at once, and Valkey's [`crate::io::connection::Valkey::send`]
    /// waits within the store timeout.
    fn bounds_itself(&self) -> bool {
        true
    }

    /// INCRs the counter (expiring at `period_end` if it has none), writes the first-seen key if
    /// missing and reads the expiry back; at each of `args.levels` too, in the same round trip.
    fn count(&self, args: CountArgs<'_>)
    -> impl Future<Output = Result<Tally, CountFailed>> + Send;

    /// Reads the counter, its expiry, pacing slot and grant in one round trip, writing nothing.
    fn peek(
        &self,
        key: &QuotaKey,
        now: UnixSecs,
    ) -> impl Future<Output = Result<Peek, SendError>> + Send;

    /// [`Self::peek`] for each of `keys` (the levels above a subject), in one round trip.
    fn peek_levels(
        &self,
        keys: &[QuotaKey],
        now: UnixSecs,
    ) -> impl Future<Output = Result<Vec<Peek>, SendError>> + Send {
        async move {
            let mut peeks = Vec::with_capacity(keys.len());
            for key in keys {
                peeks.push(self.peek(key, now).await?);
            }
            Ok(peeks)
        }
    }

    /// For a keyed scan: if `claim.record` exists, returns it and counts nothing; else writes it
    /// (`pending`) and counts, levels too, atomically where the store can (standalone, in memory).
    fn count_keyed(
        &self,
        args: CountArgs<'_>,
        claim: &Claim,
    ) -> impl Future<Output = Result<Claimed, CountFailed>> + Send;

    /// One pacing step ([`crate::rules::pace::next_start`]). `Full` changes nothing: the caller
    /// refunds, as a step landing after the caller gave up and queued the scan would uncount it.
    fn pace(&self, args: PaceArgs<'_>) -> impl Future<Output = Result<Paced, SendError>> + Send;

    /// Asks for a sleep lease alone ([`crate::rules::delay::take_sleep_lease`]) where no pacing
    /// step can carry the ask (`QUOTA_PACING=off`, or a cluster, whose sleep leases live in a slot
    /// of their own).
    fn take_sleep_lease(
        &self,
        lone: LoneSleepAsk,
    ) -> impl Future<Output = Result<SleepLease, SendError>> + Send;

    /// Takes back one count of its period (none if the counter is gone or of a later period), and
    /// removes the record if it still names the scan.
    fn refund(&self, refund: Refund<'_>) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Whether `record` exists: a keyed scan of a subject known to be refused is still a repeat of
    /// its key, so the refusal memory never hides a saved answer.
    fn has_record(
        &self,
        record: &str,
        now: UnixSecs,
    ) -> impl Future<Output = Result<bool, SendError>> + Send;

    /// Frees a pending record's lease if it still names `scan_id`, so a retry need not wait.
    /// Another attempt's record is never freed: that attempt may still be running.
    fn release(
        &self,
        record: &str,
        scan_id: Uuid,
        now: UnixSecs,
    ) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Sets `fields` on a record, with its expiry if it has none (its claim may not have landed).
    fn update_record(
        &self,
        update: RecordUpdate<'_>,
    ) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Takes over a `pending` record whose lease ran out if it still holds `expected_until_ms`;
    /// `false` when another request took it first.
    fn take_over(&self, args: TakeOver<'_>)
    -> impl Future<Output = Result<bool, SendError>> + Send;
}
