//! The integration tests, one crate: a module per area, each talking to
//! real parts (`valkey-server`, moto, stunnel, Prometheus, `quota-gate`
//! processes) through `quota-gate-testkit`. One binary, so the crate and
//! the AWS SDK are linked once.
//!
//! Two tests have a binary of their own, each for a reason it states in
//! its first lines: `tests/sqs_env.rs` sets process environment variables,
//! `tests/alloc_budget.rs` installs a counting global allocator.
//!
//! Run one area with `cargo test --test it <module>::`, e.g.
//! `cargo test --test it sim::`.

mod architecture;
mod bad_input;
mod chaos;
mod cluster;
mod config_ranges;
mod consume;
mod consume_clock;
mod consume_failover;
mod consume_faults;
mod consume_sim;
mod costs;
mod dashboards;
mod docs;
mod emf;
mod eviction;
mod failover;
mod idempotency;
mod lambda_consumer;
mod lambda_delays;
mod lambda_logs;
mod lanes;
mod levels_client;
mod markers;
mod metrics;
mod networks;
mod ops;
mod pacing;
mod protection;
mod quickstart;
mod quota_check;
mod request_path;
mod rollout;
mod scanner_descendants;
mod secrets;
mod selfhost;
mod serve;
mod sim;
mod sqs;
mod stall;
mod template;
mod tls;
mod token_levels;
mod tokens;
mod trace;
