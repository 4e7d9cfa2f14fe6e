//! The quota Valkey's own metrics: whether its policy can evict the gate's
//! keys ([`STORE_EVICTING`], a gauge set at start) and the keys it evicted
//! ([`STORE_EVICTED_KEYS`], the increase between two readings).
//!
//! They describe the process's store, not a request, so they carry no
//! `Scope`: in Prometheus they have no label, like the process gauges; in
//! EMF their one dimension is `Process` (`serve`, `lambda`, `consume`: the
//! front end that read them), as the consumer's lines have `Source`. No
//! address, policy or key is a dimension.

use super::catalogue::{STORE_EVICTED_KEYS, STORE_EVICTING, STORE_METRICS};
use super::emf::{self, Line, Sink, Unit};

/// The EMF dimension of the store's metrics.
pub const PROCESS_DIMENSION: &str = "Process";

/// The front end that reads the store: the value of [`PROCESS_DIMENSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    Serve,
    Lambda,
    Consume,
}

impl Process {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Serve => "serve",
            Self::Lambda => "lambda",
            Self::Consume => "consume",
        }
    }
}

/// One of the store's metrics: its index in [`STORE_METRICS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMetric {
    Evicting,
    EvictedKeys,
}

/// Records the store's metrics in both exporters.
#[derive(Clone)]
pub struct StoreMeter {
    process: Process,
    /// Per [`StoreMetric`]: the directive of its line.
    directives: [String; 2],
    emf: Option<Sink>,
    evicted: metrics::Counter,
}

impl StoreMeter {
    /// EMF lines in `namespace` to `emf` (or none). The counter is
    /// registered here, at 0, so a query has data before the first
    /// eviction: install the Prometheus recorder before this.
    pub fn new(namespace: &str, process: Process, emf: Option<Sink>) -> Self {
        let directive =
            |name: &str| emf::directive(namespace, PROCESS_DIMENSION, &[(name, Unit::Count)]);
        Self {
            process,
            directives: STORE_METRICS.map(directive),
            emf,
            evicted: metrics::counter!(STORE_EVICTED_KEYS),
        }
    }

    /// Whether the store can evict the gate's keys, as read at start: the
    /// gauge, and one EMF line.
    pub fn evicting(&self, evicting: bool, at_ms: i64) {
        metrics::gauge!(STORE_EVICTING).set(f64::from(u8::from(evicting)));
        if let Some(sink) = &self.emf {
            sink.write(self.line(StoreMetric::Evicting, u64::from(evicting), at_ms));
        }
    }

    /// `keys` more evicted since the last reading: the counter, and an EMF
    /// line when there were any.
    pub fn evicted(&self, keys: u64, at_ms: i64) {
        self.evicted.increment(keys);
        if keys > 0
            && let Some(sink) = &self.emf
        {
            sink.write(self.line(StoreMetric::EvictedKeys, keys, at_ms));
        }
    }

    /// The EMF document carrying `value` for `metric`, at `at_ms`.
    pub fn line(&self, metric: StoreMetric, value: u64, at_ms: i64) -> String {
        let index = metric as usize;
        let mut line = Line::start(
            at_ms,
            &self.directives[index],
            PROCESS_DIMENSION,
            self.process.as_str(),
        );
        line.number(STORE_METRICS[index], value);
        line.finish()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// Each line declares its one metric (Count) under the dimension Process only, and carries it.
    #[test]
    fn emf_shape() {
        let meter = StoreMeter::new("StellaOps/Quota", Process::Consume, None);
        for (metric, name, value) in [
            (StoreMetric::Evicting, STORE_EVICTING, 1),
            (StoreMetric::EvictedKeys, STORE_EVICTED_KEYS, 42),
        ] {
            let doc: Value =
                serde_json::from_str(&meter.line(metric, value, 1_796_032_800_000)).unwrap();
            let directive = &doc["_aws"]["CloudWatchMetrics"][0];
            assert_eq!(directive["Dimensions"], json!([["Process"]]));
            assert_eq!(
                directive["Metrics"],
                json!([{"Name": name, "Unit": "Count"}])
            );
            assert_eq!(doc["Process"], "consume");
            assert_eq!(doc[name], value);
        }
    }
}
