//! The floor that talks to the world: the connection to Valkey, the quota
//! store and the scan queues on it (and on SQS and stdout), the clock, the
//! process's line writer and the meter that writes through it, the
//! readiness answer of the long-running commands ([`health`]), and the
//! secret stores the configuration's references are read from at start.
//!
//! These build on the [rules](crate::rules) and the
//! [configuration](crate::config), and know nothing of a request.

pub mod clock;
pub mod connection;
pub mod eviction_watch;
pub mod health;
pub mod meter;
pub mod queue;
pub mod secrets;
pub mod stdout;
pub mod store;
