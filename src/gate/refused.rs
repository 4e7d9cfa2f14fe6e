//! Refusals remembered: a subject, or a level above it, whose line the
//! store found full (503 `backlog_full`) is refused from here until the
//! instant it was told it may retry, without a store command.
//!
//! A refused flood (a network rotating through its addresses, a client
//! that ignores `Retry-After`) would otherwise cost a count, a pacing step
//! and a refund per request. Remembered here, it costs a lookup. The
//! entries only refuse, never admit: a miss asks the store. An entry may
//! refuse a little longer than the store would (a refund elsewhere, an
//! operator's `reset`), never shorter, because a line's slot only moves
//! on. Each gate keeps its own (a `serve` worker, a Lambda environment),
//! bounded at [`CAPACITY`] keys, the least useful going first.

use crate::io::store::QuotaKey;
use crate::rules::unix::UnixMillis;

/// How many refused subjects and levels a gate remembers at most (about
/// 100 bytes each).
pub const CAPACITY: usize = 4_096;

/// Refused subjects and levels, by counter key, each until when.
pub(super) struct Refused {
    until: quick_cache::sync::Cache<String, UnixMillis>,
}

impl Default for Refused {
    fn default() -> Self {
        Self {
            until: quick_cache::sync::Cache::new(CAPACITY),
        }
    }
}

impl Refused {
    /// Until when any of `keys` is known refused at `now` (the latest, if
    /// several are); `None` when none is, and the store must be asked. An
    /// empty memory (the usual case) costs no lookup.
    pub fn until<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a QuotaKey>,
        now: UnixMillis,
    ) -> Option<UnixMillis> {
        if self.until.is_empty() {
            return None;
        }
        keys.into_iter()
            .filter_map(|key| self.until.get(key.counter.as_str()))
            .filter(|until| *until > now)
            .max()
    }

    /// Remembers that `key` is refused until `until`.
    pub fn remember(&self, key: &QuotaKey, until: UnixMillis) {
        self.until.insert(key.counter.clone(), until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::digest::Hasher;
    use crate::rules::scope::Scope;

    fn key(ip: &str) -> QuotaKey {
        QuotaKey::new(
            Scope::Ip,
            &Hasher::new(b"0123456789abcdef").digest(Scope::Ip, ip),
        )
    }

    /// A remembered refusal holds until its instant, for that key only;
    /// the latest of several wins.
    #[test]
    fn refuses_until_its_instant() {
        let refused = Refused::default();
        let (a, b) = (key("192.0.2.1"), key("192.0.2.2"));
        assert_eq!(refused.until([&a], UnixMillis(0)), None);
        refused.remember(&a, UnixMillis(5_000));
        refused.remember(&b, UnixMillis(9_000));
        assert_eq!(
            refused.until([&a], UnixMillis(4_999)),
            Some(UnixMillis(5_000))
        );
        assert_eq!(
            refused.until([&a, &b], UnixMillis(0)),
            Some(UnixMillis(9_000))
        );
        assert_eq!(refused.until([&a], UnixMillis(5_000)), None);
        assert_eq!(refused.until([&key("192.0.2.3")], UnixMillis(0)), None);
    }
}
