//! Tokens that verified, until their `exp`, by the SHA-256 of the token: the same bytes under the
//! same keys verify the same way. Only successes are kept, so garbage cannot crowd them out.

/// The most verified tokens remembered at once.
pub const VERIFIED_CACHE_CAPACITY: usize = 10_000;

/// What verified tokens came to (`T`: their subject), each until its `exp`.
pub struct VerifiedCache<T> {
    /// An entry past its `exp` is never served, and is evicted in time.
    entries: quick_cache::sync::Cache<[u8; 32], (T, i64)>,
}

impl<T: Clone> Default for VerifiedCache<T> {
    fn default() -> Self {
        Self {
            entries: quick_cache::sync::Cache::new(VERIFIED_CACHE_CAPACITY),
        }
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The key `token` is kept under.
pub fn key(token: &str) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(token.as_bytes()).into()
}

impl<T: Clone> VerifiedCache<T> {
    /// What the token of `key` verified as, unless its `exp` has passed.
    pub fn get(&self, key: &[u8; 32]) -> Option<T> {
        let (subject, exp) = self.entries.get(key)?;
        (exp > unix_now()).then_some(subject)
    }

    /// Remembers that the token of `key` verified as `subject`, until `exp` (unix seconds).
    pub fn put(&self, key: [u8; 32], subject: &T, exp: i64) {
        self.entries.insert(key, (subject.clone(), exp));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Cache = VerifiedCache<String>;

    /// A cached token is served only until its `exp`.
    #[test]
    fn cache_honours_exp() {
        let cache = Cache::default();
        let live = key("live");
        let dead = key("dead");
        cache.put(live, &"a".into(), unix_now() + 600);
        cache.put(dead, &"b".into(), unix_now() - 1);
        assert_eq!(cache.get(&live), Some("a".into()));
        assert_eq!(cache.get(&dead), None);
        assert_eq!(cache.get(&key("never seen")), None);
    }

    /// The cache never holds more than its capacity.
    #[test]
    fn cache_is_bounded() {
        let cache = Cache::default();
        for n in 0..VERIFIED_CACHE_CAPACITY + 10 {
            cache.put(key(&n.to_string()), &"t".into(), unix_now() + 600);
        }
        assert!(cache.entries.len() <= VERIFIED_CACHE_CAPACITY);
        // A full cache still serves the newest token (nothing was cleared).
        let last = key(&(VERIFIED_CACHE_CAPACITY + 9).to_string());
        assert_eq!(cache.get(&last), Some("t".into()));
    }
}
