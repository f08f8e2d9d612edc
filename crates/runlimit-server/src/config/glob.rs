//! Wildcard patterns: `*` matches zero or more characters, anywhere, any number of times.
//!
//! Written here rather than taken from a glob crate: the rule is envoyproxy/ratelimit's (only
//! `*`, no escapes, no `?` or classes, matched against the rule's composite `key_value`
//! string), which file-path glob crates do not offer without also giving `?`, `[` and `\` a
//! meaning the format does not have.

/// A pattern split at its `*`s: the text must start with the first segment, end with the
/// last, and hold the middle ones in order, without overlapping, in between.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Glob {
    segments: Box<[Box<str>]>,
}

impl Glob {
    /// The pattern, if `text` holds a `*`.
    pub(crate) fn new(text: &str) -> Option<Self> {
        text.contains('*').then(|| Self { segments: text.split('*').map(Box::from).collect() })
    }

    /// Whether `text` matches.
    pub(crate) fn matches(&self, text: &str) -> bool {
        let Some((first, rest)) = self.segments.split_first() else { return text.is_empty() };
        let Some(mut remaining) = text.strip_prefix(&**first) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            // No `*` at all: `new` never builds such a pattern; compare exactly.
            return remaining.is_empty();
        };
        for segment in middle {
            match remaining.find(&**segment) {
                Some(at) => remaining = &remaining[at + segment.len()..],
                None => return false,
            }
        }
        remaining.ends_with(&**last)
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    fn glob(pattern: &str) -> Glob {
        Glob::new(pattern).unwrap()
    }

    #[test]
    fn a_star_matches_zero_or_more_characters_anywhere() {
        assert!(glob("wild_foo*").matches("wild_foo"));
        assert!(glob("wild_foo*").matches("wild_foo1"));
        assert!(!glob("wild_foo*").matches("wild_bar"));
        assert!(glob("midWild_bar*b").matches("midWild_barb"));
        assert!(glob("midWild_bar*b").matches("midWild_barab"));
        assert!(!glob("midWild_bar*b").matches("midWild_bara"));
        assert!(!glob("midWild_bar*b").matches("midWild_xbarb"));
        assert!(glob("multiWild_foo*bar*baz").matches("multiWild_foobarbaz"));
        assert!(glob("multiWild_foo*bar*baz").matches("multiWild_foo123bar456baz"));
        assert!(!glob("multiWild_foo*bar*baz").matches("multiWild_foo123baz"));
        assert!(!glob("multiWild_foo*bar*baz").matches("multiWild_bar456baz"));
        assert!(glob("path_/api/*/action").matches("path_/api/123/action"));
        assert!(!glob("path_/api/*/action").matches("path_/api/123/other"));
        assert!(glob("*").matches(""));
        assert!(glob("a**b").matches("ab"));
    }

    #[test]
    fn segments_do_not_overlap() {
        // "ab*ba": the text "aba" would need the shared "a" twice.
        assert!(!glob("ab*ba").matches("aba"));
        assert!(glob("ab*ba").matches("abba"));
    }

    #[test]
    fn text_without_a_star_is_not_a_pattern() {
        assert_eq!(Glob::new("plain"), None);
    }
}
