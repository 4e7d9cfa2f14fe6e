//! A key's cluster hash tag: the one definition of the rule.
//!
//! A Valkey cluster hashes only the part of a key inside its first `{…}`,
//! when that part is non-empty, so keys that share a tag share a slot (and
//! one script or transaction may touch them all). The stream queue puts its
//! scanId markers beside the stream, the consumer its run markers, and the
//! configuration refuses a stream key whose braces form no tag: all three
//! ask [`has_hash_tag`].
//!
//! Pure: no I/O, nothing above it.

/// Whether `key` carries a non-empty `{…}` hash tag: the part of the key
/// a cluster hashes, so keys that share it share a slot.
pub fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

/// `key` as a hash tag for the keys beside it: `key` itself when it has a
/// tag of its own, else `{key}`.
pub fn tagged(key: &str) -> String {
    if has_hash_tag(key) {
        key.to_owned()
    } else {
        format!("{{{key}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a non-empty `{…}` is a hash tag.
    #[test]
    fn hash_tags() {
        assert!(!has_hash_tag("jobs"));
        assert!(has_hash_tag("jobs{scan}"));
        assert!(!has_hash_tag("jobs{}"));
        assert!(!has_hash_tag("jobs}{"));
    }

    /// Keys beside another share its slot: a plain key becomes the tag.
    #[test]
    fn tags() {
        assert_eq!(tagged("jobs"), "{jobs}");
        assert_eq!(tagged("jobs{scan}"), "jobs{scan}");
        assert_eq!(tagged("jobs{}"), "{jobs{}}");
    }
}
