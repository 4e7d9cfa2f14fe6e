//! The floor that talks to the world: Valkey, the quota store and scan queues, the clock, the line
//! writer and meter, readiness ([`health`]) and the secret stores. It builds on the
//! [rules](crate::rules) and [configuration](crate::config) and knows nothing of a request.

pub mod clock;
pub mod connection;
pub mod eviction_watch;
pub mod health;
pub mod meter;
pub mod queue;
pub mod secrets;
pub mod stdout;
pub mod store;
