//! The request path, behind one call: [`Gate::handle`].
//!
//! The gate is generic over its [`QuotaStore`](crate::io::store::QuotaStore)
//! and [`ScanQueue`](crate::io::queue::ScanQueue), so the same handler runs
//! against Valkey, the in-memory store, a stream or the spool, in
//! production and in tests alike. It is the I/O driver only: what a scan
//! gets is decided by [`crate::rules::decide`], and what a failure or a repeated
//! `Idempotency-Key` leads to by the pure rules of [`crate::rules::settle`]; the
//! gate sends what they say, in order, on one connection.
//!
//! | file | holds |
//! |---|---|
//! | `path.rs` | the driver: request in, the core's answers carried out, an [`Exit`](crate::io::meter::Exit) out |
//! | `attempt.rs` | the request, the identified attempt and the levels above its subject |
//! | `pacing.rs` | step 6: a fresh scan's delay (paced), its bed, and a full line's refusal |
//! | `scan.rs` | the scan that goes ahead, and its job and 202 |
//! | `settlement.rs` | the writes after a scan's end: a failure settled, a keyed answer saved |
//! | `quota.rs` | the two requests that never count: `GET /quota` and an exempt caller's scan |
//! | `refused.rs` | subjects and levels the store refused, answered again without it until their `Retry-After` |
//! | `trace.rs` | the request's trace context, and the spans of its steps |
//! | `wiring.rs` | the [`Gate`] and the backends the configuration names |
//!
//! In shadow mode (`QUOTA_MODE=shadow`) a scan goes the whole way, but its
//! delay is reported, not given.

pub mod error;
pub mod idempotency;
pub mod identity;
pub mod quota_view;
pub mod respond;
pub mod trace;
pub mod validate;

mod attempt;
mod pacing;
mod path;
mod quota;
mod refused;
mod scan;
mod settlement;
mod wiring;

pub use crate::io::queue::ENQUEUE_TIMEOUT;
pub use attempt::GateRequest;
pub use wiring::{Gate, Shared};
