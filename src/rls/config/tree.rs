//! The reference's matching: a request's descriptor entries walk the tree
//! one level each; at each level the entry's key and value match first,
//! then a wildcard value (`*` standing for any run of characters), then
//! the key alone. The limit found is the one at the level of the
//! descriptor's last entry: a descriptor deeper or shallower than the
//! configured limits matches none.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

use super::Limit;

/// A level of the tree: a domain's descriptors, or a descriptor's children,
/// with the descriptor's own limit.
#[derive(Debug, Default)]
pub(crate) struct Domain {
    limit: Option<Arc<Limit>>,
    /// With a wildcard value: count every value the wildcard matches
    /// together, under the pattern.
    share_threshold: bool,
    /// `key` then `value`: a value's lookup needs no allocation.
    by_value: HashMap<String, HashMap<String, Domain>>,
    by_key: HashMap<String, Domain>,
    /// Wildcard values in file order: key, pattern split on `*`, child.
    wildcards: Vec<Wildcard>,
}

#[derive(Debug)]
struct Wildcard {
    key: String,
    pattern: String,
    parts: Vec<String>,
    child: Domain,
}

/// A limit that applies to a descriptor, and the key its counters are kept
/// under.
#[derive(Debug)]
pub(crate) struct Matched {
    pub limit: Arc<Limit>,
    pub key: String,
}

impl Domain {
    pub(super) fn node(limit: Option<Arc<Limit>>, share_threshold: bool) -> Domain {
        Domain {
            limit,
            share_threshold,
            ..Domain::default()
        }
    }

    /// Adds a child; false when one with this key and value is there.
    pub(super) fn insert(&mut self, key: &str, value: Option<&str>, child: Domain) -> bool {
        match value {
            None => {
                if self.by_key.contains_key(key) {
                    return false;
                }
                self.by_key.insert(key.to_owned(), child);
            }
            Some(v) if v.contains('*') => {
                if self
                    .wildcards
                    .iter()
                    .any(|w| w.key == key && w.pattern == v)
                {
                    return false;
                }
                self.wildcards.push(Wildcard {
                    key: key.to_owned(),
                    pattern: v.to_owned(),
                    parts: v.split('*').map(str::to_owned).collect(),
                    child,
                });
            }
            Some(v) => {
                let values = self.by_value.entry(key.to_owned()).or_default();
                if values.contains_key(v) {
                    return false;
                }
                values.insert(v.to_owned(), child);
            }
        }
        true
    }

    /// The limit for a descriptor of `entries` (key, value) in domain
    /// `domain`, if any.
    pub(crate) fn find<'a>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Matched> {
        let last = entries.len().checked_sub(1)?;
        let mut level = self;
        let mut key = String::new();
        push_part(&mut key, domain);
        for (i, (k, v)) in entries.enumerate() {
            let (next, shared) = level.step(k, v)?;
            push_part(&mut key, k);
            push_part(&mut key, shared.unwrap_or(v));
            if i == last {
                let limit = Arc::clone(next.limit.as_ref()?);
                return Some(Matched { limit, key });
            }
            level = next;
        }
        None
    }

    /// The child an entry leads to, and the pattern that stands for its
    /// value when the child shares one counter across the values.
    fn step(&self, key: &str, value: &str) -> Option<(&Domain, Option<&str>)> {
        if let Some(child) = self.by_value.get(key).and_then(|m| m.get(value)) {
            return Some((child, None));
        }
        if let Some(w) = self
            .wildcards
            .iter()
            .find(|w| w.key == key && wildcard_match(&w.parts, value))
        {
            let shared = w.child.share_threshold.then_some(w.pattern.as_str());
            return Some((&w.child, shared));
        }
        self.by_key.get(key).map(|c| (c, None))
    }
}

/// Appends a part of a counter key, length first, so that no key or value
/// (which a client may choose) can make two descriptors share a counter.
fn push_part(out: &mut String, part: &str) {
    let _ = write!(out, "{}:{part}", part.len());
}

/// Whether `value` matches a pattern split on `*`: each `*` stands for any
/// run of characters, possibly empty.
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let [first, middle @ .., last] = parts else {
        return parts.first().is_some_and(|p| p == value);
    };
    if value.len() < parts.iter().map(String::len).sum::<usize>() {
        return false;
    }
    let Some(rest) = value.strip_prefix(first.as_str()) else {
        return false;
    };
    let Some(mut rest) = rest.strip_suffix(last.as_str()) else {
        return false;
    };
    for part in middle {
        match rest.find(part.as_str()) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::wildcard_match;

    fn parts(p: &str) -> Vec<String> {
        p.split('*').map(str::to_owned).collect()
    }

    #[test]
    fn wildcards_match_any_run_at_their_place() {
        assert!(wildcard_match(&parts("foo*"), "foo"));
        assert!(wildcard_match(&parts("foo*"), "foobar"));
        assert!(!wildcard_match(&parts("foo*"), "fo"));
        assert!(wildcard_match(&parts("*"), ""));
        assert!(wildcard_match(&parts("a*b*c"), "aXbYc"));
        assert!(wildcard_match(&parts("a*b*c"), "abc"));
        assert!(!wildcard_match(&parts("a*b*c"), "ac"));
        assert!(!wildcard_match(&parts("ab*ba"), "aba"));
        assert!(wildcard_match(&parts("exact"), "exact"));
    }
}
