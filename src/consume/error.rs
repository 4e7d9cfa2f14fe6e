//! The consumer's errors: what failed (Valkey, SQS, standard input, the
//! journal, the setup), and why a running scan was stopped.

use crate::connection::SendError;

/// Why a running scan was stopped by the consumer (not by the scanner).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It ran past `--scan-timeout`: a failed attempt, retried with backoff.
    Timeout,
    /// Its marker was lost (claimed by another attempt, done, or not
    /// renewed for ¾ of a lease): it may not be this attempt's scan any more.
    LeaseLost,
    /// `SIGTERM`'s grace period ended.
    Shutdown,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Timeout => "scan timeout",
            Self::LeaseLost => "lease lost",
            Self::Shutdown => "shutdown grace over",
        })
    }
}

/// A failed call to the queue, the markers or the journal.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConsumeError {
    /// Valkey did not run it, or may have (see [`SendError`]).
    #[error("Valkey: {0}")]
    Valkey(#[from] SendError),
    /// The stream's consumer group is gone (Valkey restarted without
    /// persistence, or the key was removed): create it again.
    #[error("the consumer group is gone (NOGROUP)")]
    NoGroup,
    /// An SQS call failed.
    #[error("SQS: {0}")]
    Sqs(String),
    /// Reading standard input failed.
    #[error("standard input: {0}")]
    Stdin(String),
    /// Writing the spool's journal failed.
    #[error("journal: {0}")]
    Journal(String),
    /// Valkey took the write, but fewer replicas than `VALKEY_WAIT_REPLICAS`
    /// acknowledged it in time: a failover may lose it, so it is not relied
    /// on (the call is made again).
    #[error("{0} reached fewer replicas than VALKEY_WAIT_REPLICAS in time")]
    NotReplicated(&'static str),
    /// Setting up (bad options, a missing variable), or an answer that makes
    /// no sense (`TIME`'s, a poisoned marker table).
    #[error("{0}")]
    Setup(String),
}

impl ConsumeError {
    /// A Valkey failure, with the group's loss told apart.
    pub fn from_send(e: SendError) -> Self {
        match &e {
            SendError::Refused(why) if why.contains("NOGROUP") => Self::NoGroup,
            _ => Self::Valkey(e),
        }
    }
}

impl From<ConsumeError> for String {
    fn from(e: ConsumeError) -> Self {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lost group is told apart from other refusals.
    #[test]
    fn nogroup_is_told_apart() {
        let nogroup = SendError::Refused("NOGROUP No such key 'jobs'".into());
        assert!(matches!(
            ConsumeError::from_send(nogroup),
            ConsumeError::NoGroup
        ));
        let other = ConsumeError::from_send(SendError::Unanswered);
        assert!(matches!(other, ConsumeError::Valkey(SendError::Unanswered)));
    }
}
