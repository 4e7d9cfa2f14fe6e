//! The one CloudWatch embedded-metric-format (EMF) writer, shared by the
//! gate's meter and the consumer's: the `CloudWatchMetrics` directive,
//! serialized once per kind of line; the line itself, built piece by piece
//! into one buffer; and the sink it goes to.
//!
//! Written here rather than through an EMF crate: the crates available
//! aggregate in a process-global recorder and flush documents later, while
//! the gate wants one self-contained line per request that a test can read
//! back from one handler instance.
//!
//! Two ways out: a synchronous sink, written and flushed before the call
//! returns (Lambda: the process is frozen after the response, so the line
//! must be out by then; tests read their capture sink back at once), and a
//! non-blocking [`LineWriter`], where a stdout nobody reads must never hold
//! a request: when its queue is full the line is dropped (and counted, when
//! a counter is given).

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::io::stdout::LineWriter;
use crate::rules::trace::TraceId;

/// The units the gate and the consumer declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Count,
    Milliseconds,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Self::Count => "Count",
            Self::Milliseconds => "Milliseconds",
        }
    }
}

/// The `CloudWatchMetrics` member of a line in `namespace` whose one
/// dimension set is `[[dimension]]` and which declares `metrics`. It never
/// changes after start: build it once per kind of line (building it per
/// request was half of the gate's own CPU).
pub fn directive(namespace: &str, dimension: &str, metrics: &[(&str, Unit)]) -> String {
    directive_by(namespace, &[&[dimension]], metrics)
}

/// [`directive`] with several dimension sets: the same metrics aggregated
/// by each.
pub fn directive_by(namespace: &str, dimensions: &[&[&str]], metrics: &[(&str, Unit)]) -> String {
    let metrics: Vec<Value> = metrics
        .iter()
        .map(|(name, unit)| json!({"Name": name, "Unit": unit.as_str()}))
        .collect();
    json!([{"Namespace": namespace, "Dimensions": dimensions, "Metrics": metrics}]).to_string()
}

/// One EMF document being written: pieces pushed in turn, numbers by
/// `itoa`, into one buffer sized up front, never through `fmt`. Every name
/// and text value is one of our own ASCII names, so nothing needs escaping.
pub struct Line {
    buf: String,
    digits: itoa::Buffer,
}

/// Room for the members after the directive: the gate's longest line (a
/// shadow decision) carries 14, in about 345 bytes with its `traceId`.
const MEMBERS_ROOM: usize = 384;

/// The property that carries a request's trace id (32 hex digits): a
/// member of the line, never a dimension.
pub const TRACE_ID: &str = "traceId";

/// A finished `line` (another meter's) with the request's `traceId` put in
/// before its closing brace; the line unchanged when there is none.
pub fn with_trace(mut line: String, trace: Option<TraceId>) -> String {
    if let (Some(id), Some(b'}')) = (trace, line.as_bytes().last()) {
        line.pop();
        for piece in [r#",""#, TRACE_ID, r#"":""#, id.hex().as_str(), "\"}"] {
            line.push_str(piece);
        }
    }
    line
}

impl Line {
    /// `{"_aws":{"Timestamp":…,"CloudWatchMetrics":…},"<dimension>":"<value>"`:
    /// a line at `timestamp_ms` under `directive` (from [`directive`]).
    pub fn start(timestamp_ms: i64, directive: &str, dimension: &str, value: &str) -> Self {
        let mut line = Self {
            buf: String::with_capacity(directive.len() + MEMBERS_ROOM),
            digits: itoa::Buffer::new(),
        };
        line.buf.push_str(r#"{"_aws":{"Timestamp":"#);
        line.buf.push_str(line.digits.format(timestamp_ms));
        for piece in [r#","CloudWatchMetrics":"#, directive, "}"] {
            line.buf.push_str(piece);
        }
        line.text(dimension, value);
        line
    }

    /// A metric's member: `,"<name>":<value>`.
    pub fn number(&mut self, name: &str, value: impl itoa::Integer) {
        self.name(name);
        self.buf.push_str(self.digits.format(value));
    }

    /// A text member: `,"<name>":"<value>"`.
    pub fn text(&mut self, name: &str, value: &str) {
        self.name(name);
        for piece in ["\"", value, "\""] {
            self.buf.push_str(piece);
        }
    }

    /// The request's trace id as the property `traceId` (none: nothing).
    pub fn trace(&mut self, trace: Option<TraceId>) {
        if let Some(id) = trace {
            self.text(TRACE_ID, id.hex().as_str());
        }
    }

    /// The finished document (no newline: the sink adds it).
    pub fn finish(mut self) -> String {
        self.buf.push('}');
        self.buf
    }

    fn name(&mut self, name: &str) {
        for piece in [r#",""#, name, r#"":"#] {
            self.buf.push_str(piece);
        }
    }
}

/// Where EMF lines go.
#[derive(Clone)]
pub enum Sink {
    /// Written and flushed before [`Sink::write`] returns.
    Sync(Arc<Mutex<Box<dyn Write + Send>>>),
    /// Queued for a writer thread; dropped when the queue is full, and
    /// counted in the counter, if any.
    Background(LineWriter, Option<metrics::Counter>),
}

impl Sink {
    /// A sink written and flushed in the caller's thread.
    pub fn sync(out: Box<dyn Write + Send>) -> Self {
        Self::Sync(Arc::new(Mutex::new(out)))
    }

    /// Writes one line (the newline added here). Metrics are best effort:
    /// a closed stdout must not fail a scan, and a full one loses metric
    /// lines, never jobs.
    pub fn write(&self, mut line: String) {
        line.push('\n');
        match self {
            Self::Sync(out) => {
                if let Ok(mut out) = out.lock() {
                    let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
                }
            }
            Self::Background(writer, dropped) => {
                if writer.try_line(line.into_bytes()).is_err()
                    && let Some(dropped) = dropped
                {
                    dropped.increment(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line is one JSON object: the directive under `_aws`, the dimension, then each member.
    #[test]
    fn line_shape() {
        let d = directive(
            "ns",
            "Source",
            &[("a", Unit::Count), ("b", Unit::Milliseconds)],
        );
        let mut line = Line::start(1_796_032_800_123, &d, "Source", "stdin");
        line.number("a", 1u64);
        line.number("b", -3i64);
        line.text("mode", "shadow");
        let text = line.finish();
        assert!(
            text.starts_with(r#"{"_aws":{"Timestamp":1796032800123,"#),
            "{text}"
        );
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["_aws"]["CloudWatchMetrics"][0]["Namespace"], "ns");
        assert_eq!(
            doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([["Source"]])
        );
        assert_eq!(doc["Source"], "stdin");
        assert_eq!(doc["a"], 1);
        assert_eq!(doc["b"], -3);
        assert_eq!(doc["mode"], "shadow");
    }
}
