//! The front ends, on top: the Lambda handler, the local HTTP server, the
//! `quota-gate` command, its operator tools and its health `probe`. Each adapts one way in to
//! the [gate](crate::gate) (or, for the consumer, to
//! [`crate::consume`]).

pub mod cli;
pub mod lambda;
pub mod ops;
pub mod probe;
pub mod serve;
