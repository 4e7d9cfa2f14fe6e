//! The beds (`QUOTA_MAX_ASLEEP`, see [`crate::rules::delay::Bed`]): how many
//! requests were asleep fleet-wide when a scan asked for a bed
//! (`stella_quota_asleep`, a gauge: plot its maximum), and the scans that
//! found every bed taken and so slept nothing
//! (`stella_quota_beds_full_total`).
//!
//! Only an over-quota scan that would sleep asks, so only its EMF line
//! carries these, on a line of its own after the scan's (the scan's
//! directive is shared by every scan of its outcome).

use crate::rules::delay::Bed;
use crate::rules::scope::Scope;

use super::emf::{self, Line, Unit};

/// Requests asleep fleet-wide, as the beds answered the last scan that asked.
pub const ASLEEP: &str = "stella_quota_asleep";
/// Scans that found every bed taken: their whole delay was deferred.
pub const BEDS_FULL: &str = "stella_quota_beds_full_total";

/// The `metrics` handles and the EMF directive of the bed metrics.
pub(super) struct BedMeter {
    /// Per scope ([`Scope::Ip`], [`Scope::Tid`]): the gauge and the counter.
    handles: [(metrics::Gauge, metrics::Counter); 2],
    directive: String,
}

impl BedMeter {
    pub(super) fn new(namespace: &str) -> Self {
        let handles = Scope::ALL.map(|scope| {
            let scope = scope.as_str();
            (
                metrics::gauge!(ASLEEP, "scope" => scope),
                metrics::counter!(BEDS_FULL, "scope" => scope),
            )
        });
        let metrics = [(ASLEEP, Unit::Count), (BEDS_FULL, Unit::Count)];
        Self {
            handles,
            directive: emf::directive(namespace, "Scope", &metrics),
        }
    }

    /// Records `bed` in Prometheus, and returns its EMF line (for a
    /// request that arrived at `at_ms`).
    pub(super) fn record(&self, scope: Scope, bed: Bed, at_ms: i64) -> String {
        let (asleep, full) = &self.handles[scope.index()];
        asleep.set(f64::from(bed.asleep));
        full.increment(u64::from(!bed.taken));
        let mut line = Line::start(at_ms, &self.directive, "Scope", scope.as_str());
        line.number(ASLEEP, bed.asleep);
        line.number(BEDS_FULL, u64::from(!bed.taken));
        line.finish()
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
