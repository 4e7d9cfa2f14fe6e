//! Every metric the gate publishes: its name, its `# HELP` text, and what one counted request adds
//! to it. The lists the exporters and docs tests read are derived from the types, never rewritten.

use crate::rules::decide::Tier;
use crate::rules::outcome::{Metered, Outcome};

pub const SOFT_HITS: &str = "stella_quota_soft_hits_total";
pub const HARD_HITS: &str = "stella_quota_hard_hits_total";
pub const REMINDERS: &str = "stella_quota_reminders_total";
pub const STORE_ERRORS: &str = "stella_quota_store_errors_total";
pub const ENQUEUE_ERRORS: &str = "stella_quota_enqueue_errors_total";
pub const BACKLOG_REFUSALS: &str = "stella_quota_backlog_refusals_total";
pub const DELAY_MS: &str = "stella_quota_delay_ms";
/// What enforcement would have done in shadow mode; kept apart so enforcement alarms do not page.
pub const SHADOW_SOFT_HITS: &str = "stella_quota_shadow_soft_hits_total";
pub const SHADOW_HARD_HITS: &str = "stella_quota_shadow_hard_hits_total";
/// The shadow counters, carried by every decided line in shadow mode.
pub const SHADOW_COUNTERS: [&str; 2] = [SHADOW_SOFT_HITS, SHADOW_HARD_HITS];
/// Scans from an exempt network or with an exempt token: never counted.
pub const EXEMPT: &str = "stella_quota_exempt_total";
/// `GET /quota` answers: reads that never touch the quota.
pub const CHECKS: &str = "stella_quota_checks_total";
/// Verified tokens naming no account while `QUOTA_JWT_ACCOUNT_CLAIM` is set, counted by `tid`.
pub const TOKENS_WITHOUT_ACCOUNT: &str = "stella_quota_tokens_without_account_total";
/// EMF lines dropped because the output queue was full (`serve` only): stdout slow or gone.
pub const EMF_DROPPED: &str = "stella_quota_emf_dropped_total";
/// Resident memory of the process, in bytes (`serve`'s `/metrics` only).
pub const PROCESS_RSS: &str = "process_resident_memory_bytes";
/// Open file descriptors (`serve`'s `/metrics` only): client connections plus a fixed handful.
pub const PROCESS_OPEN_FDS: &str = "process_open_fds";

/// Requests asleep fleet-wide, as the sleep leases (`QUOTA_MAX_ASLEEP`, see
/// [`crate::rules::delay::SleepLease`]) answered the last scan that asked (a gauge: plot its
/// maximum).
pub const ASLEEP: &str = "stella_quota_asleep";
/// Scans that found every sleep lease taken: their whole delay was deferred.
pub const BEDS_FULL: &str = "stella_quota_beds_full_total";

/// 1 when the quota Valkey's `maxmemory-policy` can evict the gate's keys, else 0; read at start.
pub const STORE_EVICTING: &str = "stella_quota_store_evicting";
/// Keys the quota Valkey evicted (`evicted_keys`), read every `QUOTA_STORE_STATS_INTERVAL_MS`.
pub const STORE_EVICTED_KEYS: &str = "stella_quota_store_evicted_keys_total";
/// The store's own metrics: whether it is evicting, and the keys it evicted.
pub const STORE_METRICS: [&str; 2] = [STORE_EVICTING, STORE_EVICTED_KEYS];

/// The counters every counted request's line carries (0 or 1 each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counter {
    SoftHits,
    HardHits,
    Reminders,
    StoreErrors,
    EnqueueErrors,
    BacklogRefusals,
}

impl Counter {
    /// Every counter, in EMF declaration order.
    pub const ALL: [Self; 6] = [
        Self::SoftHits,
        Self::HardHits,
        Self::Reminders,
        Self::StoreErrors,
        Self::EnqueueErrors,
        Self::BacklogRefusals,
    ];

    pub const fn name(self) -> &'static str {
        COUNTERS[self as usize]
    }

    const fn help(self) -> &'static str {
        match self {
            Self::SoftHits => "Scans over the daily quota, within the soft window (soft delay).",
            Self::HardHits => "Scans beyond the soft window (hard delay).",
            Self::Reminders => {
                "Scans answered with the soft reminder (count at or above QUOTA_WARN_AT)."
            }
            Self::StoreErrors => {
                "Scans the quota store could not count (timeout, error, open breaker)."
            }
            Self::EnqueueErrors => "Scans refused with 503 because the scan queue failed.",
            Self::BacklogRefusals => {
                "Scans refused with 503 backlog_full: the paced delay would exceed QUOTA_MAX_BACKLOG_MS."
            }
        }
    }

    /// What one request adds, by how it left the gate. A shadow decision is no hit: nobody waited.
    pub fn value(self, metered: Metered, outcome: Outcome) -> u64 {
        let counted =
            |t: Tier| matches!(metered, Metered::Counted { tier, shadow: false, .. } if tier == t);
        u64::from(match self {
            Self::SoftHits => counted(Tier::Soft),
            Self::HardHits => counted(Tier::Hard),
            Self::Reminders => matches!(metered, Metered::Counted { reminder: true, .. }),
            Self::StoreErrors => metered == Metered::StoreFailed,
            Self::EnqueueErrors => outcome == Outcome::QueueUnavailable,
            Self::BacklogRefusals => outcome == Outcome::BacklogFull,
        })
    }
}

/// [`SHADOW_COUNTERS`]' values in shadow mode: what enforcement would have counted.
pub(super) fn shadow_values(tier: Tier) -> [u64; 2] {
    [u64::from(tier == Tier::Soft), u64::from(tier == Tier::Hard)]
}

/// Every counter's name, in EMF declaration order: `Counter::ALL`'s.
pub const COUNTERS: [&str; 6] = [
    SOFT_HITS,
    HARD_HITS,
    REMINDERS,
    STORE_ERRORS,
    ENQUEUE_ERRORS,
    BACKLOG_REFUSALS,
];

/// One Count per outcome, in [`Outcome::ALL`] order: `stella_quota_requests_<outcome>_total`.
pub const REQUESTS: [&str; 8] = {
    let mut names = [""; Outcome::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = Outcome::ALL[i].requests_metric();
        i += 1;
    }
    names
};

/// Something metered besides a counted scan: one line, one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An exempt scan, queued uncounted ([`EXEMPT`]).
    Exempt,
    /// A `GET /quota` answer ([`CHECKS`]).
    Check,
    /// A verified token without the account claim ([`TOKENS_WITHOUT_ACCOUNT`]).
    NoAccount,
}

impl Event {
    /// Every event, in declaration order: `ALL[e.index()] == e`.
    pub const ALL: [Self; 3] = [Self::Exempt, Self::Check, Self::NoAccount];

    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its one counter.
    pub const fn metric(self) -> &'static str {
        match self {
            Self::Exempt => EXEMPT,
            Self::Check => CHECKS,
            Self::NoAccount => TOKENS_WITHOUT_ACCOUNT,
        }
    }

    const fn help(self) -> &'static str {
        match self {
            Self::Exempt => {
                "Exempt scans (QUOTA_EXEMPT_NETWORKS or QUOTA_EXEMPT_CLAIM): queued, never counted."
            }
            Self::Check => "GET /quota answers (the quota is read, never spent).",
            Self::NoAccount => {
                "Verified tokens without the QUOTA_JWT_ACCOUNT_CLAIM claim, counted by their tid."
            }
        }
    }
}

/// What is metered on a line of its own, with no outcome: in [`Event::ALL`] order.
pub const EVENTS: [&str; 3] = [
    Event::ALL[0].metric(),
    Event::ALL[1].metric(),
    Event::ALL[2].metric(),
];

/// `# HELP` texts for `GET /metrics`; call once the recorder is installed (earlier ones are lost).
pub fn describe() {
    let others = [
        (
            SHADOW_SOFT_HITS,
            "Shadow mode: scans enforcement would have given the soft delay (none was given).",
        ),
        (
            SHADOW_HARD_HITS,
            "Shadow mode: scans enforcement would have given the hard delay (none was given).",
        ),
        (
            EMF_DROPPED,
            "EMF lines dropped because standard output was not read fast enough.",
        ),
    ];
    let counters = Counter::ALL
        .map(|c| (c.name(), c.help()))
        .into_iter()
        .chain(Outcome::ALL.map(|o| (o.requests_metric(), o.help())))
        .chain(Event::ALL.map(|e| (e.metric(), e.help())))
        .chain(
            super::levels::LEVEL_METRICS
                .into_iter()
                .zip(super::levels::LevelHit::HELP),
        )
        .chain(others);
    for (name, help) in counters {
        metrics::describe_counter!(name, help);
    }
    metrics::describe_gauge!(
        ASLEEP,
        "Requests asleep at once across every gate process (QUOTA_MAX_ASLEEP caps it), as last read."
    );
    metrics::describe_counter!(
        BEDS_FULL,
        "Over-quota scans that found QUOTA_MAX_ASLEEP requests asleep: they slept nothing, their whole delay deferred."
    );
    metrics::describe_gauge!(
        PROCESS_RSS,
        metrics::Unit::Bytes,
        "Resident memory of the process (VmRSS), sampled at each scrape."
    );
    metrics::describe_gauge!(
        PROCESS_OPEN_FDS,
        "Open file descriptors: the open client connections plus a fixed handful."
    );
    metrics::describe_histogram!(
        DELAY_MS,
        metrics::Unit::Milliseconds,
        "Delay owed per decided scan (slept plus deferred), in milliseconds."
    );
    describe_store();
}

/// `# HELP` texts for the store's own metrics.
pub fn describe_store() {
    metrics::describe_gauge!(
        STORE_EVICTING,
        "1 when the quota Valkey's maxmemory-policy can evict the gate's keys, 0 for noeviction (read at start)."
    );
    metrics::describe_counter!(
        STORE_EVICTED_KEYS,
        "Keys the quota Valkey evicted (its evicted_keys), read every QUOTA_STORE_STATS_INTERVAL_MS."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived lists hold the types' names in their order.
    #[test]
    fn lists_follow_the_types() {
        assert_eq!(Counter::SoftHits.name(), SOFT_HITS);
        assert_eq!(Counter::BacklogRefusals.name(), BACKLOG_REFUSALS);
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(REQUESTS[i], o.requests_metric());
        }
        for (i, e) in Event::ALL.iter().enumerate() {
            assert_eq!(e.index(), i);
            assert_eq!(EVENTS[i], e.metric());
        }
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }
}
