//! The connection to the quota Valkey, standalone or cluster, plain or TLS.
//!
//! Built once per cold start (or per `serve` worker) and shared by the quota
//! store and the stream queue. Construction connects nothing, so a Lambda
//! whose Valkey is down still starts (and fails open or closed per request)
//! instead of crash-looping. A connector task, started at start-up by
//! [`Valkey::warm_up`] (or by the first command), connects in the background
//! and reconnects whenever the connection breaks.
//!
//! **Know what was sent.** [`Valkey::send`] says how a command failed
//! ([`SendError`]): never sent (no live connection within the caller's
//! timeout, a failed connect: it did not happen), sent and unanswered (it
//! may still run), or refused by the server. A command never waits on an
//! old connection attempt's error: a caller that finds no live connection
//! waits for the connector's next attempt, within its own timeout, and
//! wakes it from its backoff. A caller that times out does not cancel what
//! it sent: the command stays in flight in a task of its own. Nor does
//! the cluster client re-send one (no retries): a command is sent once or
//! not at all, so "unanswered" is the only case in which it may land.
//!
//! Scripts go as one `EVAL` each ([`eval`]). TLS is rustls, verified
//! against the platform's roots or only `VALKEY_TLS_CA`, never skipped.
//! With `VALKEY_AUTH=iam` each connection signs in with an ElastiCache IAM
//! token and renews it while it lives ([`iam`]).
//!
//! # Layout
//!
//! | file | what it holds |
//! |---|---|
//! | `connector.rs` | the [`Valkey`] handle and its connector task: connect, publish, reconnect |
//! | `send.rs` | waiting for a live connection and [`Valkey::send`]: the sent / never-sent protocol ([`SendError`]) |
//! | `command.rs` | the command builders ([`sized_cmd`], [`eval`]) |
//! | `memory.rs` | what the server says of its memory, off the request path: `INFO` from every primary, its eviction policy and evicted keys |
//! | `setup.rs` | building a handle from a URL or the configuration, TLS trust |
//! | `iam.rs` | ElastiCache IAM authentication: the token, the credentials it is signed with, renewing it on live connections |

mod command;
mod connector;
pub mod iam;
mod memory;
mod send;
mod setup;

#[cfg(test)]
pub(crate) use command::quoted_words;
pub use command::{eval, sized_cmd, wait};
pub use connector::{Connection, Valkey};
pub use memory::NodeInfo;
pub use send::{Refusal, Request, SendError, not_connected};
pub(crate) use setup::client_for;
