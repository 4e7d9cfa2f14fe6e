//! The settings that are one of a few words (`QUOTA_FAIL_MODE=open`). Pure and below
//! [`crate::config`], so the rules that read a setting import it from here.

words! {
    /// When a counter expires.
    ResetPolicy {
        /// At the next 00:00 UTC after the first scan.
        UtcDay = "utc-day",
        /// 24 hours after the first scan.
        Rolling = "rolling",
    }

    /// Whether the decisions are carried out.
    Mode {
        Enforce = "enforce",
        /// A dry run: counted, decided and metered, but nobody waits or takes a pacing slot.
        Shadow = "shadow",
    }

    /// What to do when the quota store cannot answer in time.
    FailMode {
        /// Accept the scan without delay and say the quota was not checked.
        Open = "open",
        Closed = "closed",
    }

    /// Where over-quota delay is spent.
    DelayMode {
        /// Sleep in the handler as far as the gateway allows; defer the rest onto the job.
        Sleep = "sleep",
        /// Answer at once; the whole delay holds the queued job back.
        Defer = "defer",
    }

    /// Whether a subject's over-quota scans are spread out one delay apart.
    Pacing {
        /// `slot_k = max(arrival_k, slot_(k-1)) + D(tier_k)`: a burst is spread out.
        On = "on",
        /// The seed's fixed per-request delays.
        Off = "off",
    }

    /// What the start does when the store's `maxmemory-policy` can evict the gate's keys.
    OnEviction {
        Warn = "warn",
        Refuse = "refuse",
    }

    /// How a connection to the quota Valkey authenticates.
    ValkeyAuth {
        Password = "password",
        Iam = "iam",
    }
}
