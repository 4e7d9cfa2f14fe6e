//! The ground floor: the pure rules and the types they speak. Nothing here does I/O or reads a
//! clock, and no module imports one outside this folder (`tests/it/architecture.rs` checks), so
//! every rule runs and is tested without a server or a runtime.

pub mod breaker;
pub mod count;
pub mod decide;
pub mod delay;
pub mod digest;
pub mod eviction;
pub mod hash_tag;
pub mod job;
pub mod key;
pub mod level;
pub mod modes;
pub mod networks;
pub mod outcome;
pub mod pace;
pub mod record;
pub mod scope;
pub mod settle;
pub mod trace;
pub mod unix;
