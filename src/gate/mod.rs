//! The request path behind one call, [`Gate::handle`]: the I/O driver only. What a scan gets and
//! what a failure or repeated `Idempotency-Key` leads to are the pure rules' ([`crate::rules`]);
//! the gate sends what they say, in order, on one connection. In shadow mode a scan goes the whole
//! way, but its delay is reported, not given.

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
