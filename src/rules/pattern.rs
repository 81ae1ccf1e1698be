//! Path patterns (`/users/{id}`, `/files/{*rest}`) and prefixes (`/api/`) as
//! written in rules files, and how they match a normalised path.

use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::names::{Case, TrailingSlash};
use super::path::{escape_raw, normalize_pattern};

/// How a rule compares paths: its `trailing_slash` and `case` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Compare {
    pub trailing_slash: TrailingSlash,
    pub case: Case,
}

impl Compare {
    fn eq(self, a: &str, b: &str) -> bool {
        match self.case {
            Case::Sensitive => a == b,
            Case::Insensitive => a.eq_ignore_ascii_case(b),
        }
    }

    fn starts_with(self, path: &str, prefix: &str) -> bool {
        path.get(..prefix.len())
            .is_some_and(|head| self.eq(head, prefix))
    }

    /// The path without its trailing slash when the slash does not count.
    fn trim(self, path: &str) -> &str {
        match self.trailing_slash {
            TrailingSlash::Ignore if path.len() > 1 => path.strip_suffix('/').unwrap_or(path),
            _ => path,
        }
    }
}

/// A pattern or prefix in the form paths are matched in, so that it can
/// match at all. Bytes a path may not hold raw (`é`, `"`) are accepted and
/// stored escaped, so that `/caf\u{e9}` and `/caf%C3%A9` mean the same;
/// any other spelling the normal form would change (`//`, `%75`, `;x`) is
/// an error that says what to write.
fn canonical(what: &str, text: &str) -> Result<String, String> {
    if !text.starts_with('/') {
        return Err(format!("{what} {text:?} must start with /"));
    }
    let escaped = escape_raw(text);
    match normalize_pattern(&escaped) {
        Ok(normal) if normal == escaped => Ok(escaped.into_owned()),
        Ok(normal) => Err(format!(
            "{what} {text:?} can never match, as paths are normalised before matching; write {normal:?}"
        )),
        Err(e) => Err(format!("{what} {text:?} can never match: {e}")),
    }
}

/// A parsed path pattern.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PathPattern {
    pub text: String,
    pub segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Segment {
    Literal(String),
    /// `{name}`: exactly one segment.
    Param,
    /// `{*name}`: the rest of the path, possibly empty.
    Rest,
}

impl PathPattern {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let text = canonical("path pattern", text)?;
        let mut segments = Vec::new();
        let parts: Vec<&str> = text[1..].split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let segment = match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                Some(name) if name.starts_with('*') => {
                    if i + 1 != parts.len() {
                        return Err(format!("in {text:?}, {{{name}}} must be the last segment"));
                    }
                    Segment::Rest
                }
                Some(name) if !name.is_empty() && !name.contains(['{', '}']) => Segment::Param,
                _ if part.contains(['{', '}']) => {
                    return Err(format!(
                        "in {text:?}, {part:?} is not a literal, {{name}} or {{*name}}"
                    ));
                }
                _ => Segment::Literal((*part).to_owned()),
            };
            segments.push(segment);
        }
        Ok(PathPattern { text, segments })
    }

    /// Whether a normalised path matches.
    pub(crate) fn matches(&self, path: &str, how: Compare) -> bool {
        let path = how.trim(path);
        let mut segments = self.segments.as_slice();
        if let [rest @ .., Segment::Literal(last)] = segments {
            if last.is_empty() && !rest.is_empty() && how.trailing_slash == TrailingSlash::Ignore {
                segments = rest;
            }
        }
        let mut parts = path.strip_prefix('/').unwrap_or(path).split('/');
        for segment in segments {
            match segment {
                Segment::Rest => return true,
                Segment::Param => match parts.next() {
                    Some(p) if !p.is_empty() => {}
                    _ => return false,
                },
                Segment::Literal(l) => {
                    if !parts.next().is_some_and(|p| how.eq(p, l)) {
                        return false;
                    }
                }
            }
        }
        parts.next().is_none()
    }
}

impl<'de> Deserialize<'de> for PathPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PathPattern::parse(&s).map_err(de::Error::custom)
    }
}

/// A path prefix: `/api/`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PathPrefix(pub String);

impl PathPrefix {
    /// Whether a normalised path starts with the prefix. Ignoring the
    /// trailing slash, `/api` starts with `/api/`.
    pub(crate) fn matches(&self, path: &str, how: Compare) -> bool {
        let p = self.0.as_str();
        how.starts_with(path, p)
            || (how.trailing_slash == TrailingSlash::Ignore
                && p.len() > 1
                && p.strip_suffix('/').is_some_and(|p| how.eq(path, p)))
    }
}

impl<'de> Deserialize<'de> for PathPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        canonical("the path prefix", &s)
            .map(PathPrefix)
            .map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::normalize_path;

    const STRICT: Compare = Compare {
        trailing_slash: TrailingSlash::Strict,
        case: Case::Sensitive,
    };

    #[test]
    fn path_patterns() {
        let p = PathPattern::parse("/users/{id}").unwrap();
        assert!(p.matches("/users/42", STRICT));
        assert!(!p.matches("/users/", STRICT));
        assert!(!p.matches("/users/42/posts", STRICT));
        let p = PathPattern::parse("/files/{*rest}").unwrap();
        assert!(p.matches("/files/a/b/c", STRICT));
        assert!(p.matches("/files/", STRICT));
        assert!(!p.matches("/file", STRICT));
        assert!(PathPattern::parse("users").is_err());
        assert!(PathPattern::parse("/a/{*rest}/b").is_err());
        assert!(PathPattern::parse("/a/x{id}").is_err());
    }

    #[test]
    fn trailing_slash_and_case_are_the_rule_s_choice() {
        let loose = Compare::default();
        let p = PathPattern::parse("/users/{id}").unwrap();
        assert!(p.matches("/users/42/", loose));
        assert!(!p.matches("/users/42/", STRICT));
        assert!(p.matches("/USERS/42", loose));
        assert!(!p.matches("/USERS/42", STRICT));
        assert!(!p.matches("/users/", loose), "a parameter is never empty");
        let slash = PathPattern::parse("/login/").unwrap();
        assert!(slash.matches("/login", loose) && slash.matches("/login/", loose));
        assert!(!slash.matches("/login", STRICT));
        let root = PathPattern::parse("/").unwrap();
        assert!(root.matches("/", loose) && !root.matches("/a", loose));
        let prefix = PathPrefix("/api/".into());
        assert!(prefix.matches("/api/x", loose) && prefix.matches("/API", loose));
        assert!(!prefix.matches("/api", STRICT) && !prefix.matches("/apix", loose));
    }

    #[test]
    fn patterns_must_be_written_normalised() {
        for bad in [
            "//users", "/a/./b", "/a/../b", "/%75sers", "/a%2fb", "/a%zz",
        ] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
        for bad in ["/login;jsessionid=1", "/a\\b", "/caf%c3%a9"] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn raw_and_encoded_spellings_of_a_pattern_are_one_pattern() {
        let raw = PathPattern::parse("/caf\u{e9}/{id}").unwrap();
        let encoded = PathPattern::parse("/caf%C3%A9/{id}").unwrap();
        assert_eq!(raw, encoded);
        assert_eq!(raw.text, "/caf%C3%A9/{id}");
        let path = normalize_path("/caf\u{e9}/1").unwrap();
        assert!(raw.matches(&path, STRICT) && encoded.matches("/caf%C3%A9/1", STRICT));
        let prefix: PathPrefix = serde_saphyr::from_str("\"/\u{e9}t\u{e9}/\"").unwrap();
        assert_eq!(prefix, PathPrefix("/%C3%A9t%C3%A9/".into()));
    }
}
