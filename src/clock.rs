//! The gate's clock, read once per request and passed down.
//!
//! Everything the gate decides or stores about a request uses that one
//! reading: the counter's period, the idempotency record's times and lease,
//! the pacing arrival, `receivedAt` and `notBefore`, and the in-memory
//! store's expiries (every store call takes `now`). Two readings are not
//! the request's, on purpose: the JWT check (`jsonwebtoken` compares
//! `exp`/`nbf` with the system clock itself, and the verified-token cache
//! follows it, so a cached token expires exactly when a fresh check would
//! refuse it), and the EMF line's `Timestamp`, which is when the line was
//! written, as CloudWatch expects.
//!
//! [`Clock::System`] is the wall clock. [`Clock::Tokio`] is the wall clock
//! at its creation advanced by Tokio's clock, so a test with paused Tokio
//! time sees the time it skips: a 5 s sleep moves this clock 5 s on.

use std::time::{SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::unix::UnixMillis;

/// A source of unix milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    System,
    /// The wall clock at `at`, advanced by Tokio's clock since.
    Tokio {
        wall_ms: i64,
        at: tokio::time::Instant,
    },
}

/// Unix milliseconds by the system's wall clock.
pub fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Clock {
    /// A clock that follows Tokio's (paused or not) from now on.
    pub fn tokio() -> Self {
        Self::Tokio {
            wall_ms: wall_ms(),
            at: tokio::time::Instant::now(),
        }
    }

    /// The instant now.
    pub fn now(&self) -> UnixMillis {
        UnixMillis(self.now_ms())
    }

    /// Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        match self {
            Self::System => wall_ms(),
            Self::Tokio { wall_ms, at } => {
                wall_ms + i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX)
            }
        }
    }
}

/// An instant as RFC 3339 UTC with second precision (`2026-12-01T00:00:00Z`).
pub fn rfc3339(unix_secs: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix_secs)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// An instant in unix milliseconds as RFC 3339 UTC, always with three
/// fraction digits (`2026-12-01T00:00:05.250Z`, `…:05.000Z`): the same width
/// for every instant, as the docs show it.
pub fn rfc3339_ms(unix_ms: i64) -> String {
    const MS: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(MS).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Instants in ms always carry three fraction digits, even when they are zeros.
    #[test]
    fn milliseconds_are_three_digits() {
        assert_eq!(rfc3339_ms(1_796_083_200_000), "2026-12-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_796_083_205_250), "2026-12-01T00:00:05.250Z");
        assert_eq!(rfc3339_ms(1_796_083_205_001), "2026-12-01T00:00:05.001Z");
    }
}
