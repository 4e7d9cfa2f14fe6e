//! Instants as unix seconds and milliseconds, two types that cannot be mixed up, and
//! [`duration_ms`], the one duration conversion; the raw number is taken only at the wire.

use std::time::Duration;

/// One day in seconds: a rolling period, the `RateLimit` window, a record's life.
pub const DAY_SECS: i64 = 86_400;

macro_rules! instant {
    ($name:ident, $unit:literal, $whole:ident) => {
        #[doc = concat!("An instant in unix ", $unit, ".")]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub i64);

        impl $name {
            #[doc = concat!("The number of ", $unit, ", for the wire.")]
            pub const fn get(self) -> i64 {
                self.0
            }

            #[doc = concat!("`d` later, in whole ", $unit, " (a fraction is dropped).")]
            pub fn saturating_add(self, d: Duration) -> Self {
                let n = i64::try_from(d.$whole()).unwrap_or(i64::MAX);
                Self(self.0.saturating_add(n))
            }
        }
    };
}

instant!(UnixSecs, "seconds", as_secs);
instant!(UnixMillis, "milliseconds", as_millis);

impl UnixSecs {
    /// The same instant in milliseconds.
    pub const fn millis(self) -> UnixMillis {
        UnixMillis(self.0.saturating_mul(1_000))
    }
}

impl UnixMillis {
    /// The second this instant falls in (floor, also before 1970).
    pub const fn secs(self) -> UnixSecs {
        UnixSecs(self.0.div_euclid(1_000))
    }
}

/// `d` in whole milliseconds (a fraction dropped), `u64::MAX` past it.
pub fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Milliseconds round down to their second, before 1970 too.
    #[test]
    fn seconds_are_floored() {
        assert_eq!(UnixMillis(1_999).secs(), UnixSecs(1));
        assert_eq!(UnixMillis(-1).secs(), UnixSecs(-1));
        assert_eq!(UnixSecs(2).millis(), UnixMillis(2_000));
        assert_eq!(
            UnixMillis(5).saturating_add(Duration::from_micros(2_500)),
            UnixMillis(7)
        );
        assert_eq!(
            UnixSecs(i64::MAX).saturating_add(Duration::from_secs(1)),
            UnixSecs(i64::MAX)
        );
    }

    /// A duration's milliseconds drop their fraction and saturate.
    #[test]
    fn durations_in_whole_milliseconds() {
        assert_eq!(duration_ms(Duration::from_micros(2_999)), 2);
        assert_eq!(duration_ms(Duration::MAX), u64::MAX);
    }
}
