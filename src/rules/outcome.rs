//! What a metered scan request came to ([`Exit`]), the one record the gate hands the meter: what
//! the store made of it and its [`Outcome`], whose metric and help text are here. Every outcome
//! name the meter writes comes from a variant, so adding one is one line of the table below, which
//! gives its metric, help text and place in [`Outcome::ALL`].

use std::time::Duration;

use crate::rules::decide::Tier;
use crate::rules::delay::SleepLease;
use crate::rules::level::LevelName;
use crate::rules::scope::Scope;
use crate::rules::trace::TraceId;
use crate::rules::unix::UnixMillis;

/// What the store made of a scan request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metered {
    /// `delay`: the whole delay owed (or, in shadow mode, would be); `level`: whose counter set it.
    Counted {
        tier: Tier,
        reminder: bool,
        delay: Duration,
        shadow: bool,
        level: LevelName,
    },
    StoreFailed,
    /// No count of its own stands: a repeat of a key, or a count taken back (backlog full).
    Uncounted,
}

/// What one scan request that reached the store came to; bad input is never metered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub scope: Scope,
    pub outcome: Outcome,
    /// Beside the outcome: a refused scan's counters still say whether it was counted.
    pub metered: Metered,
    /// The request's instant: the line's `Timestamp`.
    pub at: UnixMillis,
    /// What the sleep leases answered, if the scan asked for one (an over-quota scan that would
    /// sleep).
    pub sleep_lease: Option<SleepLease>,
    /// The request's trace: its EMF lines carry it as the property `traceId`, not a dimension.
    pub trace: Option<TraceId>,
}

macro_rules! outcomes {
    ($($(#[$doc:meta])* $variant:ident => $metric:literal, $help:literal;)+) => {
        /// How a metered request ended, as its requests metric names it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Outcome {
            $($(#[$doc])* $variant,)+
        }

        impl Outcome {
            /// Every outcome, in declaration order: `ALL[o.index()] == o`.
            pub const ALL: [Self; [$(Self::$variant),+].len()] = [$(Self::$variant),+];

            /// The counter each request of this outcome adds 1 to.
            pub const fn requests_metric(self) -> &'static str {
                match self {
                    $(Self::$variant => $metric,)+
                }
            }

            /// What [`Outcome::requests_metric`] counts, for its `# HELP` line.
            pub const fn help(self) -> &'static str {
                match self {
                    $(Self::$variant => $help,)+
                }
            }
        }
    };
}

outcomes! {
    /// Accepted within the quota, or decided in shadow mode (nobody waited).
    Within => "stella_quota_requests_within_total", "Scans accepted within the daily quota.";
    Soft => "stella_quota_requests_soft_total", "Scans accepted in the soft window (soft delay).";
    Hard => "stella_quota_requests_hard_total",
        "Scans accepted beyond the soft window (hard delay).";
    Unmetered => "stella_quota_requests_unmetered_total",
        "Scans accepted without a count: the quota store did not answer (fail-open).";
    BacklogFull => "stella_quota_requests_backlog_full_total",
        "Scans refused with 503 backlog_full.";
    StoreUnavailable => "stella_quota_requests_store_unavailable_total",
        "Scans refused with 503 store_unavailable (fail-closed, or a keyed scan whose count is unknown).";
    QueueUnavailable => "stella_quota_requests_queue_unavailable_total",
        "Scans refused with 503 queue_unavailable.";
    /// A repeat of an `Idempotency-Key` (replayed, 409 or 422), not counted again.
    Repeat => "stella_quota_requests_repeat_total",
        "Repeats of an Idempotency-Key answered from its record (not counted again).";
}

impl Outcome {
    /// The outcome of an answered request (a 202, or a repeat's replay, 409 or 422).
    pub const fn answered(metered: Metered) -> Self {
        match metered {
            Metered::Counted { shadow: true, .. } => Self::Within,
            Metered::Counted { tier, .. } => match tier {
                Tier::Within => Self::Within,
                Tier::Soft => Self::Soft,
                Tier::Hard => Self::Hard,
            },
            Metered::StoreFailed => Self::Unmetered,
            Metered::Uncounted => Self::Repeat,
        }
    }

    /// Its position in [`Outcome::ALL`] and the meter's per-outcome arrays.
    pub const fn index(self) -> usize {
        self as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer's outcome is its tier's; shadow is within; uncounted, a repeat or unmetered.
    #[test]
    fn outcomes() {
        let counted = |tier, shadow| Metered::Counted {
            tier,
            reminder: false,
            delay: Duration::ZERO,
            shadow,
            level: LevelName::Subject,
        };
        let answered = Outcome::answered;
        assert_eq!(answered(counted(Tier::Within, false)), Outcome::Within);
        assert_eq!(answered(counted(Tier::Soft, false)), Outcome::Soft);
        assert_eq!(answered(counted(Tier::Hard, false)), Outcome::Hard);
        assert_eq!(answered(counted(Tier::Hard, true)), Outcome::Within);
        assert_eq!(answered(Metered::StoreFailed), Outcome::Unmetered);
        assert_eq!(answered(Metered::Uncounted), Outcome::Repeat);
    }

    /// Every outcome has its own requests metric, named `stella_quota_requests_<word>_total`, and a help text.
    #[test]
    fn names() {
        let mut seen = std::collections::BTreeSet::new();
        for o in Outcome::ALL {
            let word = o
                .requests_metric()
                .strip_prefix("stella_quota_requests_")
                .and_then(|r| r.strip_suffix("_total"))
                .unwrap_or_else(|| panic!("{o:?}"));
            assert!(word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
            assert!(seen.insert(word), "{word} twice");
            assert!(o.help().ends_with('.'), "{o:?}");
        }
    }
}
