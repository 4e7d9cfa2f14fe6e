//! The front ends, each one way in to the [gate](crate::gate) (or, for the consumer, to
//! [`crate::consume`]): the Lambda handlers, `serve`, the `quota-gate` command and its tools.

pub mod cli;
pub mod lambda;
pub mod lambda_consumer;
pub mod ops;
pub mod probe;
pub mod serve;
