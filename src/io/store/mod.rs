//! Step 4: counting, behind one narrow trait: a [`QuotaStore`] counts, paces, keeps a keyed scan's
//! idempotency record and takes a count back, on Valkey ([`valkey::ValkeyStore`]) or in process
//! with the same semantics ([`memory::MemoryStore`]). Every key of a subject shares its digest as
//! the hash tag, so one subject lives in one cluster slot, which ElastiCache Serverless requires of
//! a multi-key call (key layout: docs/guide.md). Children import each other, never this module.

mod commands;

pub mod memory;
pub mod quota_store;
pub mod valkey;

use uuid::Uuid;

use crate::rules::delay::{Bed, LoneBed};
use crate::rules::unix::UnixSecs;

pub use crate::rules::count::{Count, LevelCount, NoAnswer, Peek, Tally};
pub use crate::rules::key::{
    IDEMPOTENCY_TTL_SECS, KEY_PATTERN, QuotaKey, grant_period_end, period_end, resets_at,
};
pub use crate::rules::pace::Paced;
pub use crate::rules::record::{
    Claim, Claimed, Field, Record, RecordError, RecordField, RecordState,
};
pub use commands::GrantHeld;
pub use quota_store::{
    CountArgs, CountFailed, PaceArgs, PaceLane, QuotaStore, RecordUpdate, Refund, SendError,
    TakeOver,
};

/// The store chosen by `VALKEY_URL`.
#[derive(Clone)]
pub enum AnyStore {
    Memory(memory::MemoryStore),
    Valkey(valkey::ValkeyStore),
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            Self::Memory($s) => $call.await,
            Self::Valkey($s) => $call.await,
        }
    };
}

impl QuotaStore for AnyStore {
    fn warm_up(&self) {
        match self {
            Self::Memory(s) => s.warm_up(),
            Self::Valkey(s) => s.warm_up(),
        }
    }

    fn bounds_itself(&self) -> bool {
        match self {
            Self::Memory(s) => s.bounds_itself(),
            Self::Valkey(s) => s.bounds_itself(),
        }
    }

    async fn ready(&self, within: std::time::Duration) -> Result<(), SendError> {
        dispatch!(self, s => s.ready(within))
    }

    async fn count(&self, args: CountArgs<'_>) -> Result<Tally, CountFailed> {
        dispatch!(self, s => s.count(args))
    }

    async fn peek_levels(&self, keys: &[QuotaKey], now: UnixSecs) -> Result<Vec<Peek>, SendError> {
        dispatch!(self, s => s.peek_levels(keys, now))
    }

    async fn count_keyed(
        &self,
        args: CountArgs<'_>,
        claim: &Claim,
    ) -> Result<Claimed, CountFailed> {
        dispatch!(self, s => s.count_keyed(args, claim))
    }

    async fn peek(&self, key: &QuotaKey, now: UnixSecs) -> Result<Peek, SendError> {
        dispatch!(self, s => s.peek(key, now))
    }

    async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, SendError> {
        dispatch!(self, s => s.pace(args))
    }

    async fn take_bed(&self, bed: LoneBed) -> Result<Bed, SendError> {
        dispatch!(self, s => s.take_bed(bed))
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), SendError> {
        dispatch!(self, s => s.refund(refund))
    }

    async fn has_record(&self, record: &str, now: UnixSecs) -> Result<bool, SendError> {
        dispatch!(self, s => s.has_record(record, now))
    }

    async fn release(&self, record: &str, scan_id: Uuid, now: UnixSecs) -> Result<(), SendError> {
        dispatch!(self, s => s.release(record, scan_id, now))
    }

    async fn update_record(&self, update: RecordUpdate<'_>) -> Result<(), SendError> {
        dispatch!(self, s => s.update_record(update))
    }

    async fn take_over(&self, args: TakeOver<'_>) -> Result<bool, SendError> {
        dispatch!(self, s => s.take_over(args))
    }
}
