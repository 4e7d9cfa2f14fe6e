//! CloudWatch's embedded metric format (EMF) behind the `metrics` facade: [`Emf`] is a
//! [`metrics::Recorder`] layered over the installed one, so each handle registered through it
//! ([`Handles`]) records in both. [`Emf::line`] opens a capture on the caller's thread, and what
//! its handles record meanwhile becomes one document. What is recorded with no capture open is
//! held, summed per series, until [`Emf::flush_held`] writes one line per label set.

mod line;
mod sink;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Label, Metadata,
    Recorder, SharedString, Unit,
};

use crate::rules::trace::TraceId;

pub use sink::Sink;

/// The property carrying a request's trace id (32 hex digits): a member, never a dimension.
pub const TRACE_ID: &str = "traceId";

/// The EMF renderer: a recorder whose handles write into their thread's open capture.
#[derive(Clone)]
pub struct Emf(Arc<Inner>);

struct Inner {
    namespace: String,
    sink: Sink,
    /// Dimensions every series has besides its labels (the store's `Process`).
    defaults: Vec<(String, String)>,
    /// Every series registered, in order: [`Emf::flush_held`] reads them.
    series: Mutex<Vec<Arc<Series>>>,
    /// The `CloudWatchMetrics` member per list of series, serialized once per kind of line.
    directives: RwLock<HashMap<Vec<usize>, Arc<str>>>,
}

/// One series as EMF sees it, and what is held of it for a later line.
struct Series {
    id: usize,
    key: Key,
    unit: &'static str,
    /// (EMF dimension, value), labels first, then the renderer's defaults.
    dimensions: Vec<(String, String)>,
    held: AtomicU64,
    touched: AtomicBool,
}

/// One value captured: a count, or a gauge's or a histogram's sample.
#[derive(Clone, Copy)]
enum Value {
    Count(u64),
    Sample(f64),
}

/// What one line captured: each series once, with its value, in order.
type Captured = Vec<(Arc<Series>, Value)>;

thread_local! {
    /// The line being captured on this thread (`None`: no capture open).
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
    /// The last capture's buffer, emptied, reused so a request allocates only its line's text.
    static SPARE: RefCell<Captured> = const { RefCell::new(Vec::new()) };
}

/// A series' handle: the installed recorder's, and this renderer's series.
struct Handle<H> {
    inner: H,
    series: Arc<Series>,
}

impl<H> Handle<H> {
    /// Adds `value` to the capture; `false` when none is open.
    fn capture(&self, value: Value) -> bool {
        CAPTURE.with(|c| match c.borrow_mut().as_mut() {
            Some(line) => {
                // A series twice in one line: counts add, a sample replaces.
                let earlier = line.iter_mut().find(|(s, _)| Arc::ptr_eq(s, &self.series));
                match (earlier, value) {
                    (Some((_, Value::Count(n))), Value::Count(v)) => *n += v,
                    (Some((_, old)), _) => *old = value,
                    (None, _) => line.push((self.series.clone(), value)),
                }
                true
            }
            None => false,
        })
    }
}

impl CounterFn for Handle<Counter> {
    fn increment(&self, value: u64) {
        self.inner.increment(value);
        if !self.capture(Value::Count(value)) {
            self.series.held.fetch_add(value, Ordering::Relaxed);
            self.series.touched.store(true, Ordering::Relaxed);
        }
    }

    fn absolute(&self, value: u64) {
        self.inner.absolute(value);
    }
}

/// A gauge set outside a capture is not held: the next line sets it again.
impl GaugeFn for Handle<Gauge> {
    fn set(&self, value: f64) {
        self.inner.set(value);
        self.capture(Value::Sample(value));
    }

    fn increment(&self, value: f64) {
        self.inner.increment(value);
    }

    fn decrement(&self, value: f64) {
        self.inner.decrement(value);
    }
}

impl HistogramFn for Handle<Histogram> {
    fn record(&self, value: f64) {
        self.inner.record(value);
        self.capture(Value::Sample(value));
    }
}

/// Descriptions go to the installed recorder directly.
impl Recorder for Emf {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, meta: &Metadata<'_>) -> Counter {
        let inner = metrics::with_recorder(|r| r.register_counter(key, meta));
        Counter::from_arc(self.handle(key, inner))
    }

    fn register_gauge(&self, key: &Key, meta: &Metadata<'_>) -> Gauge {
        let inner = metrics::with_recorder(|r| r.register_gauge(key, meta));
        Gauge::from_arc(self.handle(key, inner))
    }

    fn register_histogram(&self, key: &Key, meta: &Metadata<'_>) -> Histogram {
        let inner = metrics::with_recorder(|r| r.register_histogram(key, meta));
        Histogram::from_arc(self.handle(key, inner))
    }
}

static METADATA: Metadata = Metadata::new(module_path!(), metrics::Level::INFO, None);

/// Where a meter registers its handles: the renderer when EMF is on, else the installed recorder.
/// Register after installing Prometheus.
#[derive(Clone)]
pub struct Handles(Option<Emf>);

impl Handles {
    pub fn new(emf: Option<&Emf>) -> Self {
        Self(emf.cloned())
    }

    /// The renderer, when EMF is on.
    pub fn emf(&self) -> Option<&Emf> {
        self.0.as_ref()
    }

    /// Runs `record` as one EMF line ([`Emf::line`]); with EMF off, runs it.
    pub fn line(&self, doc: Doc<'_>, record: impl FnOnce()) {
        match &self.0 {
            Some(emf) => emf.line(doc, record),
            None => record(),
        }
    }

    fn register<T>(
        &self,
        name: &'static str,
        labels: &[(&str, &str)],
        f: impl Fn(&dyn Recorder, &Key) -> T,
    ) -> T {
        let labels = labels
            .iter()
            .map(|(k, v)| Label::new((*k).to_owned(), (*v).to_owned()));
        let key = Key::from_parts(name, labels.collect::<Vec<_>>());
        match &self.0 {
            Some(emf) => f(emf, &key),
            None => metrics::with_recorder(|r| f(r, &key)),
        }
    }

    pub fn counter(&self, name: &'static str, labels: &[(&str, &str)]) -> Counter {
        self.register(name, labels, |r, key| r.register_counter(key, &METADATA))
    }

    pub fn gauge(&self, name: &'static str, labels: &[(&str, &str)]) -> Gauge {
        self.register(name, labels, |r, key| r.register_gauge(key, &METADATA))
    }

    pub fn histogram(&self, name: &'static str, labels: &[(&str, &str)]) -> Histogram {
        self.register(name, labels, |r, key| r.register_histogram(key, &METADATA))
    }
}

/// What a line carries besides its metrics.
#[derive(Clone, Copy, Default)]
pub struct Doc<'a> {
    /// The line's `Timestamp`, epoch ms: the request's instant.
    pub at: i64,
    /// Text members (`tier`, `mode`).
    pub properties: &'a [(&'a str, &'a str)],
    pub trace: Option<TraceId>,
}

impl Doc<'static> {
    /// A line at `at` with no properties and no trace.
    pub fn at(at: i64) -> Self {
        Self {
            at,
            ..Self::default()
        }
    }
}

impl Emf {
    /// A renderer of lines in `namespace` to `sink`; every series also gets the `defaults`.
    pub fn new(namespace: &str, sink: Sink, defaults: &[(&str, &str)]) -> Self {
        let defaults = defaults
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()));
        Self(Arc::new(Inner {
            namespace: namespace.to_owned(),
            sink,
            defaults: defaults.collect(),
            series: Mutex::default(),
            directives: RwLock::default(),
        }))
    }

    fn handle<H>(&self, key: &Key, inner: H) -> Arc<Handle<H>> {
        let series = self.series(key);
        Arc::new(Handle { inner, series })
    }

    fn all(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Series>>> {
        self.0.series.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The series of `key`: registered once, found again after.
    fn series(&self, key: &Key) -> Arc<Series> {
        let mut all = self.all();
        if let Some(known) = all.iter().find(|s| s.key == *key) {
            return known.clone();
        }
        let labels = key
            .labels()
            .map(|l| (dimension(l.key()), l.value().to_owned()));
        let series = Arc::new(Series {
            id: all.len(),
            key: key.clone(),
            unit: if key.name().ends_with("_ms") {
                "Milliseconds"
            } else {
                "Count"
            },
            dimensions: labels.chain(self.0.defaults.iter().cloned()).collect(),
            held: AtomicU64::new(0),
            touched: AtomicBool::new(false),
        });
        all.push(series.clone());
        series
    }

    /// Runs `record` with a capture open and writes what it recorded as one line (if anything).
    pub fn line(&self, doc: Doc<'_>, record: impl FnOnce()) {
        let fresh = SPARE.with(|s| std::mem::take(&mut *s.borrow_mut()));
        let outer = CAPTURE.with(|c| c.borrow_mut().replace(fresh));
        record();
        let captured = CAPTURE.with(|c| std::mem::replace(&mut *c.borrow_mut(), outer));
        if let Some(mut line) = captured {
            if !line.is_empty() {
                self.0.sink.write(self.render(&line, doc));
            }
            line.clear();
            SPARE.with(|s| *s.borrow_mut() = line);
        }
    }

    /// Writes what was recorded outside a capture since the last call, one line per label set, at
    /// `at`: of the series with the dimension `only` (name, value), or of all.
    pub fn flush_held(&self, at: i64, only: Option<(&str, &str)>) {
        let all = self.all().clone();
        let wanted = |s: &Arc<Series>| match only {
            Some((name, value)) => s.dimensions.iter().any(|(n, v)| n == name && v == value),
            None => true,
        };
        let mut lines: Vec<Captured> = Vec::new();
        for series in all.into_iter().filter(wanted) {
            if !series.touched.swap(false, Ordering::Relaxed) {
                continue;
            }
            let value = Value::Count(series.held.swap(0, Ordering::Relaxed));
            match lines
                .iter_mut()
                .find(|l| l[0].0.dimensions == series.dimensions)
            {
                Some(line) => line.push((series, value)),
                None => lines.push(vec![(series, value)]),
            }
        }
        for line in lines {
            self.0.sink.write(self.render(&line, Doc::at(at)));
        }
    }
}

/// A label's EMF dimension: its name capitalized (`scope` is `Scope`).
fn dimension(label: &str) -> String {
    let mut chars = label.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

#[cfg(test)]
pub(crate) use tests::Buffer;

#[cfg(test)]
mod tests {
    use std::io::Write;

    use serde_json::json;

    use super::*;

    /// A sink the unit tests read back: the lines written, shared with the sink it hands out.
    #[derive(Clone, Default)]
    pub(crate) struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Buffer {
        pub(crate) fn sink(&self) -> Sink {
            Sink::sync(Box::new(self.clone()))
        }

        /// Every line written, parsed.
        pub(crate) fn documents(&self) -> Vec<serde_json::Value> {
            let bytes = self.0.lock().unwrap().clone();
            let text = String::from_utf8(bytes).unwrap();
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        }
    }

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A capture is one line: its label sets as dimension sets, each
    /// dimension once, each metric with its unit, the properties after.
    #[test]
    fn line_shape() {
        let out = Buffer::default();
        let emf = Emf::new("ns", out.sink(), &[]);
        let handles = Handles::new(Some(&emf));
        let source = [("source", "stdin")];
        let lane = [("source", "stdin"), ("lane", "over")];
        let (count, late) = (
            handles.counter("a", &source),
            handles.histogram("b_ms", &lane),
        );
        let doc = Doc {
            at: 1_796_032_800_123,
            properties: &[("mode", "shadow")],
            trace: None,
        };
        emf.line(doc, || {
            count.increment(1);
            late.record(3.0);
        });
        let docs = out.documents();
        let doc = &docs[0];
        assert_eq!(doc["_aws"]["Timestamp"], 1_796_032_800_123u64);
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(
            directive["Dimensions"],
            json!([["Source"], ["Source", "Lane"]])
        );
        assert_eq!(
            directive["Metrics"][1],
            json!({"Name": "b_ms", "Unit": "Milliseconds"})
        );
        assert_eq!(
            (doc["Source"].as_str(), doc["Lane"].as_str()),
            (Some("stdin"), Some("over"))
        );
        assert_eq!(
            (doc["a"].as_u64(), doc["b_ms"].as_u64()),
            (Some(1), Some(3))
        );
        assert_eq!(doc["mode"], "shadow");
    }

    /// Counts recorded with no capture open are held, then written summed,
    /// one line per label set.
    #[test]
    fn held_counts() {
        let out = Buffer::default();
        let emf = Emf::new("ns", out.sink(), &[]);
        let handles = Handles::new(Some(&emf));
        let ip = handles.counter("r", &[("scope", "ip")]);
        let tid = handles.counter("r", &[("scope", "tid")]);
        (0..500).for_each(|_| ip.increment(1));
        tid.increment(0);
        emf.flush_held(7, None);
        emf.flush_held(8, None);
        let docs = out.documents();
        assert_eq!(docs.len(), 2, "{docs:?}");
        assert_eq!(
            (docs[0]["Scope"].as_str(), docs[0]["r"].as_u64()),
            (Some("ip"), Some(500))
        );
        assert_eq!(
            (docs[1]["Scope"].as_str(), docs[1]["r"].as_u64()),
            (Some("tid"), Some(0))
        );
    }
}
