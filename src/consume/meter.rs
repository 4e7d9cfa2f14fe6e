//! What the consumer did, as metrics: EMF lines on stdout (unless `--no-emf`) and Prometheus with
//! `--metrics-listen`, each event recorded once through the `metrics` facade. Dimensions: `Source`,
//! plus `Lane` for lateness and backlog; never a scanId, digest or image.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::io::meter::emf::{Doc, Emf, Handles, Sink};
use crate::io::stdout::LineWriter;
use crate::rules::job::Lane;

// What each counts: [`ConsumeMeter::describe`].
pub const STARTED: &str = "stella_consumer_jobs_started_total";
pub const SUCCEEDED: &str = "stella_consumer_jobs_succeeded_total";
pub const FAILED: &str = "stella_consumer_jobs_failed_total";
pub const DEAD_LETTERED: &str = "stella_consumer_jobs_dead_lettered_total";
/// Acknowledged, not run.
pub const DUPLICATES: &str = "stella_consumer_duplicates_total";
pub const HELD: &str = "stella_consumer_held_jobs";
/// Each also counts as failed.
pub const TIMEOUTS: &str = "stella_consumer_scan_timeouts_total";
pub const LEASES_LOST: &str = "stella_consumer_leases_lost_total";
pub const WAITING: &str = "stella_consumer_waiting_jobs";
pub const CLOCK_SKEW_MS: &str = "stella_consumer_clock_skew_ms";
pub const LATENESS_MS: &str = "stella_consumer_lateness_ms";

/// [`LATENESS_MS`]'s buckets: a consumer keeping up starts within ms; seconds mean too few run slots.
pub const LATENESS_BUCKETS_MS: [f64; 10] = [
    1.0, 5.0, 10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0, 30000.0,
];

/// One thing that happened to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Started { lateness_ms: i64, lane: Lane },
    Succeeded,
    Failed,
    DeadLettered,
    Duplicate,
    TimedOut,
    LeaseLost,
}

impl Event {
    const fn metric(self) -> &'static str {
        match self {
            Self::Started { .. } => STARTED,
            Self::Succeeded => SUCCEEDED,
            Self::Failed => FAILED,
            Self::DeadLettered => DEAD_LETTERED,
            Self::Duplicate => DUPLICATES,
            Self::TimedOut => TIMEOUTS,
            Self::LeaseLost => LEASES_LOST,
        }
    }
}

/// Records events through the `metrics` facade: Prometheus, and an EMF line per event if on.
#[derive(Clone)]
pub struct ConsumeMeter {
    handles: Handles,
    source: &'static str,
    held: Arc<AtomicI64>,
    /// [`WAITING`] per lane, indexed by [`Lane`] (`Within` first).
    waiting: Arc<[AtomicI64; 2]>,
}

/// A due job's place in the backlog of its lane: counted while it lives.
pub struct Waiting {
    meter: ConsumeMeter,
    lane: Lane,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.meter.waiting_by(self.lane, -1);
    }
}

impl ConsumeMeter {
    pub fn new(namespace: &str, source: &'static str, emf: bool) -> Self {
        // A stdout nobody reads loses metric lines, never jobs.
        let sink = emf.then(|| Sink::Background(LineWriter::stdout(), None));
        Self::with_sink(namespace, source, sink)
    }

    /// The same, its EMF lines written to `emf` (none: no EMF lines).
    pub fn with_sink(namespace: &str, source: &'static str, emf: Option<Sink>) -> Self {
        let emf = emf.map(|sink| Emf::new(namespace, sink, &[]));
        let meter = Self {
            handles: Handles::new(emf.as_ref()),
            source,
            held: Arc::default(),
            waiting: Arc::default(),
        };
        // The gauges start at zero, so a quiet lane reads 0, not absent.
        meter.held(0);
        for lane in [Lane::Within, Lane::Over] {
            meter.waiting_by(lane, 0);
        }
        meter
    }

    /// `# HELP` text for Prometheus.
    pub fn describe() {
        metrics::describe_counter!(STARTED, "Jobs handed to the scanner.");
        metrics::describe_counter!(SUCCEEDED, "Hand-offs the scanner took (exit 0, 2xx).");
        metrics::describe_counter!(FAILED, "Hand-offs that failed (retried, or dead-lettered).");
        metrics::describe_counter!(DEAD_LETTERED, "Jobs given up after their last attempt.");
        metrics::describe_counter!(DUPLICATES, "Deliveries of a scan that had already run.");
        metrics::describe_counter!(TIMEOUTS, "Scans stopped at --scan-timeout.");
        metrics::describe_counter!(LEASES_LOST, "Scans stopped because their lease was lost.");
        metrics::describe_gauge!(HELD, "Jobs waiting for their notBefore.");
        metrics::describe_gauge!(WAITING, "Due jobs waiting for a run slot, per lane.");
        metrics::describe_gauge!(CLOCK_SKEW_MS, "Valkey's clock minus this machine's, ms.");
        metrics::describe_histogram!(
            LATENESS_MS,
            metrics::Unit::Milliseconds,
            "Start minus notBefore, per started job."
        );
    }

    /// One more (or one fewer) job waiting for its `notBefore`.
    pub fn held(&self, delta: i64) {
        let now = self.held.fetch_add(delta, Ordering::Relaxed) + delta;
        self.handles
            .gauge(HELD, &[("source", self.source)])
            .set(now as f64);
    }

    /// A due job of `lane` waits for a run slot until the guard drops.
    pub fn waiting(&self, lane: Lane) -> Waiting {
        self.waiting_by(lane, 1);
        Waiting {
            meter: self.clone(),
            lane,
        }
    }

    fn waiting_by(&self, lane: Lane, delta: i64) {
        let now = self.waiting[lane as usize].fetch_add(delta, Ordering::Relaxed) + delta;
        self.handles
            .gauge(WAITING, &self.lane(lane))
            .set(now as f64);
    }

    fn lane(&self, lane: Lane) -> [(&'static str, &'static str); 2] {
        [("source", self.source), ("lane", lane.as_str())]
    }

    /// Records `event` as one EMF line stamped now: its counter, the held gauge, and for a started
    /// job its lateness and its lane's backlog (gauges set again so the line carries them).
    pub fn record(&self, event: Event) {
        let record = || {
            let source = [("source", self.source)];
            self.handles.counter(event.metric(), &source).increment(1);
            self.held(0);
            if let Event::Started { lateness_ms, lane } = event {
                let lateness = self.handles.histogram(LATENESS_MS, &self.lane(lane));
                lateness.record(lateness_ms as f64);
                self.waiting_by(lane, 0);
            }
        };
        self.handles
            .line(Doc::at(crate::io::clock::wall_ms()), record);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::io::meter::emf::Buffer;

    /// A started job's line declares its counter, the held gauge, the
    /// lateness and its lane's backlog, by Source and by Source and Lane.
    #[test]
    fn emf_shape() {
        let out = Buffer::default();
        let meter = ConsumeMeter::with_sink("StellaOps/Quota", "stream", Some(out.sink()));
        meter.held(2);
        let _waiting = meter.waiting(Lane::Over);
        meter.record(Event::Started {
            lateness_ms: 12,
            lane: Lane::Over,
        });
        meter.record(Event::Succeeded);
        let docs = out.documents();
        assert_eq!(docs.len(), 2, "{docs:?}");
        let doc: &Value = &docs[0];
        let cw = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(cw["Dimensions"], json!([["Source"], ["Source", "Lane"]]));
        assert_eq!(doc["Lane"], "over");
        let names: Vec<&str> = cw["Metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["Name"].as_str().unwrap())
            .collect();
        assert_eq!(names, [STARTED, HELD, LATENESS_MS, WAITING]);
        assert_eq!(doc[WAITING], 1);
        assert_eq!(doc[STARTED], 1);
        assert_eq!(doc[HELD], 2);
        assert_eq!(doc[LATENESS_MS], 12);
        assert_eq!(doc["Source"], "stream");
        let done = &docs[1]["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(done["Dimensions"], json!([["Source"]]));
        assert_eq!(docs[1][SUCCEEDED], 1);
    }
}
