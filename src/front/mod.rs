//! The front ends, on top: the Lambda handlers (the gate's, and the
//! consumer's), the local HTTP server, the `quota-gate` command, its
//! operator tools and its health `probe`. Each adapts one way in to
//! the [gate](crate::gate) (or, for the consumer, to
//! [`crate::consume`]).

pub mod cli;
pub mod lambda;
pub mod lambda_consumer;
pub mod ops;
pub mod probe;
pub mod serve;
