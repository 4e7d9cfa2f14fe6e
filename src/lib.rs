//! The daily free-tier quota gate in front of the Scanner API's `POST /scan`: it counts each scan
//! in Valkey in one round trip, paces callers over quota instead of refusing them, forwards
//! accepted scans to the scan queue and meters what it did as CloudWatch embedded-metric logs.
//!
//! Each folder is a floor importing only the floors below (`tests/it/architecture.rs` checks):
//!
//! | floor | folder | what it holds |
//! |---|---|---|
//! | 1 | [`rules`] | the pure rules and their types: [`rules::decide`] (count and limits in, tier and delay out), [`rules::level`] (the levels above a subject), [`rules::pace`], [`rules::delay`], [`rules::settle`] (what every failure and repeated key leads to), [`rules::record`], [`rules::job`] (the one job type), [`rules::trace`] (W3C and X-Ray trace context), [`rules::digest`], [`rules::unix`] instants, the store's circuit [`rules::breaker`] |
//! | 2 | [`config`] | every setting, read once at start, and [`config::secret_ref`], the grammar of a secret given by reference |
//! | 3 | [`io`] | the [`io::connection`] to Valkey, the [`io::store`] that counts, the [`io::queue`]s that carry jobs, the [`io::clock`], the [`io::meter`], the [`io::stdout`] line writer, the [`io::health`] answer of `/readyz`, and [`io::secrets`], which reads the configuration's secret references at start |
//! | 4 | [`gate`] | the request path behind one [`Gate::handle`] call: [`gate::validate`], [`gate::identity`], [`gate::idempotency`], [`gate::respond`], [`gate::quota_view`] (`GET /quota`), [`gate::trace`] (the request's trace and its steps' spans), [`gate::error`] (the one map from failures to HTTP statuses) |
//! | 4 | [`consume`] | `quota-gate consume`: holds each job until `notBefore`, runs each `scanId` once |
//! | 5 | [`front`] | the front ends: [`front::lambda`] (and the consumer's, [`front::lambda_consumer`]), [`front::serve`], [`front::cli`] and its operator tools, [`front::ops`] |
//!
//! `bugs` holds the switches that bring past bugs back for the simulators; only the `testing`
//! feature compiles it (elsewhere `bug!` is `false`).

/// Whether the past bug `$bug` is switched back on; `false` without the `testing` feature.
#[cfg(feature = "testing")]
macro_rules! bug {
    ($bug:ident) => {
        $crate::bugs::on($crate::bugs::Bug::$bug)
    };
}
#[cfg(not(feature = "testing"))]
macro_rules! bug {
    ($bug:ident) => {
        false
    };
}
pub(crate) use bug;

#[cfg(feature = "testing")]
pub mod bugs;
pub mod config;
pub mod consume;
pub mod front;
pub mod gate;
pub mod io;
pub mod rules;

pub use config::Config;
pub use gate::{Gate, GateRequest};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `tracing`'s plain lines (the default).
    Text,
    /// One JSON object a line, the event's fields at the top level and the current span's under
    /// `span`; each step's end (target [`gate::trace::STEP_TARGET`]) is a `close` line of its own.
    Json,
}

impl LogFormat {
    /// `QUOTA_LOG_FORMAT` (`text` or `json`, any case; unset: `text`); a bad value is an error.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// The same from a lookup function.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let name = config::vars::QUOTA_LOG_FORMAT.name;
        match lookup(name) {
            None => Ok(Self::Text),
            Some(v) if v.eq_ignore_ascii_case("text") => Ok(Self::Text),
            Some(v) if v.eq_ignore_ascii_case("json") => Ok(Self::Json),
            Some(v) => Err(format!("{name}={v:?}: expected json or text")),
        }
    }

    /// The Lambda function's format, from `AWS_LAMBDA_LOG_FORMAT` as `lambda_runtime` reads it. Its
    /// own subscriber is not used: it nests event fields under `fields` and lets SDK info through.
    pub fn lambda() -> Self {
        match std::env::var("AWS_LAMBDA_LOG_FORMAT") {
            Ok(v) if v.eq_ignore_ascii_case("json") => Self::Json,
            _ => Self::Text,
        }
    }
}

/// Logs to stderr (stdout carries EMF lines and spooled jobs). Never logs an IP, token or digest.
pub fn init_tracing(format: LogFormat) {
    init_tracing_with(format, std::io::stderr);
}

/// Logs to `writer` without ANSI colours; a second call does nothing.
pub fn init_tracing_with<W>(format: LogFormat, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Clone + Send + Sync + 'static,
{
    use tracing_subscriber::fmt::format::FmtSpan;
    use tracing_subscriber::prelude::*;
    let registry = tracing_subscriber::registry().with(log_filter());
    let _ = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(writer),
            )
            .try_init(),
        LogFormat::Json => {
            let json = || {
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(writer.clone())
            };
            // Events in every span, and a line at each step span's end (none at the request's own).
            let step_ends = json().with_span_events(FmtSpan::CLOSE).with_filter(
                tracing_subscriber::filter::filter_fn(|meta| {
                    meta.is_span() && meta.target() == gate::trace::STEP_TARGET
                }),
            );
            registry.with(json().and_then(step_ends)).try_init()
        }
    };
}

/// The log level: `AWS_LAMBDA_LOG_LEVEL` first (as the Lambda runtime takes it), else `RUST_LOG`,
/// else `info`; the AWS SDK's crates log only errors unless a directive names them.
pub fn log_filter() -> tracing_subscriber::EnvFilter {
    const QUIET_SDK: &str = "aws_config=error,aws_smithy_runtime=error,\
        aws_smithy_runtime_api=error,aws_sdk_cloudwatch=error,aws_sdk_sqs=error,\
        aws_sdk_sts=error,aws_sdk_sso=error,aws_sdk_secretsmanager=error,aws_sdk_ssm=error";
    let level = std::env::var("AWS_LAMBDA_LOG_LEVEL")
        .ok()
        .map(|l| lambda_level(&l))
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "info".to_owned());
    tracing_subscriber::EnvFilter::try_new(format!("{QUIET_SDK},{level}"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{QUIET_SDK},info")))
}

/// An `AWS_LAMBDA_LOG_LEVEL` as a directive: Lambda's `FATAL` is `error`.
fn lambda_level(level: &str) -> String {
    match level.to_ascii_lowercase().as_str() {
        "fatal" => "error".to_owned(),
        other => other.to_owned(),
    }
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

    /// Lambda's level words are directives; `FATAL` has no tracing level.
    #[test]
    fn lambda_levels() {
        assert_eq!(super::lambda_level("WARN"), "warn");
        assert_eq!(super::lambda_level("FATAL"), "error");
    }
}
