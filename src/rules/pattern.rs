//! Path patterns as written in rules files: `/users/{id}`, `/files/{*rest}`.

use serde::Deserialize;
use serde::de::{self, Deserializer};

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
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!("path pattern {text:?} must start with /"));
        };
        let mut segments = Vec::new();
        let parts: Vec<&str> = rest.split('/').collect();
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
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
        })
    }

    pub(crate) fn matches(&self, path: &str) -> bool {
        let mut parts = path.strip_prefix('/').unwrap_or(path).split('/');
        for segment in &self.segments {
            match segment {
                Segment::Rest => return true,
                Segment::Param => match parts.next() {
                    Some(p) if !p.is_empty() => {}
                    _ => return false,
                },
                Segment::Literal(l) => {
                    if parts.next() != Some(l.as_str()) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_patterns() {
        let p = PathPattern::parse("/users/{id}").unwrap();
        assert!(p.matches("/users/42"));
        assert!(!p.matches("/users/"));
        assert!(!p.matches("/users/42/posts"));
        let p = PathPattern::parse("/files/{*rest}").unwrap();
        assert!(p.matches("/files/a/b/c"));
        assert!(p.matches("/files/"));
        assert!(!p.matches("/file"));
        assert!(PathPattern::parse("users").is_err());
        assert!(PathPattern::parse("/a/{*rest}/b").is_err());
        assert!(PathPattern::parse("/a/x{id}").is_err());
    }
}
