//! Switches that bring past bugs back, one at a time, so the simulators
//! (`tests/it/sim.rs` for the gate, `tests/it/consume_sim.rs` for the consumer)
//! can show that they find each of them.
//!
//! Only the `testing` feature compiles this module, and only the test
//! harness (`testkit`, a dev-dependency) turns the feature on: a release
//! build has no switch, `crate::bug!` is `false` there and every guarded
//! branch compiles away. Even with the feature, every switch is off unless a
//! test turns one on, for its own thread only (the simulator runs each
//! schedule on a current-thread runtime).

/// A past bug, named after what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// A scan accepted unmetered (its count never sent) and then refused
    /// by the queue has a count refunded anyway.
    RefundOfUnsentCount,
    /// A retry that takes over an abandoned attempt queues its job under a
    /// fresh `scanId` instead of the record's.
    TakeOverUnderFreshId,
    /// A keyed first attempt whose count may still land goes on unmetered,
    /// its job labelled uncounted.
    UnknownCountQueuedUnmetered,
    /// A failed connect is reported as a command sent and not answered.
    ConnectErrorAsUnanswered,
    /// A client that disconnects drops its scan wherever it stands.
    DisconnectDropsScan,
    /// A scan refused after it was counted is refunded at its subject
    /// only: the levels above it (its networks) keep the count.
    LevelNotRefunded,
    /// A keyed attempt's levels are refunded apart from its subject, not
    /// guarded by its record: a level loses a count the attempt never
    /// made, or one a retry took over and queued (the simulator found it:
    /// seeds 15, 74 and 163).
    LevelRefundUnguarded,
    /// The consumer runs a scan again under the token of its last run, so
    /// a re-run after a lost lease whose marker that token still holds is
    /// given the same attempt number again.
    SameTokenAfterLostLease,
    /// The consumer tries its done marker once, does not wait until it is
    /// recorded (on the replicas), and acks the job all the same.
    DoneNotAwaitedBeforeAck,
    /// A running scan whose marker renewal stalls is stopped only when the
    /// stalled call gives up, which may be after its marker expired.
    StopWaitsForStalledRenewal,
    /// With `VALKEY_WAIT_REPLICAS`, a running scan's marker renewals are
    /// relied on without reaching the replicas (brought back with
    /// [`Bug::OrphanClaimedAtOnce`], which covers it too).
    RenewalsOnThePrimaryOnly,
    /// A new attempt claims a scan whose last attempt's lease ran out
    /// unreleased at once: after a failover lost a live attempt's renewals
    /// and done marker, the scan it ran to success runs again.
    OrphanClaimedAtOnce,
}

impl Bug {
    /// Every switch: the gate's, then the consumer's.
    pub const ALL: [Self; 12] = join(Self::GATE, Self::CONSUMER);

    /// The gate's, which `tests/it/sim.rs` finds.
    pub const GATE: [Self; 7] = [
        Self::RefundOfUnsentCount,
        Self::TakeOverUnderFreshId,
        Self::UnknownCountQueuedUnmetered,
        Self::ConnectErrorAsUnanswered,
        Self::DisconnectDropsScan,
        Self::LevelNotRefunded,
        Self::LevelRefundUnguarded,
    ];

    /// The consumer's, which `tests/it/consume_sim.rs` finds.
    pub const CONSUMER: [Self; 5] = [
        Self::SameTokenAfterLostLease,
        Self::DoneNotAwaitedBeforeAck,
        Self::StopWaitsForStalledRenewal,
        Self::RenewalsOnThePrimaryOnly,
        Self::OrphanClaimedAtOnce,
    ];
}

/// `a` then `b`, as one array (`N` is their lengths' sum).
const fn join<const A: usize, const B: usize, const N: usize>(
    a: [Bug; A],
    b: [Bug; B],
) -> [Bug; N] {
    assert!(A + B == N, "the lengths add up");
    let mut out = [Bug::RefundOfUnsentCount; N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - A];
        i += 1;
    }
    out
}

impl Bug {
    /// A later fix that closes this bug too, and is switched back off with
    /// it, so the simulator still shows that the first fix matters: the
    /// one-more-lease wait after a lease ran out unreleased also keeps a
    /// running scan whose renewals a failover lost.
    pub const fn covered_by(self) -> Option<Self> {
        match self {
            Self::RenewalsOnThePrimaryOnly => Some(Self::OrphanClaimedAtOnce),
            _ => None,
        }
    }

    /// The bug whose variant is `name` (as `SIM_BUG` names it); an unknown
    /// name is an error that lists the known ones, so a misspelt switch
    /// never runs with no bug on.
    pub fn named(name: &str) -> Result<Self, String> {
        let names = Self::ALL.map(|b| format!("{b:?}"));
        match names.iter().position(|n| n == name) {
            Some(i) => Ok(Self::ALL[i]),
            None => Err(format!(
                "no past bug is named {name:?}; the known ones: {}",
                names.join(", ")
            )),
        }
    }
}

thread_local! {
    static ACTIVE: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Turns `bug` on (or every switch off) for the calling thread.
pub fn set(bug: Option<Bug>) {
    ACTIVE.with(|a| a.set(bug));
}

/// Whether `bug` is switched on for this thread: itself, or as the later
/// fix that also covers the bug switched on ([`Bug::covered_by`]).
pub fn on(bug: Bug) -> bool {
    ACTIVE
        .with(|a| a.get())
        .is_some_and(|active| active == bug || active.covered_by() == Some(bug))
}
