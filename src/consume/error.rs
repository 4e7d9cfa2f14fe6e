//! The consumer's errors: what failed (Valkey, SQS, standard input, the journal, the setup).

use crate::io::connection::{Refusal, SendError};

/// The refusal of a stream command whose consumer group does not exist.
pub const NOGROUP: &str = "NOGROUP";

/// The refusal of `XGROUP CREATE` for a group that exists already.
pub const BUSYGROUP: &str = "BUSYGROUP";

/// A failed call to the queue, the markers or the journal.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConsumeError {
    /// Valkey did not run it, or may have (see [`SendError`]).
    #[error("Valkey: {0}")]
    Valkey(#[from] SendError),
    /// The stream's consumer group is gone (Valkey restarted without persistence): create it again.
    #[error("the consumer group is gone (NOGROUP)")]
    NoGroup,
    #[error("SQS: {0}")]
    Sqs(String),
    #[error("standard input: {0}")]
    Stdin(String),
    #[error("journal: {0}")]
    Journal(String),
    /// Fewer replicas than `VALKEY_WAIT_REPLICAS` took the write in time: a failover may lose it.
    #[error("{0} reached fewer replicas than VALKEY_WAIT_REPLICAS in time")]
    NotReplicated(&'static str),
    /// Bad options, a missing variable, or an answer that makes no sense (`TIME`'s).
    #[error("{0}")]
    Setup(String),
}

impl From<Refusal> for ConsumeError {
    fn from(refused: Refusal) -> Self {
        if refused.is(NOGROUP) {
            Self::NoGroup
        } else {
            Self::Valkey(SendError::Refused(refused.message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lost group is told apart from other refusals by its code, not
    /// by its text.
    #[test]
    fn nogroup_is_told_apart() {
        let refusal = |code: Option<&str>, message: &str| Refusal {
            code: code.map(str::to_owned),
            message: message.to_owned(),
        };
        let nogroup = refusal(Some(NOGROUP), "NOGROUP: No such key 'jobs'");
        assert!(matches!(ConsumeError::from(nogroup), ConsumeError::NoGroup));
        let mentions = refusal(Some("ERR"), "ERR NOGROUP is only a word here");
        assert!(matches!(
            ConsumeError::from(mentions),
            ConsumeError::Valkey(SendError::Refused(_))
        ));
    }
}
