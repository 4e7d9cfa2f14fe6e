//! Step 9: what the gate did, as metrics.
//!
//! [`Meter::record`] records each metric of a counted request once, through the `metrics` facade,
//! whose handles feed `serve`'s Prometheus text ([`prometheus`]) and CloudWatch EMF lines on
//! stdout ([`emf`]). Every metric has the one dimension `Scope` (`ip` or `tid`): no per-client
//! dimension, and no IP, token or digest in any line.
//!
//! A request's [`Outcome`] is part of a metric's name, not a dimension: one Count per outcome
//! ([`REQUESTS`]), and a request records only its own. A line's `Timestamp` is the request's
//! instant ([`Exit::at`]): the meter reads no clock.

pub mod catalogue;
pub mod emf;
pub mod levels;
pub mod prometheus;
pub mod refusals;
pub mod store;

use std::io::Write;
use std::sync::Arc;

use crate::io::stdout::LineWriter;
use crate::rules::level::Levels;
use crate::rules::scope::Scope;
use crate::rules::trace::TraceId;
use crate::rules::unix::UnixMillis;
use catalogue::{Counter, shadow_values};
use emf::{Doc, Emf, Handles, Sink};
use levels::LevelHit;
use refusals::Refusals;

pub use crate::rules::outcome::{Exit, Metered, Outcome};
pub use catalogue::{
    ASLEEP, BACKLOG_REFUSALS, BEDS_FULL, CHECKS, COUNTERS, DELAY_MS, EMF_DROPPED, ENQUEUE_ERRORS,
    EVENTS, EXEMPT, Event, HARD_HITS, PROCESS_OPEN_FDS, PROCESS_RSS, REMINDERS, REQUESTS,
    SHADOW_COUNTERS, SHADOW_HARD_HITS, SHADOW_SOFT_HITS, SOFT_HITS, STORE_ERRORS,
    STORE_EVICTED_KEYS, STORE_EVICTING, STORE_METRICS, describe, describe_store,
};
pub use levels::{GLOBAL_PACED, LEVEL_METRICS, NETWORK_HARD_HITS, NETWORK_SOFT_HITS};

/// Records outcomes through the `metrics` facade: Prometheus, and EMF lines when a sink is given.
#[derive(Clone)]
pub struct Meter {
    /// Registered once per scope: a lookup per call would hash a key per metric per request.
    handles: Arc<[ScopeHandles; 2]>,
    /// When refusals held for EMF are due ([`refusals`]).
    refusals: Arc<Refusals>,
    register: Handles,
}

struct ScopeHandles {
    counters: [metrics::Counter; 6],
    delay: metrics::Histogram,
    /// [`REQUESTS`], in [`Outcome::ALL`] order.
    requests: [metrics::Counter; 8],
    shadow: [metrics::Counter; 2],
    events: [metrics::Counter; 3],
    /// The sleep leases: requests asleep fleet-wide, as the last scan that asked found them, and
    /// scans that found every sleep lease taken. In EMF on a line of their own.
    asleep: metrics::Gauge,
    beds_full: metrics::Counter,
}

impl ScopeHandles {
    fn new(register: &Handles, scope: Scope) -> Self {
        let scope = [("scope", scope.as_str())];
        let counter = |name| register.counter(name, &scope);
        Self {
            counters: COUNTERS.map(counter),
            delay: register.histogram(DELAY_MS, &scope),
            requests: REQUESTS.map(counter),
            shadow: SHADOW_COUNTERS.map(counter),
            events: EVENTS.map(counter),
            asleep: register.gauge(ASLEEP, &scope),
            beds_full: counter(BEDS_FULL),
        }
    }
}

impl Meter {
    /// EMF lines to stdout, flushed before [`Meter::record`] returns: Lambda freezes the process
    /// once the response is sent.
    pub fn stdout(namespace: impl Into<String>) -> Self {
        Self::new(namespace, Some(Box::new(std::io::stdout())))
    }

    /// EMF lines through the non-blocking [`LineWriter::stdout`], for `serve`, where no request
    /// may wait on a pipe; a line finding the queue full counts in [`EMF_DROPPED`].
    pub fn background_stdout(namespace: impl Into<String>) -> Self {
        let dropped = metrics::counter!(EMF_DROPPED);
        let sink = Sink::Background(LineWriter::stdout(), Some(dropped));
        Self::with_sink(&namespace.into(), Some(sink))
    }

    /// EMF lines to `sink`, or none. Registers the handles: install Prometheus first.
    pub fn new(namespace: impl Into<String>, sink: Option<Box<dyn Write + Send>>) -> Self {
        Self::with_sink(&namespace.into(), sink.map(Sink::sync))
    }

    fn with_sink(namespace: &str, sink: Option<Sink>) -> Self {
        let emf = sink.map(|sink| Emf::new(namespace, sink, &[]));
        let register = Handles::new(emf.as_ref());
        Self {
            handles: Arc::new(Scope::ALL.map(|scope| ScopeHandles::new(&register, scope))),
            refusals: Arc::default(),
            register,
        }
        .with_levels(&Levels::default())
    }

    /// This meter with a series registered at 0 per configured network level, so queries have data.
    pub fn with_levels(self, levels: &Levels) -> Self {
        levels::register(&self.register, levels);
        self
    }

    /// Records one request's [`Exit`]: the scan's EMF line (a refusal's held, see [`refusals`]),
    /// then the sleep lease's and the level's on lines of their own.
    pub fn record(&self, exit: &Exit) {
        let scan = || self.record_scan(exit);
        if exit.outcome == Outcome::BacklogFull {
            // No line open: the renderer holds it for its interval's line.
            self.refusals.add(exit.scope);
            scan();
        } else {
            self.register
                .line(doc(exit, &properties(exit.metered, exit.outcome)), scan);
        }
        if let Some(emf) = self.register.emf()
            && self.refusals.due(exit.scope, exit.at)
        {
            emf.flush_held(exit.at.get(), Some(("Scope", exit.scope.as_str())));
        }
        if let Some(sleep_lease) = exit.sleep_lease {
            let handles = &self.handles[exit.scope.index()];
            self.register.line(doc(exit, &[]), || {
                handles.asleep.set(f64::from(sleep_lease.asleep));
                handles.beds_full.increment(u64::from(!sleep_lease.taken));
            });
        }
        if let Some(hit) = LevelHit::of(exit.metered) {
            let levels = || hit.counter(&self.register).increment(1);
            self.register.line(doc(exit, &[]), levels);
        }
    }

    /// The scan's metrics, in the order its EMF line declares them.
    fn record_scan(&self, exit: &Exit) {
        let handles = &self.handles[exit.scope.index()];
        for (handle, counter) in handles.counters.iter().zip(Counter::ALL) {
            handle.increment(counter.value(exit.metered, exit.outcome));
        }
        if let Metered::Counted {
            tier, shadow: true, ..
        } = exit.metered
        {
            for (handle, value) in handles.shadow.iter().zip(shadow_values(tier)) {
                handle.increment(value);
            }
        }
        handles.requests[exit.outcome.index()].increment(1);
        // No decision, no delay sample: an outage must not drag p95 down.
        if let Metered::Counted { delay, .. } = exit.metered {
            handles
                .delay
                .record(crate::rules::unix::duration_ms(delay) as f64);
        }
    }

    /// Writes the held refusals now, at `at`: for a process that stops.
    pub fn flush(&self, at: UnixMillis) {
        if let Some(emf) = self.register.emf() {
            emf.flush_held(at.get(), None);
        }
    }

    /// Records one [`Event`] of the request that arrived `at` in `trace`.
    pub fn record_event(&self, scope: Scope, event: Event, at: UnixMillis, trace: Option<TraceId>) {
        let handle = &self.handles[scope.index()].events[event.index()];
        let doc = Doc {
            trace,
            ..Doc::at(at.get())
        };
        self.register.line(doc, || handle.increment(1));
    }
}

/// The EMF line of `exit`'s request carrying `properties`.
fn doc<'a>(exit: &Exit, properties: &'a [(&'a str, &'a str)]) -> Doc<'a> {
    Doc {
        at: exit.at.get(),
        properties,
        trace: exit.trace,
    }
}

/// A scan line's text members: `tier` (`unmetered` if the store failed open), `mode` in shadow
/// mode; an empty name is no member.
fn properties(metered: Metered, outcome: Outcome) -> [(&'static str, &'static str); 2] {
    let none = ("", "");
    match metered {
        Metered::Counted {
            shadow: true, tier, ..
        } => [("tier", tier.as_str()), ("mode", "shadow")],
        Metered::Counted { tier, .. } => [("tier", tier.as_str()), none],
        Metered::StoreFailed if outcome != Outcome::StoreUnavailable => {
            [("tier", "unmetered"), none]
        }
        Metered::StoreFailed | Metered::Uncounted => [none, none],
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::io::meter::emf::Buffer;
    use crate::rules::decide::Tier;

    fn exit(scope: Scope, metered: Metered, outcome: Outcome) -> Exit {
        Exit {
            scope,
            metered,
            outcome,
            at: UnixMillis(1_796_032_800_000),
            sleep_lease: None,
            trace: None,
        }
    }

    fn counted(tier: Tier, delay_ms: u64, shadow: bool) -> Metered {
        Metered::Counted {
            tier,
            reminder: false,
            delay: Duration::from_millis(delay_ms),
            shadow,
            level: crate::rules::level::LevelName::Subject,
        }
    }

    /// Every way a request can leave the gate, in each scope.
    fn every_kind() -> Vec<Exit> {
        let mut all = Vec::new();
        for scope in [Scope::Ip, Scope::Tid] {
            let mut metered = vec![Metered::StoreFailed, Metered::Uncounted];
            for tier in [Tier::Within, Tier::Soft, Tier::Hard] {
                metered.extend([counted(tier, 5000, false), counted(tier, 0, true)]);
            }
            for m in metered {
                for outcome in [
                    Outcome::answered(m),
                    Outcome::StoreUnavailable,
                    Outcome::BacklogFull,
                    Outcome::QueueUnavailable,
                ] {
                    all.push(exit(scope, m, outcome));
                }
            }
        }
        all
    }

    /// The scan's EMF line for `e` (a refusal's: its interval's line).
    fn line(e: &Exit) -> Value {
        let out = Buffer::default();
        let meter = Meter::with_sink("StellaOps/Quota", Some(out.sink()));
        meter.record(e);
        out.documents().remove(0)
    }

    /// Every line, whatever its outcome, has one directive whose Dimensions are exactly [["Scope"]], and no Outcome member.
    #[test]
    fn dimensions_are_scope_only() {
        let mut seen = Vec::new();
        for e in every_kind() {
            let doc = line(&e);
            let directives = doc["_aws"]["CloudWatchMetrics"].as_array().unwrap();
            assert_eq!(directives.len(), 1, "{doc}");
            assert_eq!(directives[0]["Dimensions"], json!([["Scope"]]), "{doc}");
            assert!(doc.get("Outcome").is_none(), "{doc}");
            seen.push(e.outcome);
        }
        for o in Outcome::ALL {
            assert!(seen.contains(&o), "{o:?} was not tried");
        }
    }

    /// A line names and carries the requests metric of its own outcome (value 1) and no other one.
    #[test]
    fn one_requests_metric_per_line() {
        for e in every_kind() {
            let doc = line(&e);
            let own = e.outcome.requests_metric();
            let named: Vec<&str> = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["Name"].as_str().unwrap())
                .filter(|n| REQUESTS.contains(n))
                .collect();
            assert_eq!(named, [own], "{doc}");
            assert_eq!(doc[own], 1);
            for other in REQUESTS.iter().filter(|n| **n != own) {
                assert!(doc.get(*other).is_none(), "{other} in {doc}");
            }
        }
    }

    /// Each declared metric and dimension is a top-level member, per the EMF spec.
    #[test]
    fn emf_structure() {
        for e in every_kind() {
            let doc = line(&Exit {
                at: UnixMillis(1_796_032_800_000),
                ..e
            });
            let aws = &doc["_aws"];
            assert_eq!(aws["Timestamp"], 1_796_032_800_000u64);
            let directive = &aws["CloudWatchMetrics"][0];
            assert_eq!(directive["Namespace"], "StellaOps/Quota");
            assert_eq!(doc["Scope"], e.scope.as_str());
            for m in directive["Metrics"].as_array().unwrap() {
                let name = m["Name"].as_str().unwrap();
                assert!(doc[name].is_number(), "{name} missing");
            }
        }
    }

    /// Soft and hard tiers and the delay show in the values; shadow ones under the shadow counters.
    #[test]
    fn values() {
        let hard = line(&exit(
            Scope::Ip,
            counted(Tier::Hard, 60_000, false),
            Outcome::Hard,
        ));
        assert_eq!(hard[HARD_HITS], 1);
        assert_eq!(hard[SOFT_HITS], 0);
        assert_eq!(hard[DELAY_MS], 60_000);
        assert_eq!(hard["tier"], "hard");
        let shadow = line(&exit(
            Scope::Ip,
            counted(Tier::Soft, 0, true),
            Outcome::Within,
        ));
        assert_eq!(
            (
                shadow[SOFT_HITS].as_u64(),
                shadow[SHADOW_SOFT_HITS].as_u64()
            ),
            (Some(0), Some(1))
        );
        assert_eq!(shadow["mode"], "shadow");
        let open = line(&exit(Scope::Tid, Metered::StoreFailed, Outcome::Unmetered));
        assert_eq!(open[STORE_ERRORS], 1);
        assert_eq!(open["tier"], "unmetered");
        assert!(open.get(DELAY_MS).is_none());
        let closed = line(&exit(
            Scope::Tid,
            Metered::StoreFailed,
            Outcome::StoreUnavailable,
        ));
        assert_eq!(closed["stella_quota_requests_store_unavailable_total"], 1);
        assert!(closed.get("tier").is_none(), "{closed}");
        assert_eq!(closed["Scope"], "tid");
    }

    /// Each metric of a request is recorded once, through the facade: a
    /// local recorder reads the values, and the EMF line carries the same.
    #[test]
    fn recorded_once_through_the_facade() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let out = Buffer::default();
        let meter =
            metrics::with_local_recorder(&recorder, || Meter::with_sink("ns", Some(out.sink())));
        let hard = exit(Scope::Ip, counted(Tier::Hard, 60_000, false), Outcome::Hard);
        meter.record(&hard);
        meter.record(&exit(Scope::Tid, Metered::Uncounted, Outcome::BacklogFull));
        let values = snapshotter.snapshot().into_vec();
        let value = |name: &str, scope: &str| {
            let found = values.iter().find(|(key, ..)| {
                let key = key.key();
                key.name() == name && key.labels().any(|l| l.value() == scope)
            });
            found.map(|(.., value)| value)
        };
        assert_eq!(value(HARD_HITS, "ip"), Some(&DebugValue::Counter(1)));
        assert_eq!(value(REQUESTS[2], "ip"), Some(&DebugValue::Counter(1)));
        assert_eq!(
            value(BACKLOG_REFUSALS, "tid"),
            Some(&DebugValue::Counter(1))
        );
        assert_eq!(value(SOFT_HITS, "ip"), Some(&DebugValue::Counter(0)));
        let Some(DebugValue::Histogram(delays)) = value(DELAY_MS, "ip") else {
            panic!("no delay sample");
        };
        assert_eq!(delays.iter().map(|d| d.0).collect::<Vec<_>>(), [60_000.0]);
        let docs = out.documents();
        assert_eq!(
            (docs[0][HARD_HITS].as_u64(), docs[0][DELAY_MS].as_u64()),
            (Some(1), Some(60_000))
        );
        assert_eq!(
            (
                docs[1]["Scope"].as_str(),
                docs[1][BACKLOG_REFUSALS].as_u64()
            ),
            (Some("tid"), Some(1))
        );
    }
}
