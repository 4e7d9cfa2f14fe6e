//! Switches that bring past bugs back, one at a time, for the simulators to find. Only the
//! `testing` feature compiles this module; a switch is on only for the thread that set it.

/// A past bug, named after what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// A scan accepted unmetered and then refused by the queue has a count refunded anyway.
    RefundOfUnsentCount,
    /// A retry taking over an abandoned attempt queues its job under a fresh `scanId`.
    TakeOverUnderFreshId,
    /// A keyed first attempt whose count may still land goes on unmetered.
    UnknownCountQueuedUnmetered,
    /// A failed connect is reported as a command sent and not answered.
    ConnectErrorAsUnanswered,
    /// A client that disconnects drops its scan wherever it stands.
    DisconnectDropsScan,
    /// A scan refused after it was counted is refunded at its subject only, not its levels.
    LevelNotRefunded,
    /// A keyed attempt's levels are refunded unguarded by its record, losing counts it never made.
    LevelRefundUnguarded,
    /// A re-run after a lost lease reuses its last run's token, so repeats the attempt number.
    SameTokenAfterLostLease,
    /// The consumer acks a job without waiting until its done marker reached the replicas.
    DoneNotAwaitedBeforeAck,
    /// A stalled marker renewal stops its scan only when the call gives up, maybe after expiry.
    StopWaitsForStalledRenewal,
    /// With `VALKEY_WAIT_REPLICAS`, marker renewals are relied on without reaching the replicas.
    RenewalsOnThePrimaryOnly,
    /// An expired, unreleased lease is claimed at once: after a failover, a succeeded scan reruns.
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

    /// A later fix that also closes this bug, switched off with it so the first fix still shows.
    pub const fn covered_by(self) -> Option<Self> {
        match self {
            Self::RenewalsOnThePrimaryOnly => Some(Self::OrphanClaimedAtOnce),
            _ => None,
        }
    }

    /// The bug whose variant is `name`; an unknown one is an error, not a run with no bug on.
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

const fn join<const A: usize, const B: usize, const N: usize>(
    a: [Bug; A],
    b: [Bug; B],
) -> [Bug; N] {
    assert!(A + B == N, "the lengths add up");
    let mut out = [Bug::RefundOfUnsentCount; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < A { a[i] } else { b[i - A] };
        i += 1;
    }
    out
}

thread_local! {
    static ACTIVE: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

/// Turns `bug` on (or every switch off) for the calling thread.
pub fn set(bug: Option<Bug>) {
    ACTIVE.with(|a| a.set(bug));
}

/// Whether `bug` is on for this thread, itself or as a later fix covering the bug switched on.
pub fn on(bug: Bug) -> bool {
    ACTIVE
        .with(|a| a.get())
        .is_some_and(|active| active == bug || active.covered_by() == Some(bug))
}
