//! Step 9: what the gate did, as metrics.
//!
//! One call, [`Meter::record`], per counted request feeds two exporters:
//! a CloudWatch embedded-metric-format (EMF) line on stdout, which Lambda
//! ships to CloudWatch Logs and CloudWatch turns into metrics, and the
//! `metrics` facade, which `quota-gate serve` renders as Prometheus text at
//! `GET /metrics` ([`prometheus`]). Every metric has the dimension `Scope`
//! (`ip` or `tid`) and no other (the spec's step 9): no per-client
//! dimension, and no IP, token or digest in any line. Every EMF line has one
//! directive, whose `Dimensions` are exactly `[["Scope"]]`.
//!
//! What a request came to (its [`Outcome`], one rule on the ground floor) is
//! therefore not a dimension but part of a metric's name: one Count per
//! outcome, `stella_quota_requests_<outcome>_total` ([`REQUESTS`]), so a
//! dashboard shows requests by outcome by plotting them all. A line names
//! (and carries, with the value 1) only the metric of its own outcome: EMF
//! requires every metric a directive names to be a member of the line, and a
//! zero for the others would only add bytes. In Prometheus they are counters
//! labelled `scope` only, like the other quota counters; there every series
//! exists from the start (at 0), so a query on any of them has data.
//!
//! Three ideas, a name each: the [`Meter`] writes; an [`Exit`] is what the
//! gate tells it of one request (its count as [`Metered`], how it ended as
//! [`End`], its scope and instant); the [`Outcome`] is the one word the
//! request came to, which the ground floor derives from those two. The
//! count's [`Charge`](crate::rules::settle::Charge) is the settlement's, not
//! the meter's: the gate tells the meter of it as a [`Metered`].
//!
//! The rooms: [`catalogue`] names every metric and says what it counts,
//! [`emf`] is the one EMF writer (the consumer's too), [`prometheus`] the
//! scrape, [`store`] the quota Valkey's own metrics (whether it can evict,
//! what it evicted), which describe the process's store, not a request. A line's `Timestamp` is the request's instant, the one clock
//! reading of the request ([`Exit::at`]): the meter reads no clock.

pub mod beds;
pub mod catalogue;
pub mod emf;
pub mod levels;
pub mod prometheus;
pub mod refusals;
pub mod store;

use std::io::Write;
use std::sync::Arc;

use crate::io::stdout::LineWriter;
use crate::rules::delay::Bed;
use crate::rules::level::Levels;
use crate::rules::scope::Scope;
use crate::rules::trace::TraceId;
use crate::rules::unix::UnixMillis;
use beds::BedMeter;
use catalogue::{Counter, shadow_values};
use emf::{Line, Sink, Unit};
use levels::{LevelHit, LevelMeter};
use refusals::Refusals;

pub use crate::rules::outcome::{End, Metered, Outcome};
pub use beds::{ASLEEP, BEDS_FULL};
pub use catalogue::{
    BACKLOG_REFUSALS, CHECKS, COUNTERS, DELAY_MS, EMF_DROPPED, ENQUEUE_ERRORS, EVENTS, EXEMPT,
    Event, HARD_HITS, PROCESS_OPEN_FDS, PROCESS_RSS, REMINDERS, REQUESTS, SHADOW_COUNTERS,
    SHADOW_HARD_HITS, SHADOW_SOFT_HITS, SOFT_HITS, STORE_ERRORS, STORE_EVICTED_KEYS,
    STORE_EVICTING, STORE_METRICS, describe, describe_store,
};
pub use levels::{GLOBAL_PACED, LEVEL_METRICS, NETWORK_HARD_HITS, NETWORK_SOFT_HITS};

/// How one scan request that reached the store left the gate: what the
/// store made of it, how it ended, and when it arrived. The gate returns
/// one from its request path; [`Meter::record`] maps it to its
/// [`Outcome`], once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub scope: Scope,
    pub metered: Metered,
    pub end: End,
    /// The request's instant: the line's `Timestamp`.
    pub at: UnixMillis,
    /// What the scan found among the beds, when it asked for one (an
    /// over-quota scan that would sleep).
    pub bed: Option<Bed>,
    /// The request's trace: every EMF line of the request carries its id
    /// as the property `traceId` (never a dimension).
    pub trace: Option<TraceId>,
}

/// Records outcomes to the EMF sink and the `metrics` facade.
#[derive(Clone)]
pub struct Meter {
    directives: Arc<Directives>,
    /// Handles registered once per scope: a lookup per call would cost the
    /// recorder a key hash and a map probe per metric per request.
    handles: Arc<[ScopeHandles; 2]>,
    /// The levels above the subject ([`levels`]).
    levels: Arc<LevelMeter>,
    /// The beds ([`beds`]).
    beds: Arc<BedMeter>,
    /// Refusals held for their next EMF line ([`refusals`]).
    refusals: Arc<Refusals>,
    namespace: Arc<str>,
    emf: Option<Sink>,
}

/// The `metrics` handles of one scope.
struct ScopeHandles {
    counters: [metrics::Counter; 6],
    delay: metrics::Histogram,
    /// [`REQUESTS`], in [`Outcome::ALL`] order.
    requests: [metrics::Counter; 8],
    shadow: [metrics::Counter; 2],
    /// [`EVENTS`].
    events: [metrics::Counter; 3],
}

impl ScopeHandles {
    fn new(scope: Scope) -> Self {
        let scope = scope.as_str();
        Self {
            counters: COUNTERS.map(|name| metrics::counter!(name, "scope" => scope)),
            delay: metrics::histogram!(DELAY_MS, "scope" => scope),
            requests: REQUESTS.map(|name| metrics::counter!(name, "scope" => scope)),
            shadow: SHADOW_COUNTERS.map(|name| metrics::counter!(name, "scope" => scope)),
            events: EVENTS.map(|name| metrics::counter!(name, "scope" => scope)),
        }
    }
}

/// The `CloudWatchMetrics` member, serialized once per kind of line: it
/// never changes after start.
struct Directives {
    /// For a decided request, per outcome: the counters, the outcome's
    /// requests metric and the delay sample.
    decided: [String; 8],
    /// For a request the store could not count, per outcome: the counters
    /// and the outcome's requests metric.
    undecided: [String; 8],
    /// For a request decided in shadow mode: as `decided`, plus [`SHADOW_COUNTERS`].
    shadow: [String; 8],
    /// For an [`Event`]: its one counter.
    events: [String; 3],
}

impl Directives {
    fn new(namespace: &str) -> Self {
        let directive = |with_delay: bool, shadow: bool, requests: &str| {
            let mut metrics: Vec<(&str, Unit)> = COUNTERS.map(|n| (n, Unit::Count)).to_vec();
            if shadow {
                metrics.extend(SHADOW_COUNTERS.map(|n| (n, Unit::Count)));
            }
            metrics.push((requests, Unit::Count));
            if with_delay {
                metrics.push((DELAY_MS, Unit::Milliseconds));
            }
            emf::directive(namespace, "Scope", &metrics)
        };
        Self {
            decided: REQUESTS.map(|r| directive(true, false, r)),
            undecided: REQUESTS.map(|r| directive(false, false, r)),
            shadow: REQUESTS.map(|r| directive(true, true, r)),
            events: EVENTS.map(|e| emf::directive(namespace, "Scope", &[(e, Unit::Count)])),
        }
    }
}

impl Meter {
    /// EMF lines to stdout in `namespace`, each written and flushed before
    /// [`Meter::record`] returns: for Lambda, which freezes the process once
    /// the response is sent.
    pub fn stdout(namespace: impl Into<String>) -> Self {
        Self::new(namespace, Some(Box::new(std::io::stdout())))
    }

    /// EMF lines to stdout through the shared non-blocking
    /// [`LineWriter::stdout`]: for `quota-gate serve`, where no request may
    /// wait on a pipe. A line that finds the queue full is dropped and
    /// counted in [`EMF_DROPPED`].
    pub fn background_stdout(namespace: impl Into<String>) -> Self {
        let mut meter = Self::new(namespace, None);
        let dropped = metrics::counter!(EMF_DROPPED);
        meter.emf = Some(Sink::Background(LineWriter::stdout(), Some(dropped)));
        meter
    }

    /// EMF lines to `sink` (or none at all). The `metrics` handles are
    /// registered here, so install a recorder (Prometheus) before this.
    pub fn new(namespace: impl Into<String>, sink: Option<Box<dyn Write + Send>>) -> Self {
        let namespace: Arc<str> = namespace.into().into();
        Self {
            directives: Arc::new(Directives::new(&namespace)),
            handles: Arc::new([ScopeHandles::new(Scope::Ip), ScopeHandles::new(Scope::Tid)]),
            levels: Arc::new(LevelMeter::new(&namespace, &Levels::default())),
            beds: Arc::new(BedMeter::new(&namespace)),
            refusals: Arc::default(),
            namespace,
            emf: sink.map(Sink::sync),
        }
    }

    /// The same meter with a series registered (at 0) for each configured
    /// network level (`config.policy.levels`), so a query on one has data
    /// before its first hit.
    pub fn with_levels(mut self, levels: &Levels) -> Self {
        self.levels = Arc::new(LevelMeter::new(&self.namespace, levels));
        self
    }

    /// Records one request's [`Exit`] in both exporters.
    pub fn record(&self, exit: &Exit) {
        let outcome = Outcome::of(exit.metered, exit.end);
        let handles = &self.handles[exit.scope.index()];
        for (handle, counter) in handles.counters.iter().zip(Counter::ALL) {
            handle.increment(counter.value(exit.metered, exit.end));
        }
        handles.requests[outcome.index()].increment(1);
        if let Metered::Counted {
            tier,
            delay,
            shadow,
            ..
        } = exit.metered
        {
            if shadow {
                for (handle, value) in handles.shadow.iter().zip(shadow_values(tier)) {
                    handle.increment(value);
                }
            }
            handles.delay.record(delay.as_millis() as f64);
        }
        self.write_emf(exit, outcome);
        if let Some(bed) = exit.bed {
            let line = self.beds.record(exit.scope, bed, exit.at.get());
            if let Some(sink) = &self.emf {
                sink.write(emf::with_trace(line, exit.trace));
            }
        }
        if let Some(hit) = LevelHit::of(exit.metered) {
            self.levels.increment(hit);
            if let Some(sink) = &self.emf {
                sink.write(emf::with_trace(
                    self.levels.line(hit, exit.at.get()),
                    exit.trace,
                ));
            }
        }
    }

    /// The request's EMF line; a refusal's only when its interval's line
    /// is due ([`refusals`]), and then for every refusal held. Any request
    /// writes the refusals held for its scope once they are due.
    fn write_emf(&self, exit: &Exit, outcome: Outcome) {
        let Some(sink) = &self.emf else { return };
        let refused = outcome == Outcome::BacklogFull;
        if refused {
            self.refusals.add(exit.scope);
        }
        let held = self.refusals.due(exit.scope, exit.at);
        self.write_refusals(sink, exit.scope, exit.at, held);
        if !refused {
            sink.write(self.emf_line(exit, outcome, 1));
        }
    }

    /// One EMF line for `held` refusals of `scope` (none for 0).
    fn write_refusals(&self, sink: &Sink, scope: Scope, at: UnixMillis, held: u64) {
        if held > 0 {
            let refusal = Exit {
                scope,
                metered: Metered::Uncounted,
                end: End::BacklogFull,
                at,
                bed: None,
                trace: None,
            };
            sink.write(self.emf_line(&refusal, Outcome::BacklogFull, held));
        }
    }

    /// Writes the refusals held for a later line ([`refusals`]) now, at
    /// `at`: for a process that stops.
    pub fn flush(&self, at: UnixMillis) {
        if let Some(sink) = &self.emf {
            for scope in Scope::ALL {
                self.write_refusals(sink, scope, at, self.refusals.take(scope));
            }
        }
    }

    /// Records one [`Event`] (an exempt scan, a `GET /quota`) of the
    /// request that arrived `at` in `trace`, in both exporters.
    pub fn record_event(&self, scope: Scope, event: Event, at: UnixMillis, trace: Option<TraceId>) {
        self.handles[scope.index()].events[event.index()].increment(1);
        if let Some(sink) = &self.emf {
            let directive = &self.directives.events[event.index()];
            let mut line = Line::start(at.get(), directive, "Scope", scope.as_str());
            line.number(event.metric(), 1u64);
            line.trace(trace);
            sink.write(line.finish());
        }
    }

    /// One EMF document for `requests` requests that left as `exit` did,
    /// whose outcome is `outcome` (more than one: refusals in aggregate).
    fn emf_line(&self, exit: &Exit, outcome: Outcome, requests: u64) -> String {
        let index = outcome.index();
        let directive = match exit.metered {
            Metered::Counted { shadow: true, .. } => &self.directives.shadow[index],
            Metered::Counted { .. } => &self.directives.decided[index],
            _ => &self.directives.undecided[index],
        };
        let mut line = Line::start(exit.at.get(), directive, "Scope", exit.scope.as_str());
        line.number(outcome.requests_metric(), requests);
        for counter in Counter::ALL {
            let value = counter.value(exit.metered, exit.end);
            line.number(counter.name(), value * requests);
        }
        match exit.metered {
            Metered::Counted {
                tier,
                delay,
                shadow,
                ..
            } => {
                if shadow {
                    for (name, value) in SHADOW_COUNTERS.iter().zip(shadow_values(tier)) {
                        line.number(name, value);
                    }
                    line.text("mode", "shadow");
                }
                // No decision, no delay sample: an outage must not drag p95 down.
                let delay = crate::rules::unix::duration_ms(delay);
                line.number(DELAY_MS, delay);
                line.text("tier", tier.as_str());
            }
            Metered::StoreFailed if exit.end != End::StoreRefused => {
                line.text("tier", "unmetered");
            }
            Metered::StoreFailed | Metered::Uncounted => {}
        }
        line.trace(exit.trace);
        line.finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::*;
    use crate::rules::decide::Tier;

    fn exit(scope: Scope, metered: Metered, end: End) -> Exit {
        Exit {
            scope,
            metered,
            end,
            at: UnixMillis(0),
            bed: None,
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
                for end in [
                    End::Answered,
                    End::StoreRefused,
                    End::BacklogFull,
                    End::QueueFailed,
                ] {
                    all.push(exit(scope, m, end));
                }
            }
        }
        all
    }

    fn line(meter: &Meter, e: &Exit) -> Value {
        let text = meter.emf_line(e, Outcome::of(e.metered, e.end), 1);
        serde_json::from_str(&text).unwrap()
    }

    /// Every line, whatever its outcome, has one directive whose Dimensions are exactly [["Scope"]], and no Outcome member.
    #[test]
    fn dimensions_are_scope_only() {
        let meter = Meter::new("StellaOps/Quota", None);
        let mut seen = Vec::new();
        for e in every_kind() {
            let doc = line(&meter, &e);
            let directives = doc["_aws"]["CloudWatchMetrics"].as_array().unwrap();
            assert_eq!(directives.len(), 1, "{doc}");
            assert_eq!(directives[0]["Dimensions"], json!([["Scope"]]), "{doc}");
            assert!(doc.get("Outcome").is_none(), "{doc}");
            seen.push(Outcome::of(e.metered, e.end));
        }
        for o in Outcome::ALL {
            assert!(seen.contains(&o), "{o:?} was not tried");
        }
    }

    /// A line names and carries the requests metric of its own outcome (value 1) and no other one.
    #[test]
    fn one_requests_metric_per_line() {
        let meter = Meter::new("ns", None);
        for e in every_kind() {
            let doc = line(&meter, &e);
            let own = Outcome::of(e.metered, e.end).requests_metric();
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
        let meter = Meter::new("StellaOps/Quota", None);
        for e in every_kind() {
            let doc = line(
                &meter,
                &Exit {
                    at: UnixMillis(1_796_032_800_000),
                    ..e
                },
            );
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
        let meter = Meter::new("ns", None);
        let hard = line(
            &meter,
            &exit(Scope::Ip, counted(Tier::Hard, 60_000, false), End::Answered),
        );
        assert_eq!(hard[HARD_HITS], 1);
        assert_eq!(hard[SOFT_HITS], 0);
        assert_eq!(hard[DELAY_MS], 60_000);
        assert_eq!(hard["tier"], "hard");
        let shadow = line(
            &meter,
            &exit(Scope::Ip, counted(Tier::Soft, 0, true), End::Answered),
        );
        assert_eq!(
            (
                shadow[SOFT_HITS].as_u64(),
                shadow[SHADOW_SOFT_HITS].as_u64()
            ),
            (Some(0), Some(1))
        );
        assert_eq!(shadow["mode"], "shadow");
        let open = line(
            &meter,
            &exit(Scope::Tid, Metered::StoreFailed, End::Answered),
        );
        assert_eq!(open[STORE_ERRORS], 1);
        assert_eq!(open["tier"], "unmetered");
        assert!(open.get(DELAY_MS).is_none());
        let closed = line(
            &meter,
            &exit(Scope::Tid, Metered::StoreFailed, End::StoreRefused),
        );
        assert_eq!(closed["stella_quota_requests_store_unavailable_total"], 1);
        assert!(closed.get("tier").is_none(), "{closed}");
        assert_eq!(closed["Scope"], "tid");
    }
}
