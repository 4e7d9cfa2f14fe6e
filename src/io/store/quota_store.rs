//! The request path's store, as one narrow trait: [`QuotaStore`], the
//! arguments of its calls; a failed call is a [`SendError`], which says
//! whether it may still run. The Valkey and in-memory stores implement it.

use std::future::Future;
use std::time::Duration;

use uuid::Uuid;

use crate::config::ResetPolicy;
pub use crate::io::connection::SendError;
use crate::rules::count::{LevelCount, Peek, Tally};
use crate::rules::delay::{Bed, BedAsk, LoneBed};
use crate::rules::key::QuotaKey;
use crate::rules::level::Level;
use crate::rules::pace::Paced;
use crate::rules::record::{Claim, Claimed, Field, RecordError};
use crate::rules::unix::{UnixMillis, UnixSecs};

/// One count request: which subject (and which levels above it), and the
/// expiry a new counter gets.
#[derive(Debug, Clone, Copy)]
pub struct CountArgs<'a> {
    pub key: &'a QuotaKey,
    /// The levels above the subject ([`crate::rules::level`]), counted with
    /// it; the answer has a [`LevelCount`] for each, in this order.
    pub levels: &'a [Level],
    /// The expiry a counter without one gets (`EXPIREAT … NX`).
    pub period_end: UnixSecs,
    pub now: UnixSecs,
    /// `QUOTA_RESET`: under `utc-day` every period's end is known before
    /// its first scan, so a store need not read a level's back, nor give a
    /// grant its expiry (`grant` did).
    pub reset: ResetPolicy,
}

/// One pacing step ([`crate::rules::pace::next_start`]): the subject's line, and
/// the lines of the levels above it.
#[derive(Debug, Clone, Copy)]
pub struct PaceArgs<'a> {
    pub key: &'a QuotaKey,
    /// The levels' lines; one with no delay (within its limit) holds
    /// nothing back.
    pub levels: &'a [PaceLane<'a>],
    /// The record of a keyed scan, to note its delay in.
    pub record: Option<&'a str>,
    /// When the scan arrived.
    pub arrival_ms: UnixMillis,
    /// The subject's tier delay (0: within its limit, not a line it waits in).
    pub delay_ms: u64,
    /// The longest delay that may be given (`QUOTA_MAX_BACKLOG_MS`).
    pub max_backlog_ms: u64,
    /// The counter's expiry: the slot key expires with it.
    pub reset_at: UnixSecs,
    /// A bed to sleep in, asked in the same step (`None`: the scan will
    /// not sleep, as in `defer` mode).
    pub bed: Option<BedAsk>,
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

/// One refund: a count of the period that ends at `period_end`, one at
/// each of `levels` (each of its own period), and a keyed scan's record if
/// it still names `scan_id`: a keyed refund that finds the record gone or
/// another attempt's takes back nothing, at no level.
#[derive(Debug, Clone, Copy)]
pub struct Refund<'a> {
    pub key: &'a QuotaKey,
    pub period_end: UnixSecs,
    /// The levels above the subject to take a count back from, and the
    /// period each counted in.
    pub levels: &'a [(&'a QuotaKey, UnixSecs)],
    /// The record's key and the scanId it must still name.
    pub record: Option<(&'a str, Uuid)>,
    /// The in-memory store's clock (Valkey uses its own).
    pub now: UnixSecs,
}

/// One record update: `fields` set on `record`.
#[derive(Debug, Clone, Copy)]
pub struct RecordUpdate<'a> {
    pub record: &'a str,
    pub fields: &'a [Field],
    /// The in-memory store's clock (Valkey uses its own).
    pub now: UnixSecs,
}

/// One take-over of a `pending` record whose lease ran out.
#[derive(Debug, Clone, Copy)]
pub struct TakeOver<'a> {
    pub record: &'a str,
    /// The lease the record must still hold: the one seen.
    pub expected_until_ms: UnixMillis,
    /// The new lease.
    pub lease_until_ms: UnixMillis,
    /// The in-memory store's clock (Valkey uses its own).
    pub now: UnixSecs,
}

/// A count that failed: the subject's error, and what became of each
/// level above it when that is known apart from the subject's fate.
#[derive(Debug)]
pub struct CountFailed {
    pub error: SendError,
    /// `None`: every level shared the subject's request, and so its fate
    /// (standalone, in memory, or a wait given up on from outside). `Some`:
    /// each level's own, in the order asked (a cluster, where each level
    /// is a request of its own to its own node: one may have counted while
    /// the subject's failed, or never have been sent).
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

/// For the operator tools' direct commands (off the request path, where
/// nothing is settled after a failure).
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

/// The request path's store.
pub trait QuotaStore: Send + Sync + 'static {
    /// Starts connecting in the background, on the current runtime, so the
    /// first request finds a connection. A no-op for stores without one.
    fn warm_up(&self) {}

    /// Whether the store answers a command within `within` now: `serve`'s
    /// `GET /readyz`. A store in this process always does.
    fn ready(&self, within: Duration) -> impl Future<Output = Result<(), SendError>> + Send {
        let _ = within;
        std::future::ready(Ok(()))
    }

    /// Whether every call bounds its own wait (each command within the
    /// store timeout), so the gate need not arm a second timer around it;
    /// `false` for a store that may wait unbounded, which the gate bounds.
    fn bounds_itself(&self) -> bool;

    /// INCR the counter, give it `period_end` if it has no expiry, write the
    /// first-seen key if missing, and read the counter's expiry back.
    /// At each level of `args.levels` too: `INCR` and its expiry, in the
    /// same round trip (standalone: one request, one fate). A failed count
    /// says what became of each level where that differs from the
    /// subject's fate ([`CountFailed::levels`]).
    fn count(&self, args: CountArgs<'_>)
    -> impl Future<Output = Result<Tally, CountFailed>> + Send;

    /// Reads the counter, its expiry, the pacing slot and the grant in one
    /// round trip, writing nothing (`GET /quota`).
    fn peek(
        &self,
        key: &QuotaKey,
        now: UnixSecs,
    ) -> impl Future<Output = Result<Peek, SendError>> + Send;

    /// Reads each of `keys` as [`Self::peek`] does, in one round trip (the
    /// levels above a subject, for `GET /quota` and `inspect`).
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

    /// For a keyed scan: if `claim.record` exists, return it and count
    /// nothing (at no level); else write it (`pending`) and count, at its
    /// levels too, atomically where the store can (standalone, in memory).
    fn count_keyed(
        &self,
        args: CountArgs<'_>,
        claim: &Claim,
    ) -> impl Future<Output = Result<Claimed, CountFailed>> + Send;

    /// One pacing step ([`crate::rules::pace::next_slot`]). `Full` changes nothing: the caller
    /// refunds the count with its next call. A refund inside the step would
    /// be wrong when the caller timed out waiting for it and accepted the
    /// scan anyway (a late step would then uncount a queued scan).
    fn pace(&self, args: PaceArgs<'_>) -> impl Future<Output = Result<Paced, SendError>> + Send;

    /// Asks for a bed alone ([`crate::rules::delay::take_bed`]): where no
    /// pacing step can carry the ask (`QUOTA_PACING=off`; a cluster, whose
    /// beds live in a slot of their own).
    fn take_bed(&self, bed: LoneBed) -> impl Future<Output = Result<Bed, SendError>> + Send;

    /// Takes back one count of its period (a no-op if the counter is gone or
    /// belongs to a later period), and removes the record if it still names
    /// the scan.
    fn refund(&self, refund: Refund<'_>) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Whether `record` exists: a keyed scan of a subject known to be
    /// refused is still a repeat of its key when it does (one cheap read,
    /// so the refusal memory never hides a saved answer).
    fn has_record(
        &self,
        record: &str,
        now: UnixSecs,
    ) -> impl Future<Output = Result<bool, SendError>> + Send;

    /// Frees a pending record's lease (if a pending record still names
    /// `scan_id`), so a retry need not wait for it: its attempt gave up
    /// without knowing the outcome. A claim that found another attempt's
    /// record frees nothing: that attempt may still be running (the
    /// simulator found a retry taking over a live attempt's scan).
    /// `now`, as in every call, is the in-memory store's clock.
    fn release(
        &self,
        record: &str,
        scan_id: Uuid,
        now: UnixSecs,
    ) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Updates a record: `fields` are set, and the record gets its 24 h
    /// expiry if it has none (a record written here first, because the
    /// claim has not landed yet, still expires).
    fn update_record(
        &self,
        update: RecordUpdate<'_>,
    ) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Takes over a `pending` record whose lease ran out: sets its lease to
    /// `lease_until_ms` if the record still holds `expected_until_ms`.
    /// `false` when another request took it first.
    fn take_over(&self, args: TakeOver<'_>)
    -> impl Future<Output = Result<bool, SendError>> + Send;
}
