//! The one configuration error: which variable, and what is wrong with it.

/// A configuration error, naming the variable at fault.
#[derive(Debug, thiserror::Error)]
#[error("{var}: {problem}")]
pub struct ConfigError {
    pub var: &'static str,
    pub problem: String,
}

impl ConfigError {
    pub fn new(var: &'static str, problem: impl Into<String>) -> Self {
        Self {
            var,
            problem: problem.into(),
        }
    }
}
