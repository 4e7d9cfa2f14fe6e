//! Step 9: what the gate did, as metrics.
//!
//! One call, [`Meter::record`], per counted request feeds two exporters:
//! a CloudWatch embedded-metric-format (EMF) line on stdout, which Lambda
//! ships to CloudWatch Logs and CloudWatch turns into metrics, and the
//! `metrics` facade, which `quota-gate serve` renders as Prometheus text at
//! `GET /metrics`. Every metric has the dimension `Scope` (`ip` or `tid`)
//! and no other (the spec's step 9): no per-client dimension, and no IP,
//! token or digest in any line. Every EMF line has one directive, whose
//! `Dimensions` are exactly `[["Scope"]]`.
//!
//! What a request came to (one of the eight [`OUTCOMES`]) is therefore not a
//! dimension but part of a metric's name: [`REQUESTS`] holds one Count per
//! outcome, `stella_quota_requests_<outcome>_total`, so a dashboard shows
//! requests by outcome by plotting the eight. A line names (and carries,
//! with the value 1) only the metric of its own outcome: EMF requires every
//! metric a directive names to be a member of the line, and a zero for the
//! seven others would only add bytes. In Prometheus they are eight counters
//! labelled `scope` only, like the other quota counters; there every series
//! exists from the start (at 0), so a query on any of them has data.
//!
//! The EMF line is written here rather than through an EMF crate: the crates
//! available aggregate in a process-global recorder and flush documents
//! later, while the gate wants one self-contained line per request that a
//! test can read back from one handler instance.
//!
//! Two ways out for the EMF line: a synchronous sink, written and flushed
//! before `record` returns (Lambda: the process is frozen after the response,
//! so the line must be out by then; tests read their capture sink back at
//! once), and the non-blocking [`LineWriter`] of `quota-gate serve`, where a
//! stdout nobody reads must never hold a request: when its queue is full the
//! line is dropped and counted in [`EMF_DROPPED`].

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::decide::Tier;
use crate::digest::Scope;
use crate::stdout::LineWriter;

pub const SOFT_HITS: &str = "stella_quota_soft_hits_total";
pub const HARD_HITS: &str = "stella_quota_hard_hits_total";
pub const REMINDERS: &str = "stella_quota_reminders_total";
pub const STORE_ERRORS: &str = "stella_quota_store_errors_total";
pub const ENQUEUE_ERRORS: &str = "stella_quota_enqueue_errors_total";
pub const BACKLOG_REFUSALS: &str = "stella_quota_backlog_refusals_total";
pub const DELAY_MS: &str = "stella_quota_delay_ms";
/// What enforcement would have done in shadow mode (`QUOTA_MODE=shadow`):
/// kept apart from [`SOFT_HITS`] and [`HARD_HITS`] so that the alarms tuned
/// for enforcement do not page during a rollout.
pub const SHADOW_SOFT_HITS: &str = "stella_quota_shadow_soft_hits_total";
pub const SHADOW_HARD_HITS: &str = "stella_quota_shadow_hard_hits_total";
/// The shadow counters, carried by every decided line in shadow mode.
pub const SHADOW_COUNTERS: [&str; 2] = [SHADOW_SOFT_HITS, SHADOW_HARD_HITS];
/// Scans from an exempt network or with an exempt token: never counted.
pub const EXEMPT: &str = "stella_quota_exempt_total";
/// `GET /quota` answers: reads that never touch the quota.
pub const CHECKS: &str = "stella_quota_checks_total";
/// What is metered on a line of its own, with no outcome (it reached no
/// counter): in [`Event`] order.
pub const EVENTS: [&str; 2] = [EXEMPT, CHECKS];
/// What a metered request came to: accepted in a tier, accepted without a
/// count (the store did not answer, fail-open), refused with the 503's
/// error code, or a repeat of an `Idempotency-Key` answered from its record
/// (the first answer replayed, 409 or 422; not counted again). Bad input is
/// never metered.
pub const OUTCOMES: [&str; 8] = [
    "within",
    "soft",
    "hard",
    "unmetered",
    "backlog_full",
    "store_unavailable",
    "queue_unavailable",
    "repeat",
];
/// Every metered request, one Count per outcome, in [`OUTCOMES`] order:
/// `stella_quota_requests_<outcome>_total`.
pub const REQUESTS: [&str; 8] = [
    "stella_quota_requests_within_total",
    "stella_quota_requests_soft_total",
    "stella_quota_requests_hard_total",
    "stella_quota_requests_unmetered_total",
    "stella_quota_requests_backlog_full_total",
    "stella_quota_requests_store_unavailable_total",
    "stella_quota_requests_queue_unavailable_total",
    "stella_quota_requests_repeat_total",
];
/// What each of [`REQUESTS`] counts, for its `# HELP` line.
const REQUESTS_HELP: [&str; 8] = [
    "Scans accepted within the daily quota.",
    "Scans accepted in the soft window (soft delay).",
    "Scans accepted beyond the soft window (hard delay).",
    "Scans accepted without a count: the quota store did not answer (fail-open).",
    "Scans refused with 503 backlog_full.",
    "Scans refused with 503 store_unavailable (fail-closed, or a keyed scan whose count is unknown).",
    "Scans refused with 503 queue_unavailable.",
    "Repeats of an Idempotency-Key answered from its record (not counted again).",
];
/// EMF lines dropped because the output queue was full (`serve` only): a
/// stdout reader that is slow or gone.
pub const EMF_DROPPED: &str = "stella_quota_emf_dropped_total";

/// Resident memory of the process, in bytes (`serve`'s `/metrics` only).
pub const PROCESS_RSS: &str = "process_resident_memory_bytes";
/// Open file descriptors of the process (`serve`'s `/metrics` only): the
/// open client connections plus a fixed handful (the listening socket,
/// stdio, the Valkey connections).
pub const PROCESS_OPEN_FDS: &str = "process_open_fds";

/// Every counter, in EMF declaration order.
pub const COUNTERS: [&str; 6] = [
    SOFT_HITS,
    HARD_HITS,
    REMINDERS,
    STORE_ERRORS,
    ENQUEUE_ERRORS,
    BACKLOG_REFUSALS,
];

/// `# HELP` text for `GET /metrics`, so a scraper's UI says what each series
/// counts. Called once the recorder is installed (descriptions sent before
/// that are lost).
pub fn describe() {
    metrics::describe_counter!(
        SOFT_HITS,
        "Scans over the daily quota, within the soft window (soft delay)."
    );
    metrics::describe_counter!(HARD_HITS, "Scans beyond the soft window (hard delay).");
    metrics::describe_counter!(
        REMINDERS,
        "Scans answered with the soft reminder (count at or above QUOTA_WARN_AT)."
    );
    metrics::describe_counter!(
        STORE_ERRORS,
        "Scans the quota store could not count (timeout, error, open breaker)."
    );
    metrics::describe_counter!(
        ENQUEUE_ERRORS,
        "Scans refused with 503 because the scan queue failed."
    );
    metrics::describe_counter!(
        BACKLOG_REFUSALS,
        "Scans refused with 503 backlog_full: the paced delay would exceed QUOTA_MAX_BACKLOG_MS."
    );
    for (name, help) in REQUESTS.iter().zip(REQUESTS_HELP) {
        metrics::describe_counter!(*name, help);
    }
    metrics::describe_counter!(
        SHADOW_SOFT_HITS,
        "Shadow mode: scans enforcement would have given the soft delay (none was given)."
    );
    metrics::describe_counter!(
        SHADOW_HARD_HITS,
        "Shadow mode: scans enforcement would have given the hard delay (none was given)."
    );
    metrics::describe_counter!(
        EXEMPT,
        "Exempt scans (QUOTA_EXEMPT_NETWORKS or QUOTA_EXEMPT_CLAIM): queued, never counted."
    );
    metrics::describe_counter!(
        CHECKS,
        "GET /quota answers (the quota is read, never spent)."
    );
    metrics::describe_counter!(
        EMF_DROPPED,
        "EMF lines dropped because standard output was not read fast enough."
    );
    metrics::describe_gauge!(
        PROCESS_RSS,
        metrics::Unit::Bytes,
        "Resident memory of the process (VmRSS), sampled at each scrape."
    );
    metrics::describe_gauge!(
        PROCESS_OPEN_FDS,
        "Open file descriptors: the open client connections plus a fixed handful."
    );
    metrics::describe_histogram!(
        DELAY_MS,
        metrics::Unit::Milliseconds,
        "Delay owed per decided scan (slept plus deferred), in milliseconds."
    );
}

/// Something metered besides a counted scan: one line, one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// An exempt scan, queued uncounted ([`EXEMPT`]).
    Exempt,
    /// A `GET /quota` answer ([`CHECKS`]).
    Check,
}

impl Event {
    fn index(self) -> usize {
        match self {
            Self::Exempt => 0,
            Self::Check => 1,
        }
    }
}

/// Sets [`PROCESS_RSS`] and [`PROCESS_OPEN_FDS`] from `/proc/self`, for a
/// scrape about to be rendered. The names are those of Prometheus's own
/// process collectors, so stock dashboards find them. Elsewhere than Linux
/// nothing is set.
pub fn sample_process() {
    let rss_kib = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        });
    if let Some(kib) = rss_kib {
        metrics::gauge!(PROCESS_RSS).set((kib * 1024) as f64);
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        metrics::gauge!(PROCESS_OPEN_FDS).set(fds.count() as f64);
    }
}

/// How one scan request that reached the store left the gate: what the
/// store made of it and how it ended. The gate returns one from its request
/// path; [`Meter::record`] maps it to an [`Outcome`], once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub scope: Scope,
    pub metered: Metered,
    pub end: End,
}

/// What the store made of a scan request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metered {
    /// Counted and decided: its tier, whether it carries the reminder, and
    /// the whole delay it owes (in shadow mode, what it would have owed).
    Counted {
        tier: Tier,
        reminder: bool,
        delay: Duration,
        shadow: bool,
    },
    /// The count failed (refused, or accepted unmetered).
    StoreFailed,
    /// No count of its own stands: a repeat of a key (its first attempt
    /// was counted), or a count taken back (backlog full).
    Uncounted,
}

/// How a scan request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// 202, or a replayed or refused repeat of a key (409, 422).
    Answered,
    /// 503 `store_unavailable` or `store_unsettled`.
    StoreRefused,
    /// 503 `backlog_full`.
    BacklogFull,
    /// 503 `queue_unavailable`.
    QueueFailed,
}

impl From<&Exit> for Outcome {
    fn from(exit: &Exit) -> Self {
        let mut outcome = Self::new(exit.scope);
        match exit.metered {
            Metered::Counted {
                tier,
                reminder,
                delay,
                shadow,
            } => {
                outcome.tier = Some(tier);
                outcome.reminder = reminder;
                outcome.delay = delay;
                outcome.shadow = shadow;
            }
            Metered::StoreFailed => {
                outcome.store_error = true;
                outcome.unmetered = exit.end != End::StoreRefused;
            }
            Metered::Uncounted => {}
        }
        outcome.backlog_refused = exit.end == End::BacklogFull;
        outcome.enqueue_error = exit.end == End::QueueFailed;
        outcome
    }
}

/// The meter's flat view of an [`Exit`]: what each counter and the EMF
/// line read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub scope: Scope,
    /// The decided tier; `None` when no decision was made (the store did
    /// not answer, or the scan was refused).
    pub tier: Option<Tier>,
    /// Accepted while the store did not answer: `"tier":"unmetered"`.
    pub unmetered: bool,
    /// Refused with 503 `backlog_full`.
    pub backlog_refused: bool,
    pub reminder: bool,
    /// The whole delay owed (slept and deferred).
    pub delay: Duration,
    pub store_error: bool,
    pub enqueue_error: bool,
    /// Decided in shadow mode: its soft or hard tier is metered under
    /// [`SHADOW_COUNTERS`], and it counts as accepted `within` (it waited
    /// for nothing).
    pub shadow: bool,
}

impl Outcome {
    /// A request the store could not answer (or refused before deciding).
    pub fn new(scope: Scope) -> Self {
        Self {
            scope,
            tier: None,
            unmetered: false,
            backlog_refused: false,
            reminder: false,
            delay: Duration::ZERO,
            store_error: false,
            enqueue_error: false,
            shadow: false,
        }
    }

    /// What the request came to: one of [`OUTCOMES`]. A refusal wins over
    /// the tier it had been given (a soft scan whose enqueue failed was
    /// refused, not slowed).
    pub fn outcome(&self) -> &'static str {
        OUTCOMES[self.outcome_index()]
    }

    /// The one of [`REQUESTS`] this request counts in.
    pub fn requests_metric(&self) -> &'static str {
        REQUESTS[self.outcome_index()]
    }

    /// The position of [`Outcome::outcome`] in [`OUTCOMES`].
    fn outcome_index(&self) -> usize {
        match (self.enqueue_error, self.backlog_refused, self.tier) {
            (true, ..) => 6,
            (false, true, _) => 4,
            (false, false, Some(_)) if self.shadow => 0,
            (false, false, Some(Tier::Within)) => 0,
            (false, false, Some(Tier::Soft)) => 1,
            (false, false, Some(Tier::Hard)) => 2,
            (false, false, None) if self.unmetered => 3,
            (false, false, None) if self.store_error => 5,
            (false, false, None) => 7,
        }
    }

    fn counter_values(&self) -> [u64; 6] {
        [
            u64::from(self.tier == Some(Tier::Soft) && !self.shadow),
            u64::from(self.tier == Some(Tier::Hard) && !self.shadow),
            u64::from(self.reminder),
            u64::from(self.store_error),
            u64::from(self.enqueue_error),
            u64::from(self.backlog_refused),
        ]
    }

    /// [`SHADOW_COUNTERS`]' values: what enforcement would have counted.
    fn shadow_values(&self) -> [u64; 2] {
        [
            u64::from(self.shadow && self.tier == Some(Tier::Soft)),
            u64::from(self.shadow && self.tier == Some(Tier::Hard)),
        ]
    }
}

/// Where EMF lines go.
#[derive(Clone)]
enum Sink {
    /// Written and flushed before `record` returns.
    Sync(Arc<Mutex<Box<dyn Write + Send>>>),
    /// Queued for a writer thread; dropped (and counted) when the queue is full.
    Background(LineWriter, metrics::Counter),
}

/// Records outcomes to the EMF sink and the `metrics` facade.
#[derive(Clone)]
pub struct Meter {
    directives: Arc<Directives>,
    /// Handles registered once per scope: a lookup per call would cost the
    /// recorder a key hash and a map probe per metric per request.
    handles: Arc<[ScopeHandles; 2]>,
    emf: Option<Sink>,
}

/// The `metrics` handles of one scope.
struct ScopeHandles {
    counters: [metrics::Counter; 6],
    delay: metrics::Histogram,
    /// [`REQUESTS`], in [`OUTCOMES`] order.
    requests: [metrics::Counter; 8],
    shadow: [metrics::Counter; 2],
    /// [`EVENTS`].
    events: [metrics::Counter; 2],
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
/// never changes after start, and building it per request was half of the
/// gate's own CPU.
struct Directives {
    /// For a decided request, per outcome: the counters, the outcome's
    /// [`REQUESTS`] metric and the delay sample.
    decided: [String; 8],
    /// For a request the store could not count, per outcome: the counters
    /// and the outcome's [`REQUESTS`] metric.
    undecided: [String; 8],
    /// For a request decided in shadow mode: as `decided`, plus [`SHADOW_COUNTERS`].
    shadow: [String; 8],
    /// For an [`Event`]: its one counter.
    events: [String; 2],
}

impl Directives {
    fn new(namespace: &str) -> Self {
        let declare = |metrics: Vec<Value>| {
            json!([{"Namespace": namespace, "Dimensions": [["Scope"]], "Metrics": metrics}])
                .to_string()
        };
        let count = |n: &str| json!({"Name": n, "Unit": "Count"});
        let directive = |with_delay: bool, shadow: bool, requests: &str| {
            let mut metrics: Vec<Value> = COUNTERS.iter().map(|n| count(n)).collect();
            if shadow {
                metrics.extend(SHADOW_COUNTERS.iter().map(|n| count(n)));
            }
            metrics.push(count(requests));
            if with_delay {
                metrics.push(json!({"Name": DELAY_MS, "Unit": "Milliseconds"}));
            }
            declare(metrics)
        };
        Self {
            decided: REQUESTS.map(|r| directive(true, false, r)),
            undecided: REQUESTS.map(|r| directive(false, false, r)),
            shadow: REQUESTS.map(|r| directive(true, true, r)),
            events: EVENTS.map(|e| declare(vec![count(e)])),
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
        Self::with_writer(namespace, LineWriter::stdout())
    }

    /// EMF lines through `writer`, dropped and counted when it is full.
    pub fn with_writer(namespace: impl Into<String>, writer: LineWriter) -> Self {
        let mut meter = Self::new(namespace, None);
        meter.emf = Some(Sink::Background(writer, metrics::counter!(EMF_DROPPED)));
        meter
    }

    /// EMF lines to `sink` (or none at all). The `metrics` handles are
    /// registered here, so install a recorder (Prometheus) before this.
    pub fn new(namespace: impl Into<String>, sink: Option<Box<dyn Write + Send>>) -> Self {
        Self {
            directives: Arc::new(Directives::new(&namespace.into())),
            handles: Arc::new([ScopeHandles::new(Scope::Ip), ScopeHandles::new(Scope::Tid)]),
            emf: sink.map(|s| Sink::Sync(Arc::new(Mutex::new(s)))),
        }
    }

    /// Records one outcome in both exporters.
    pub fn record(&self, exit: &Exit) {
        self.record_outcome(&Outcome::from(exit));
    }

    fn record_outcome(&self, outcome: &Outcome) {
        let handles = &self.handles[scope_index(outcome.scope)];
        for (counter, value) in handles.counters.iter().zip(outcome.counter_values()) {
            counter.increment(value);
        }
        for (counter, value) in handles.shadow.iter().zip(outcome.shadow_values()) {
            counter.increment(value);
        }
        handles.requests[outcome.outcome_index()].increment(1);
        if outcome.tier.is_some() {
            handles.delay.record(outcome.delay.as_millis() as f64);
        }
        if self.emf.is_some() {
            let line = self.emf_line(outcome, now_ms());
            self.write(line);
        }
    }

    /// Records one [`Event`] (an exempt scan, a `GET /quota`) in both exporters.
    pub fn record_event(&self, scope: Scope, event: Event) {
        self.handles[scope_index(scope)].events[event.index()].increment(1);
        if self.emf.is_some() {
            let line = self.event_line(scope, event, now_ms());
            self.write(line);
        }
    }

    /// The EMF document of one [`Event`] at `timestamp_ms`.
    pub fn event_line(&self, scope: Scope, event: Event, timestamp_ms: u64) -> String {
        format!(
            r#"{{"_aws":{{"Timestamp":{timestamp_ms},"CloudWatchMetrics":{}}},"Scope":"{}","{}":1}}"#,
            self.directives.events[event.index()],
            scope.as_str(),
            EVENTS[event.index()]
        )
    }

    /// Writes one EMF line to the sink.
    fn write(&self, mut line: String) {
        line.push('\n');
        if let Some(sink) = &self.emf {
            match sink {
                Sink::Sync(out) => {
                    if let Ok(mut out) = out.lock() {
                        // Metrics are best effort: a closed stdout must not fail a scan.
                        let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
                    }
                }
                Sink::Background(writer, dropped) => {
                    if writer.try_line(line.into_bytes()).is_err() {
                        dropped.increment(1);
                    }
                }
            }
        }
    }

    /// One EMF document for `outcome` at `timestamp_ms`. Every value written
    /// here is a number or one of our own ASCII names, so nothing needs escaping.
    pub fn emf_line(&self, outcome: &Outcome, timestamp_ms: u64) -> String {
        let index = outcome.outcome_index();
        let directive = match outcome.tier {
            Some(_) if outcome.shadow => &self.directives.shadow[index],
            Some(_) => &self.directives.decided[index],
            None => &self.directives.undecided[index],
        };
        // Pieces pushed in turn, numbers by `itoa`: one line per request,
        // written without going through `fmt` for every piece.
        let mut digits = itoa::Buffer::new();
        let mut line = String::with_capacity(directive.len() + 320);
        for piece in [
            r#"{"_aws":{"Timestamp":"#,
            digits.format(timestamp_ms),
            r#","CloudWatchMetrics":"#,
            directive,
            r#"},"Scope":""#,
            outcome.scope.as_str(),
            r#"",""#,
            REQUESTS[index],
            r#"":1"#,
        ] {
            line.push_str(piece);
        }
        let mut field = |line: &mut String, name: &str, value: u64| {
            for piece in [r#",""#, name, r#"":"#, digits.format(value)] {
                line.push_str(piece);
            }
        };
        for (name, value) in COUNTERS.iter().zip(outcome.counter_values()) {
            field(&mut line, name, value);
        }
        if outcome.shadow && outcome.tier.is_some() {
            for (name, value) in SHADOW_COUNTERS.iter().zip(outcome.shadow_values()) {
                field(&mut line, name, value);
            }
            line.push_str(r#","mode":"shadow""#);
        }
        if let Some(tier) = outcome.tier {
            // No decision, no delay sample: an outage must not drag p95 down.
            let delay = u64::try_from(outcome.delay.as_millis()).unwrap_or(u64::MAX);
            field(&mut line, DELAY_MS, delay);
            for piece in [r#","tier":""#, tier.as_str(), "\""] {
                line.push_str(piece);
            }
        } else if outcome.unmetered {
            line.push_str(r#","tier":"unmetered""#);
        }
        line.push('}');
        line
    }
}

fn scope_index(scope: Scope) -> usize {
    match scope {
        Scope::Ip => 0,
        Scope::Tid => 1,
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(tier: Option<Tier>, delay_ms: u64) -> Outcome {
        Outcome {
            tier,
            unmetered: tier.is_none(),
            delay: Duration::from_millis(delay_ms),
            store_error: tier.is_none(),
            ..Outcome::new(Scope::Ip)
        }
    }

    /// One line of each outcome, in each scope, with and without a decision.
    fn every_kind() -> Vec<Outcome> {
        let mut all = Vec::new();
        for scope in [Scope::Ip, Scope::Tid] {
            for tier in [None, Some(Tier::Within), Some(Tier::Soft), Some(Tier::Hard)] {
                for flags in 0..8u8 {
                    all.push(Outcome {
                        tier,
                        unmetered: tier.is_none() && flags & 1 != 0,
                        store_error: flags & 2 != 0,
                        enqueue_error: flags & 4 != 0,
                        backlog_refused: tier.is_none() && flags == 0 && scope == Scope::Tid,
                        ..Outcome::new(scope)
                    });
                }
            }
        }
        all
    }

    /// Every line, whatever its outcome, has one directive whose Dimensions are exactly [["Scope"]], and no Outcome member.
    #[test]
    fn dimensions_are_scope_only() {
        let meter = Meter::new("StellaOps/Quota", None);
        let mut seen = std::collections::BTreeSet::new();
        for o in every_kind() {
            let doc: Value = serde_json::from_str(&meter.emf_line(&o, 0)).unwrap();
            let directives = doc["_aws"]["CloudWatchMetrics"].as_array().unwrap();
            assert_eq!(directives.len(), 1, "{doc}");
            for d in directives {
                assert_eq!(d["Dimensions"], json!([["Scope"]]), "{doc}");
            }
            assert!(doc.get("Outcome").is_none(), "{doc}");
            seen.insert(o.outcome());
        }
        assert_eq!(seen.len(), OUTCOMES.len(), "every outcome was tried");
    }

    /// A line names and carries the requests metric of its own outcome (value 1) and no other one.
    #[test]
    fn one_requests_metric_per_line() {
        for (name, outcome) in REQUESTS.iter().zip(OUTCOMES) {
            assert_eq!(*name, format!("stella_quota_requests_{outcome}_total"));
        }
        let meter = Meter::new("ns", None);
        for o in every_kind() {
            let doc: Value = serde_json::from_str(&meter.emf_line(&o, 0)).unwrap();
            let named: Vec<&str> = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["Name"].as_str().unwrap())
                .filter(|n| REQUESTS.contains(n))
                .collect();
            assert_eq!(named, [o.requests_metric()], "{doc}");
            assert_eq!(doc[o.requests_metric()], 1);
            for other in REQUESTS.iter().filter(|n| **n != o.requests_metric()) {
                assert!(doc.get(*other).is_none(), "{other} in {doc}");
            }
        }
    }

    /// Each declared metric and dimension is a top-level member, per the EMF spec.
    #[test]
    fn emf_structure() {
        let meter = Meter::new("StellaOps/Quota", None);
        for o in [
            outcome(Some(Tier::Within), 0),
            outcome(Some(Tier::Soft), 5000),
            outcome(None, 0),
        ] {
            let doc: Value = serde_json::from_str(&meter.emf_line(&o, 1_796_032_800_000)).unwrap();
            let aws = &doc["_aws"];
            assert_eq!(aws["Timestamp"], 1_796_032_800_000u64);
            let directive = &aws["CloudWatchMetrics"][0];
            assert_eq!(directive["Namespace"], "StellaOps/Quota");
            assert_eq!(directive["Dimensions"], json!([["Scope"]]));
            assert_eq!(doc["Scope"], "ip");
            for m in directive["Metrics"].as_array().unwrap() {
                let name = m["Name"].as_str().unwrap();
                assert!(doc[name].is_number(), "{name} missing");
            }
        }
    }

    /// Soft and hard tiers and the delay show in the values.
    #[test]
    fn values() {
        let meter = Meter::new("ns", None);
        let doc: Value =
            serde_json::from_str(&meter.emf_line(&outcome(Some(Tier::Hard), 60_000), 0)).unwrap();
        assert_eq!(doc[HARD_HITS], 1);
        assert_eq!(doc[SOFT_HITS], 0);
        assert_eq!(doc[DELAY_MS], 60_000);
        let doc: Value = serde_json::from_str(&meter.emf_line(&outcome(None, 0), 0)).unwrap();
        assert_eq!(doc[STORE_ERRORS], 1);
        assert_eq!(doc["tier"], "unmetered");
        assert!(doc.get(DELAY_MS).is_none());
    }

    /// Each kind of request maps to its outcome; a refusal wins over the tier.
    #[test]
    fn outcomes() {
        let refused = |f: fn(&mut Outcome)| {
            let mut o = outcome(Some(Tier::Soft), 5000);
            f(&mut o);
            o.outcome()
        };
        assert_eq!(outcome(Some(Tier::Within), 0).outcome(), "within");
        assert_eq!(outcome(Some(Tier::Hard), 0).outcome(), "hard");
        assert_eq!(outcome(None, 0).outcome(), "unmetered");
        assert_eq!(refused(|o| o.enqueue_error = true), "queue_unavailable");
        let closed = Outcome {
            store_error: true,
            ..Outcome::new(Scope::Tid)
        };
        assert_eq!(closed.outcome(), "store_unavailable");
        let backlog = Outcome {
            backlog_refused: true,
            ..Outcome::new(Scope::Ip)
        };
        assert_eq!(backlog.outcome(), "backlog_full");
        assert_eq!(Outcome::new(Scope::Ip).outcome(), "repeat");
        assert_eq!(refused(|o| o.backlog_refused = true), "backlog_full");
        let doc: Value =
            serde_json::from_str(&Meter::new("ns", None).emf_line(&closed, 0)).unwrap();
        assert_eq!(
            closed.requests_metric(),
            "stella_quota_requests_store_unavailable_total"
        );
        assert_eq!(doc[closed.requests_metric()], 1);
        assert_eq!(doc["Scope"], "tid");
    }
}
