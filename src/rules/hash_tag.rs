//! A key's cluster hash tag, defined once: a Valkey cluster hashes only the non-empty part inside a
//! key's first `{…}`, so keys sharing a tag share a slot (and one script may touch them all).

/// Whether `key` carries a non-empty `{…}` hash tag.
pub fn has_hash_tag(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|len| len > 0)
}

/// `key` as a hash tag for the keys beside it: itself when it has a tag, else `{key}`.
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
