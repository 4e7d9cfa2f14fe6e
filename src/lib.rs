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
//! | 4 | [`store`] | INCR + EXPIREAT NX + SET NX + EXPIRETIME, one pipeline; a keyed scan's record |
//! | 5 | [`decide`] | pure: count and limits in, tier and delay out |
//! | 6 | [`store`], [`delay`] | pacing (`store::next_slot`), then sleep now and deferral on the job |
//! | 7 | [`queue`] | enqueues the scan job (SQS, Valkey stream, stdout spool) |
//! | 8 | [`respond`] | the 202 contract and the JSON errors |
//! | 9 | [`meter`] | EMF lines and Prometheus counters |
//!
//! [`gate`] strings the steps together behind one [`gate::Gate::handle`]
//! call, reading the [`clock`] once per request; [`idempotency`] checks the
//! `Idempotency-Key` whose record the store keeps; [`lambda`] and [`serve`]
//! adapt the gate to API Gateway events and to a local HTTP server.
//! [`config`] reads every setting once, at start, from one table of
//! variables ([`config::vars`]) into grouped settings, and settles the hash
//! secret; [`error`] is the one place that maps failures to HTTP statuses.
//!
//! Around the path: [`valkey`] is the lazy, shared connection (standalone or
//! cluster, TLS) used by the store and the stream queue; [`breaker`] skips a
//! failing store for a cool-down; [`stdout`] is the process's non-blocking
//! line writer (spooled jobs, EMF lines, `serve`'s logs); [`cli`] is the
//! `quota-gate` command and [`ops`] its operator tools (inspect, reset, purge, stats), which own what
//! only operators need: reading and removing keys, visiting every primary.

pub mod breaker;
pub mod cli;
pub mod clock;
pub mod config;
pub mod decide;
pub mod delay;
pub mod digest;
pub mod error;
pub mod gate;
pub mod idempotency;
pub mod identity;
pub mod lambda;
pub mod meter;
pub mod ops;
pub mod queue;
pub mod respond;
pub mod serve;
pub mod stdout;
pub mod store;
pub mod validate;
pub mod valkey;

pub use config::Config;
pub use gate::{Gate, GateRequest};

/// Logs to stderr (stdout carries EMF lines and spooled jobs), filtered by
/// [`log_filter`]. Never logs an IP, a token or a digest.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
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
