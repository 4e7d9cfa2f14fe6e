//! # quota-gate
//!
//! The daily free-tier quota gate in front of the Scanner API's `POST /scan`.
//! It counts each scan in Valkey with one round trip of plain commands, slows
//! callers who are over quota instead of refusing them (paced, so a parallel
//! burst waits in line), forwards every accepted scan to the scan queue and
//! meters what it did as CloudWatch embedded-metric logs.
//!
//! # Layout
//!
//! The modules follow the request path, in order:
//!
//! | step | module | what it does |
//! |---|---|---|
//! | 1 | [`validate`] | `POST /scan`, a JSON object with a non-empty `image` |
//! | 2 | [`identity`] | token (`tid`) or normalised source IP; never a client header |
//! | 3 | [`digest`] | keyed HMAC-SHA256 of scope and material |
//! | 4 | [`store`] | INCR + EXPIREAT NX + SET NX + EXPIRETIME, one pipeline; a keyed scan's [`record`] |
//! | 5 | [`decide`] | pure: count and limits in, tier and delay out |
//! | 6 | [`pace`], [`delay`] | pure: the pacing slot ([`pace::next_slot`], which the store applies), then sleep now and deferral on the job |
//! | 7 | [`queue`], [`job`] | enqueues the scan job (SQS, Valkey stream, stdout spool); [`job::ScanJob`] is the one job type |
//! | 8 | [`respond`] | the 202 contract and the JSON errors |
//! | — | [`check`] | `GET /quota`: the quota and the next scan's tier and delay, read in one round trip, nothing spent |
//! | 9 | [`meter`], [`outcome`] | EMF lines and Prometheus counters, from the gate's one [`meter::Exit`] per scan and its one [`outcome::Outcome`] |
//! | after | [`consume`] | `quota-gate consume`: holds each job until `notBefore`, runs each `scanId` once |
//!
//! The floors: the pure rules and types ([`decide`], [`delay`], [`outcome`],
//! [`pace`], [`record`], [`settle`], [`eviction`], the instant types of [`unix`], the
//! cluster [`hash_tag`] rule, the store's circuit [`breaker`] (told the
//! time, it reads no clock), and the one-word settings of [`config::words`])
//! import no I/O crate and no module above them; the modules that talk to
//! Valkey, SQS or a socket build on them; [`gate`] drives them; [`lambda`],
//! [`serve`] and [`cli`] sit on top. No module imports one that imports it
//! (`tests/architecture.rs` checks all three, and that no function is over
//! 60 lines).
//!
//! [`gate`] strings the steps together behind one [`gate::Gate::handle`]
//! call, reading the [`clock`] once per request: `gate/path.rs` is the
//! driver, top to bottom, and returns one [`meter::Exit`]; `attempt.rs`
//! the request and the scan, `settlement.rs` the writes after a failure,
//! `quota.rs` the two requests that never count, `wiring.rs` the backends.
//! It is the I/O driver only: what every failure and every repeated key
//! leads to is decided by the pure rules of [`settle`]; [`idempotency`]
//! checks the `Idempotency-Key` whose record the store keeps; [`lambda`]
//! and [`serve`] adapt the gate to API Gateway events and to a local HTTP
//! server. [`config`] reads every setting once, at start, from one table of
//! variables ([`config::vars`]) into grouped settings, and settles the hash
//! secret; [`error`] is the one place that maps failures to HTTP statuses.
//!
//! Around the path: [`connection`] is the shared connection to Valkey (standalone or
//! cluster, TLS) used by the store and the stream queue; `bugs` holds the test-only switches
//! that bring past bugs back for the simulators, compiled only with the `sim-bugs` feature
//! that the test harness turns on (elsewhere `bug!` is `false`); [`stdout`] is the process's non-blocking
//! line writer (spooled jobs, EMF lines, `serve`'s logs), a writer thread on
//! the I/O floor beside the connection; [`eviction_watch`] reads the
//! store's eviction policy at start (said, metered, or the start refused)
//! and its evicted keys during the run, off the request path; [`cli`] is the
//! `quota-gate` command and [`ops`] its operator tools (inspect, reset, purge, stats), which own what
//! only operators need: reading and removing keys, visiting every primary.

/// Whether the past bug `$bug` (a `bugs::Bug` variant) is switched back
/// on: the simulators' switch, with the `sim-bugs` feature only. A build
/// without it (every release and Lambda build) has no switch: this is
/// `false`, and the branch it guards compiles away.
#[cfg(feature = "sim-bugs")]
macro_rules! bug {
    ($bug:ident) => {
        $crate::bugs::on($crate::bugs::Bug::$bug)
    };
}
#[cfg(not(feature = "sim-bugs"))]
macro_rules! bug {
    ($bug:ident) => {
        false
    };
}
pub(crate) use bug;

pub mod breaker;
#[cfg(feature = "sim-bugs")]
pub mod bugs;
pub mod check;
pub mod cli;
pub mod clock;
pub mod config;
pub mod connection;
pub mod consume;
pub mod decide;
pub mod delay;
pub mod digest;
pub mod error;
pub mod eviction;
pub mod eviction_watch;
pub mod gate;
pub mod hash_tag;
pub mod idempotency;
pub mod identity;
pub mod job;
pub mod lambda;
pub mod level;
pub mod meter;
pub mod ops;
pub mod outcome;
pub mod pace;
pub mod queue;
pub mod record;
pub mod respond;
pub mod serve;
pub mod settle;
pub mod stdout;
pub mod store;
pub mod unix;
pub mod validate;

pub use config::Config;
pub use gate::{Gate, GateRequest};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `tracing`'s plain lines (the default).
    Text,
    /// One JSON object a line: `timestamp`, `level`, the event's fields at
    /// the top level (`message`, `error`, `code`, …) and `span`, the
    /// current span's fields, so under Lambda every line carries the
    /// runtime's `span.requestId`.
    Json,
}

impl LogFormat {
    /// `QUOTA_LOG_FORMAT` (`text` or `json`, any case; unset: `text`), as
    /// `quota-gate` reads it. A bad value is an error naming the variable.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The same from a lookup function (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let name = config::vars::QUOTA_LOG_FORMAT.row.name;
        match lookup(name) {
            None => Ok(Self::Text),
            Some(v) if v.eq_ignore_ascii_case("text") => Ok(Self::Text),
            Some(v) if v.eq_ignore_ascii_case("json") => Ok(Self::Json),
            Some(v) => Err(format!("{name}={v:?}: expected json or text")),
        }
    }

    /// The Lambda function's log format, from `AWS_LAMBDA_LOG_FORMAT`, which
    /// Lambda sets from the function's `LoggingConfig` (`JSON` or `Text`),
    /// read as `lambda_runtime`'s own subscriber reads it: `JSON` in any
    /// case is JSON, anything else text.
    pub fn lambda() -> Self {
        match std::env::var("AWS_LAMBDA_LOG_FORMAT") {
            Ok(v) if v.eq_ignore_ascii_case("json") => Self::Json,
            _ => Self::Text,
        }
    }
}

/// Logs to stderr (stdout carries EMF lines and spooled jobs) in `format`,
/// filtered by [`log_filter`]. Never logs an IP, a token or a digest.
pub fn init_tracing(format: LogFormat) {
    init_tracing_with(format, std::io::stderr);
}

/// Logs to `writer` in `format`, filtered by [`log_filter`], without ANSI
/// colours. A second call does nothing.
pub fn init_tracing_with<W>(format: LogFormat, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_ansi(false)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
}

/// `RUST_LOG`, or by default `info`, with the AWS SDK's own chatter only from
/// `error`.
pub fn log_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "info,aws_config=error,aws_smithy_runtime=error,aws_smithy_runtime_api=error,\
             aws_sdk_cloudwatch=error,aws_sdk_sqs=error,aws_sdk_sts=error,aws_sdk_sso=error",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::LogFormat;

    /// `QUOTA_LOG_FORMAT` takes `json` or `text` in any case, defaults to
    /// text, and names itself when it is anything else.
    #[test]
    fn log_format() {
        let with = |v: &str| {
            let v = v.to_owned();
            LogFormat::from_lookup(move |k| (k == "QUOTA_LOG_FORMAT").then(|| v.clone()))
        };
        assert_eq!(LogFormat::from_lookup(|_| None), Ok(LogFormat::Text));
        assert_eq!(with("JSON"), Ok(LogFormat::Json));
        assert_eq!(with("text"), Ok(LogFormat::Text));
        assert!(with("xml").unwrap_err().contains("QUOTA_LOG_FORMAT"));
    }
}
