//! The beds (`QUOTA_MAX_ASLEEP`, see [`crate::rules::delay::Bed`]): requests asleep fleet-wide
//! when a scan asked for a bed (a gauge: plot its maximum), and scans that found every bed taken.
//! In EMF these go on a line of their own: the scan's directive is shared by its whole outcome.

use crate::rules::delay::Bed;
use crate::rules::scope::Scope;

use super::emf::Handles;

/// Requests asleep fleet-wide, as the beds answered the last scan that asked.
pub const ASLEEP: &str = "stella_quota_asleep";
/// Scans that found every bed taken: their whole delay was deferred.
pub const BEDS_FULL: &str = "stella_quota_beds_full_total";

/// Per scope, the gauge and the counter.
pub(super) struct BedMeter([(metrics::Gauge, metrics::Counter); 2]);

impl BedMeter {
    pub(super) fn new(handles: &Handles) -> Self {
        Self(Scope::ALL.map(|scope| {
            let scope = [("scope", scope.as_str())];
            (
                handles.gauge(ASLEEP, &scope),
                handles.counter(BEDS_FULL, &scope),
            )
        }))
    }

    /// Records what the beds answered a scan of `scope`.
    pub(super) fn record(&self, scope: Scope, bed: Bed) {
        let (asleep, full) = &self.0[scope.index()];
        asleep.set(f64::from(bed.asleep));
        full.increment(u64::from(!bed.taken));
    }

    /// The `# HELP` texts.
    pub(super) fn describe() {
        metrics::describe_gauge!(
            ASLEEP,
            "Requests asleep at once across every gate process (QUOTA_MAX_ASLEEP caps it), as last read."
        );
        metrics::describe_counter!(
            BEDS_FULL,
            "Over-quota scans that found QUOTA_MAX_ASLEEP requests asleep: they slept nothing, their whole delay deferred."
        );
    }
}
