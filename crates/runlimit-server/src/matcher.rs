//! Matching a request descriptor against a domain's rule tree, as envoyproxy/ratelimit does.
//!
//! Pure: a domain and a descriptor's entries in, the matched rule (if any) out.
//!
//! Entry `i` of the descriptor is looked up in the list reached by entries `0..i`: first a
//! rule with the same key and value, then the list's wildcard rules in file order (each
//! matched against the entry's `key_value`), then the key-only rule of the key. There is no
//! backtracking: once an entry chose a rule, a sibling is never tried. The descriptor matches
//! the rule its last entry chose, if that rule has a `rate_limit`; a descriptor with more
//! entries than the chosen rules have levels, or whose walk ends at a rule without a
//! `rate_limit`, matches nothing.

use crate::config::{Domain, Level, Node, Rule};

/// The rule a descriptor matched, and the wildcard patterns that stand for its entries in the
/// counter's subject (`share_threshold`).
#[derive(Debug)]
pub(crate) struct Matched<'t> {
    /// Index of the rule in its domain.
    pub(crate) rule: usize,
    /// `(entry index, pattern)` for each entry that matched a `share_threshold` wildcard rule.
    pub(crate) shared: Vec<(usize, &'t str)>,
}

impl Matched<'_> {
    pub(crate) fn rule<'t>(&self, domain: &'t Domain) -> Option<&'t Rule> {
        domain.rules.get(self.rule)
    }
}

/// The rule `entries` (key, value pairs, in order) match in `domain`, if any.
///
/// `scratch` is reused for the `key_value` text wildcards are matched against, so a request
/// allocates it at most once.
pub(crate) fn match_entries<'t, 'e>(
    domain: &'t Domain,
    entries: impl ExactSizeIterator<Item = (&'e str, &'e str)>,
    scratch: &mut String,
) -> Option<Matched<'t>> {
    let last = entries.len().checked_sub(1)?;
    let mut level: &Level = &domain.root;
    let mut shared = Vec::new();
    let mut rule = None;
    for (index, (key, value)) in entries.enumerate() {
        let Some(node) = lookup(level, key, value, scratch) else { break };
        if let Some(pattern) = &node.share {
            shared.push((index, &**pattern));
        }
        if index == last {
            rule = node.rule;
        }
        if node.children.is_empty() {
            break;
        }
        level = &node.children;
    }
    rule.map(|rule| Matched { rule, shared })
}

fn lookup<'t>(level: &'t Level, key: &str, value: &str, scratch: &mut String) -> Option<&'t Node> {
    let rules = level.keys.get(key);
    if let Some(node) = rules.and_then(|rules| rules.values.get(value)) {
        return Some(node);
    }
    if !level.wildcards.is_empty() {
        // `composite(key, Some(value))`, written into the reused buffer.
        scratch.clear();
        scratch.push_str(key);
        scratch.push('_');
        scratch.push_str(value);
        if let Some((_, node)) = level.wildcards.iter().find(|(glob, _)| glob.matches(scratch)) {
            return Some(node);
        }
    }
    rules.and_then(|rules| rules.default.as_ref())
}

#[cfg(test)]
mod tests;
