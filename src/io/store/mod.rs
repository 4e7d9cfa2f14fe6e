//! Step 4: counting, behind one narrow trait: a [`QuotaStore`] counts, paces, keeps a keyed scan's
//! idempotency record and takes a count back, on Valkey ([`valkey::ValkeyStore`]) or in process
//! with the same semantics ([`memory::MemoryStore`]). Every key of a subject shares its digest as
//! the hash tag, so one subject lives in one cluster slot, which ElastiCache Serverless requires of
//! a multi-key call (key layout: docs/guide.md). Children import each other, never this module.

mod commands;

pub mod memory;
pub mod quota_store;
pub mod valkey;

use std::time::Duration;

use uuid::Uuid;

use crate::rules::delay::{LoneSleepAsk, SleepLease};
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
pub(crate) use commands::{peek_commands, peek_of};
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

/// Forwards each method of [`QuotaStore`] to the chosen store.
macro_rules! dispatch {
    () => {};
    (async fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty; $($rest:tt)*) => {
        async fn $name(&self $(, $arg: $ty)*) -> $ret {
            match self {
                Self::Memory(s) => s.$name($($arg),*).await,
                Self::Valkey(s) => s.$name($($arg),*).await,
            }
        }
        dispatch!($($rest)*);
    };
}

/// Both stores bound their own calls ([`QuotaStore::bounds_itself`]'s default).
impl QuotaStore for AnyStore {
    fn warm_up(&self) {
        if let Self::Valkey(s) = self {
            s.warm_up();
        }
    }

    dispatch! {
        async fn ready(&self, within: Duration) -> Result<(), SendError>;
        async fn count(&self, args: CountArgs<'_>) -> Result<Tally, CountFailed>;
        async fn peek(&self, key: &QuotaKey, now: UnixSecs) -> Result<Peek, SendError>;
        async fn peek_levels(&self, keys: &[QuotaKey], now: UnixSecs)
            -> Result<Vec<Peek>, SendError>;
        async fn count_keyed(&self, args: CountArgs<'_>, claim: &Claim)
            -> Result<Claimed, CountFailed>;
        async fn pace(&self, args: PaceArgs<'_>) -> Result<Paced, SendError>;
        async fn take_sleep_lease(&self, lone: LoneSleepAsk) -> Result<SleepLease, SendError>;
        async fn refund(&self, refund: Refund<'_>) -> Result<(), SendError>;
        async fn has_record(&self, record: &str, now: UnixSecs) -> Result<bool, SendError>;
        async fn release(&self, record: &str, scan_id: Uuid, now: UnixSecs)
            -> Result<(), SendError>;
        async fn update_record(&self, update: RecordUpdate<'_>) -> Result<(), SendError>;
        async fn take_over(&self, args: TakeOver<'_>) -> Result<bool, SendError>;
    }
}
