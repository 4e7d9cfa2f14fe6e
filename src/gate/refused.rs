//! Refusals remembered: a subject or level whose line the store found full is refused from here
//! with the retry instant it was told, so a refused flood costs a lookup, not a store command.
//! Entries only refuse, never admit, and may refuse a little longer than the store would (after a
//! refund, `grant` or `reset`), so each is trusted for at most [`RECHECK`]. A line `GET /quota`
//! finds open is forgotten, so it never says "within" while this gate would refuse.

use std::time::Duration;

use crate::io::store::QuotaKey;
use crate::rules::unix::UnixMillis;

/// How many refused subjects and levels a gate remembers at most.
pub const CAPACITY: usize = 4_096;

/// The longest a refusal is answered from memory before the store is asked again.
pub const RECHECK: Duration = Duration::from_secs(1);

/// One refusal: the retry instant the client is told, and when to ask the store again.
#[derive(Debug, Clone, Copy)]
struct Entry {
    until: UnixMillis,
    recheck: UnixMillis,
}

/// Refused subjects and levels, by counter key.
pub(super) struct Refused {
    until: quick_cache::sync::Cache<String, Entry>,
}

impl Default for Refused {
    fn default() -> Self {
        Self {
            until: quick_cache::sync::Cache::new(CAPACITY),
        }
    }
}

impl Refused {
    /// The latest instant any of `keys` is known refused until, at `now`; `None`: ask the store.
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
            .filter(|entry| entry.until > now && entry.recheck > now)
            .map(|entry| entry.until)
            .max()
    }

    /// Remembers at `now` that `key` is refused until `until`.
    pub fn remember(&self, key: &QuotaKey, until: UnixMillis, now: UnixMillis) {
        let recheck = now.saturating_add(RECHECK);
        self.until
            .insert(key.counter.clone(), Entry { until, recheck });
    }

    /// Forgets `keys`: the store found their lines open.
    pub fn forget<'a>(&self, keys: impl IntoIterator<Item = &'a QuotaKey>) {
        if self.until.is_empty() {
            return;
        }
        for key in keys {
            self.until.remove(key.counter.as_str());
        }
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
        refused.remember(&a, UnixMillis(500), UnixMillis(0));
        refused.remember(&b, UnixMillis(900), UnixMillis(0));
        assert_eq!(refused.until([&a], UnixMillis(499)), Some(UnixMillis(500)));
        assert_eq!(
            refused.until([&a, &b], UnixMillis(0)),
            Some(UnixMillis(900))
        );
        assert_eq!(refused.until([&a], UnixMillis(500)), None);
        assert_eq!(refused.until([&key("192.0.2.3")], UnixMillis(0)), None);
    }

    /// A refusal for an hour is answered from memory for one [`RECHECK`]
    /// only, with the hour's instant; then the store is asked again.
    #[test]
    fn asks_the_store_again_after_a_recheck() {
        let refused = Refused::default();
        let a = key("192.0.2.1");
        let hour = UnixMillis(10_000 + 3_600_000);
        refused.remember(&a, hour, UnixMillis(10_000));
        assert_eq!(refused.until([&a], UnixMillis(10_999)), Some(hour));
        assert_eq!(refused.until([&a], UnixMillis(11_000)), None);
    }

    /// A line found open is forgotten at once.
    #[test]
    fn forgets_an_open_line() {
        let refused = Refused::default();
        let (a, b) = (key("192.0.2.1"), key("192.0.2.2"));
        refused.remember(&a, UnixMillis(900), UnixMillis(0));
        refused.remember(&b, UnixMillis(900), UnixMillis(0));
        refused.forget([&a]);
        assert_eq!(refused.until([&a], UnixMillis(1)), None);
        assert_eq!(refused.until([&b], UnixMillis(1)), Some(UnixMillis(900)));
    }
}
