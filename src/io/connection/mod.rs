//! The connection to the quota Valkey, standalone or cluster, plain or TLS.
//!
//! Built once per cold start (or `serve` worker) and shared by the quota store and the stream
//! queue. Construction connects nothing, so a Lambda whose Valkey is down still starts; a
//! connector task ([`Valkey::warm_up`], or the first command) connects in the background and
//! reconnects whenever the connection breaks.
//!
//! [`Valkey::send`] says how a command failed ([`SendError`]): never sent (it did not happen),
//! sent and unanswered (it may still run), or refused. A timed-out caller does not cancel what it
//! sent, and nothing is re-sent, so "unanswered" is the only case in which a failed command may
//! land. Scripts go as one `EVAL` each ([`eval`]); TLS is always verified.

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
