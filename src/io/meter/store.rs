//! The quota Valkey's own metrics ([`STORE_EVICTING`], [`STORE_EVICTED_KEYS`]). They describe
//! the store, not a request, so they carry no `Scope`: no label in Prometheus, and in EMF the one
//! dimension `Process` (the front end that read them). No address, policy or key is a dimension.

use std::sync::{Arc, OnceLock};

use super::catalogue::{STORE_EVICTED_KEYS, STORE_EVICTING};
use super::emf::{Doc, Emf, Handles, Sink};

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

/// Records the store's metrics, each on an EMF line of its own.
#[derive(Clone)]
pub struct StoreMeter {
    handles: Handles,
    evicting: Arc<OnceLock<metrics::Gauge>>,
    evicted: metrics::Counter,
}

impl StoreMeter {
    /// EMF lines in `namespace` to `emf`, or none. Registers the counter at 0, so a query has data
    /// before the first eviction: install Prometheus first.
    pub fn new(namespace: &str, process: Process, emf: Option<Sink>) -> Self {
        let process = [(PROCESS_DIMENSION, process.as_str())];
        let emf = emf.map(|sink| Emf::new(namespace, sink, &process));
        let handles = Handles::new(emf.as_ref());
        Self {
            evicted: handles.counter(STORE_EVICTED_KEYS, &[]),
            evicting: Arc::default(),
            handles,
        }
    }

    /// Whether the store can evict the gate's keys. The gauge is registered at the first reading:
    /// a store never read shows no series, not a 0 that would say `noeviction`.
    pub fn evicting(&self, evicting: bool, at_ms: i64) {
        let gauge = self
            .evicting
            .get_or_init(|| self.handles.gauge(STORE_EVICTING, &[]));
        self.handles
            .line(Doc::at(at_ms), || gauge.set(f64::from(u8::from(evicting))));
    }

    /// `keys` more evicted since the last reading (an EMF line only when there were any).
    pub fn evicted(&self, keys: u64, at_ms: i64) {
        match keys {
            0 => self.evicted.increment(0),
            _ => self
                .handles
                .line(Doc::at(at_ms), || self.evicted.increment(keys)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::io::meter::emf::Buffer;

    /// Each line declares its one metric (Count) under the dimension Process only, and carries it.
    #[test]
    fn emf_shape() {
        let out = Buffer::default();
        let meter = StoreMeter::new("StellaOps/Quota", Process::Consume, Some(out.sink()));
        meter.evicting(true, 1_796_032_800_000);
        meter.evicted(0, 1_796_032_800_000);
        meter.evicted(42, 1_796_032_800_000);
        let docs = out.documents();
        assert_eq!(docs.len(), 2, "{docs:?}");
        let expected = [(STORE_EVICTING, 1), (STORE_EVICTED_KEYS, 42)];
        for (doc, (name, value)) in docs.iter().zip(expected) {
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
