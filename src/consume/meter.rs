//! What the consumer did, as metrics, in the gate's two forms: an EMF line
//! per event on stdout (through the non-blocking stdout writer, off with
//! `--no-emf`) and the `metrics` facade, rendered as Prometheus text when
//! `--metrics-listen` is given. The dimension is `Source` (`stream`,
//! `sqs`, `stdin`; `lambda` for the consumer function), and for the lateness
//! (the dwell from due to start) and the backlog (due jobs waiting for a run
//! slot) also `Lane` (`within`, `over`); no scanId, digest or image in any
//! metric. The lines are
//! built and written by the gate's one EMF writer ([`crate::io::meter::emf`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::io::meter::emf::{self, Line, Sink, Unit};
use crate::io::stdout::LineWriter;
use crate::rules::job::Lane;

pub const STARTED: &str = "stella_consumer_jobs_started_total";
pub const SUCCEEDED: &str = "stella_consumer_jobs_succeeded_total";
pub const FAILED: &str = "stella_consumer_jobs_failed_total";
pub const DEAD_LETTERED: &str = "stella_consumer_jobs_dead_lettered_total";
/// Deliveries of a scan that had already run: acknowledged, not run.
pub const DUPLICATES: &str = "stella_consumer_duplicates_total";
/// Jobs waiting for their `notBefore` right now.
pub const HELD: &str = "stella_consumer_held_jobs";
/// Scans stopped at `--scan-timeout` (each also counts as failed).
pub const TIMEOUTS: &str = "stella_consumer_scan_timeouts_total";
/// Scans stopped because their marker's lease was lost.
pub const LEASES_LOST: &str = "stella_consumer_leases_lost_total";
/// Due jobs waiting for a run slot right now (the scanner busy), per lane:
/// the backlog the lanes' order (`consume::slots`) works through.
pub const WAITING: &str = "stella_consumer_waiting_jobs";
/// Valkey's clock minus this machine's (ms), as last measured.
pub const CLOCK_SKEW_MS: &str = "stella_consumer_clock_skew_ms";
/// Start − `notBefore`, per started job.
pub const LATENESS_MS: &str = "stella_consumer_lateness_ms";

/// Bucket bounds (ms) for the lateness histogram: a consumer keeping up
/// starts within milliseconds; seconds mean it is short of `--concurrency`.
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

/// Records events to EMF lines and the `metrics` facade.
#[derive(Clone)]
pub struct ConsumeMeter {
    namespace: Arc<str>,
    source: &'static str,
    emf: Option<Sink>,
    held: Arc<AtomicI64>,
    /// [`WAITING`] per lane, indexed by [`lane_index`].
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

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Within => 0,
        Lane::Over => 1,
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
        // The gauges start at zero, so a quiet lane reads 0, not absent.
        metrics::gauge!(HELD, "source" => source).set(0.0);
        for lane in [Lane::Within, Lane::Over] {
            metrics::gauge!(WAITING, "source" => source, "lane" => lane.as_str()).set(0.0);
        }
        Self {
            namespace: namespace.into(),
            source,
            emf,
            held: Arc::default(),
            waiting: Arc::default(),
        }
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
        metrics::gauge!(HELD, "source" => self.source).set(now as f64);
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
        let now = self.waiting[lane_index(lane)].fetch_add(delta, Ordering::Relaxed) + delta;
        metrics::gauge!(WAITING, "source" => self.source, "lane" => lane.as_str()).set(now as f64);
    }

    pub fn record(&self, event: Event) {
        let source = self.source;
        let name = match event {
            Event::Started { lateness_ms, lane } => {
                let lane = lane.as_str();
                metrics::histogram!(LATENESS_MS, "source" => source, "lane" => lane)
                    .record(lateness_ms as f64);
                STARTED
            }
            Event::Succeeded => SUCCEEDED,
            Event::Failed => FAILED,
            Event::DeadLettered => DEAD_LETTERED,
            Event::Duplicate => DUPLICATES,
            Event::TimedOut => TIMEOUTS,
            Event::LeaseLost => LEASES_LOST,
        };
        metrics::counter!(name, "source" => source).increment(1);
        if let Some(sink) = &self.emf {
            sink.write(self.emf_line(event, name, crate::io::clock::wall_ms()));
        }
    }

    /// The EMF document for one event, named `name`, at `timestamp_ms`.
    fn emf_line(&self, event: Event, name: &str, timestamp_ms: i64) -> String {
        let mut declared = vec![(name, Unit::Count), (HELD, Unit::Count)];
        let started = match event {
            Event::Started { lateness_ms, lane } => Some((lateness_ms, lane)),
            _ => None,
        };
        if started.is_some() {
            declared.push((LATENESS_MS, Unit::Milliseconds));
            declared.push((WAITING, Unit::Count));
        }
        let directive = match started {
            // The dwell per lane too: the same metrics under Source and Lane.
            Some(_) => emf::directive_by(
                &self.namespace,
                &[&["Source"], &["Source", "Lane"]],
                &declared,
            ),
            None => emf::directive(&self.namespace, "Source", &declared),
        };
        let mut line = Line::start(timestamp_ms, &directive, "Source", self.source);
        line.number(name, 1u64);
        line.number(HELD, self.held.load(Ordering::Relaxed));
        if let Some((lateness_ms, lane)) = started {
            line.text("Lane", lane.as_str());
            line.number(LATENESS_MS, lateness_ms);
            line.number(
                WAITING,
                self.waiting[lane_index(lane)].load(Ordering::Relaxed),
            );
        }
        line.finish()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A started job's line declares its counter, the held gauge, the
    /// lateness and its lane's backlog, by Source and by Source and Lane.
    #[test]
    fn emf_shape() {
        let meter = ConsumeMeter::new("StellaOps/Quota", "stream", false);
        meter.held(2);
        let _waiting = meter.waiting(Lane::Over);
        let line = meter.emf_line(
            Event::Started {
                lateness_ms: 12,
                lane: Lane::Over,
            },
            STARTED,
            1_796_032_800_000,
        );
        let doc: Value = serde_json::from_str(&line).unwrap();
        let cw = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(cw["Dimensions"], json!([["Source"], ["Source", "Lane"]]));
        assert_eq!(doc["Lane"], "over");
        assert_eq!(cw["Metrics"].as_array().unwrap().len(), 4);
        assert_eq!(doc[WAITING], 1);
        assert_eq!(doc[STARTED], 1);
        assert_eq!(doc[HELD], 2);
        assert_eq!(doc[LATENESS_MS], 12);
        assert_eq!(doc["Source"], "stream");
        assert_eq!(doc["_aws"]["Timestamp"], 1_796_032_800_000u64);
    }
}
