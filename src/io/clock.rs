//! The gate's clock, read once per request and passed down: all the gate decides or stores about a
//! request uses that one reading. The JWT check alone reads the system clock (`jsonwebtoken` does);
//! the verified-token cache follows it, so a cached token expires when a fresh check would fail.

use std::time::{SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use uuid::{NoContext, Timestamp, Uuid};

use crate::rules::unix::UnixMillis;

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

    pub fn now(&self) -> UnixMillis {
        UnixMillis(self.now_ms())
    }

    pub fn now_ms(&self) -> i64 {
        match self {
            Self::System => wall_ms(),
            Self::Tokio { wall_ms, at } => {
                wall_ms + i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX)
            }
        }
    }
}

/// A UUIDv7 carrying `at`'s millisecond (the rest random), as the scan's `receivedAt` does.
pub fn uuid_v7(at: UnixMillis) -> Uuid {
    let ms = u64::try_from(at.get()).unwrap_or(0);
    let nanos = u32::try_from(ms % 1000).unwrap_or(0) * 1_000_000;
    Uuid::new_v7(Timestamp::from_unix(NoContext, ms / 1000, nanos))
}

/// RFC 3339 UTC to the second (`2026-12-01T00:00:00Z`); empty outside years 0000–9999.
pub fn rfc3339(unix_secs: i64) -> String {
    utc(unix_secs, None)
}

/// RFC 3339 UTC from unix milliseconds, always with three fraction digits (`…:05.000Z`).
pub fn rfc3339_ms(unix_ms: i64) -> String {
    // `rem_euclid` is in 0..1000, so the cast cannot truncate.
    let ms = unix_ms.rem_euclid(1000) as u32;
    utc(unix_ms.div_euclid(1000), Some(ms))
}

/// `YYYY-MM-DDTHH:MM:SS[.mmm]Z` digit by digit: cheaper than `time`'s general formatter.
fn utc(unix_secs: i64, millis: Option<u32>) -> String {
    let Ok(t) = OffsetDateTime::from_unix_timestamp(unix_secs) else {
        return String::new();
    };
    let Some(year) = u32::try_from(t.year()).ok().filter(|&y| y <= 9999) else {
        return String::new();
    };
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let fields = [
        (0..4, year),
        (5..7, u32::from(u8::from(t.month()))),
        (8..10, u32::from(t.day())),
        (11..13, u32::from(t.hour())),
        (14..16, u32::from(t.minute())),
        (17..19, u32::from(t.second())),
    ];
    for (at, value) in fields {
        put_digits(&mut text[at], value);
    }
    let len = match millis {
        Some(ms) => {
            put_digits(&mut text[20..23], ms);
            text.len()
        }
        None => {
            text[19] = b'Z';
            20
        }
    };
    String::from_utf8_lossy(&text[..len]).into_owned()
}

/// `value`'s last `out.len()` decimal digits, zero-padded.
fn put_digits(out: &mut [u8], mut value: u32) {
    for digit in out.iter_mut().rev() {
        // `value % 10` is below 10, so the cast cannot truncate.
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
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

    /// The digit-by-digit form is `time`'s RFC 3339 form, over instants
    /// from 1970 to 9999 (leap days and year ends among them), before 1970
    /// too, and nothing where RFC 3339 has no form.
    #[test]
    fn same_as_time() {
        use time::format_description::well_known::Rfc3339;
        let by_time = |secs: i64| {
            OffsetDateTime::from_unix_timestamp(secs)
                .unwrap()
                .format(&Rfc3339)
                .unwrap()
        };
        let mut secs = -86_400 * 365;
        while secs < 253_402_300_799 {
            assert_eq!(rfc3339(secs), by_time(secs), "{secs}");
            let ms = secs * 1000 + 7;
            assert_eq!(rfc3339_ms(ms), by_time(secs).replace('Z', ".007Z"));
            secs += 86_399 * 37 + 3_607;
        }
        assert_eq!(rfc3339(253_402_300_799), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(253_402_300_800), "");
        assert_eq!(rfc3339(-62_167_219_201), "");
        assert_eq!(rfc3339(i64::MAX), "");
    }

    /// A scan id made at an instant carries that millisecond, and two made at once differ.
    #[test]
    fn uuid_v7_carries_the_instant() {
        let at = UnixMillis(1_796_083_205_250);
        let id = uuid_v7(at);
        assert_eq!(id.get_version_num(), 7);
        let (secs, nanos) = id.get_timestamp().unwrap().to_unix();
        assert_eq!((secs, nanos), (1_796_083_205, 250_000_000));
        assert_ne!(uuid_v7(at), id);
    }
}
