//! One normal form for request paths, so that a rule written for
//! `/users/{id}` also sees `//users/1`, `/users/./1` and `/%75sers/1`: the
//! forms an upstream server takes for the same resource.

use std::borrow::Cow;
use std::fmt;

/// Why a path has no normal form. Such a path is refused (400), never matched
/// as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathError {
    /// The path does not start with `/` (`*`, or empty).
    NotAbsolute,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// An encoded `/` or `\` (`%2F`, `%5C`): servers disagree on whether it
    /// separates segments, so no one form is right.
    EncodedSeparator,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::NotAbsolute => "the path does not start with /",
            PathError::BadEscape => "the path has a % not followed by two hex digits",
            PathError::EncodedSeparator => "the path has an encoded / or \\ (%2F, %5C)",
        })
    }
}

impl std::error::Error for PathError {}

/// The normal form of a request path (without its query), as rules match it
/// and as the `tollgate` gateway forwards it:
///
/// - percent-encoded unreserved characters (letters, digits, `-._~`) are
///   decoded, other escapes keep their encoding with upper-case hex digits;
/// - runs of slashes become one (`//a` is `/a`);
/// - dot segments are resolved (`/a/./b/../c` is `/a/c`; `..` never climbs
///   above the root).
///
/// A trailing slash is kept, and case is not changed: rules choose how to
/// treat them (`trailing_slash`, `case`). An encoded `/` or `\`, a broken
/// escape, or a path not starting with `/` has no normal form and is an
/// error. Returns the path itself, unallocated, when it is already normal.
///
/// ```
/// use tollgate::rules::{PathError, normalize_path};
///
/// assert_eq!(normalize_path("//users/./%31/").unwrap(), "/users/1/");
/// assert_eq!(normalize_path("/x/../%75sers/1").unwrap(), "/users/1");
/// assert_eq!(normalize_path("/admin%2fx"), Err(PathError::EncodedSeparator));
/// ```
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let decoded = decode_unreserved(path)?;
    if is_normal(&decoded) {
        return Ok(decoded);
    }
    let mut kept: Vec<&str> = Vec::new();
    let mut segments = decoded[1..].split('/').peekable();
    let mut trailing = false;
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            "" => {}
            "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s),
        }
        // A path ending in `/`, `/.` or `/..` names a directory.
        trailing = last && matches!(segment, "" | "." | "..");
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if trailing || kept.is_empty() {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// Whether a path with no escapes left to decode has no empty or dot
/// segment (but perhaps a trailing slash).
fn is_normal(path: &str) -> bool {
    let body = path.strip_suffix('/').unwrap_or(path);
    body.is_empty() || !body[1..].split('/').any(|s| matches!(s, "" | "." | ".."))
}

/// Decodes escapes of unreserved characters and upper-cases the others.
fn decode_unreserved(path: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    let Some(first) = bytes.iter().position(|&b| b == b'%') else {
        return Ok(Cow::Borrowed(path));
    };
    let mut out = String::with_capacity(path.len());
    out.push_str(&path[..first]);
    let mut i = first;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            // Copy up to the next escape whole, keeping UTF-8 intact.
            let end = bytes[i..]
                .iter()
                .position(|&b| b == b'%')
                .map_or(bytes.len(), |n| i + n);
            out.push_str(&path[i..end]);
            i = end;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            bytes.get(i + 1).and_then(|&h| hex(h)),
            bytes.get(i + 2).and_then(|&l| hex(l)),
        ) else {
            return Err(PathError::BadEscape);
        };
        let c = char::from(hi << 4 | lo);
        match c {
            '/' | '\\' => return Err(PathError::EncodedSeparator),
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~') => out.push(c),
            _ => {
                out.push('%');
                out.push(char::from(b"0123456789ABCDEF"[usize::from(hi)]));
                out.push(char::from(b"0123456789ABCDEF"[usize::from(lo)]));
            }
        }
        i += 3;
    }
    Ok(Cow::Owned(out))
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dodge_of_the_issue_has_one_form() {
        for (path, normal) in [
            ("/users/1", "/users/1"),
            ("//users/1", "/users/1"),
            ("/users/1/", "/users/1/"),
            ("/%75sers/1", "/users/1"),
            ("/users/./1", "/users/1"),
            ("/x/../users/1", "/users/1"),
            ("/../../users//1", "/users/1"),
            ("/users/1/.", "/users/1/"),
            ("/users/1/..", "/users/"),
            ("/%2e%2E/users/1", "/users/1"),
            ("/a%20b%7e%2a", "/a%20b~%2A"),
            ("/", "/"),
            ("//", "/"),
            ("/.", "/"),
            ("/..", "/"),
            ("/é/%C3%A9", "/é/%C3%A9"),
        ] {
            assert_eq!(normalize_path(path).as_deref(), Ok(normal), "{path}");
        }
        for (path, error) in [
            ("/admin%2fx", PathError::EncodedSeparator),
            ("/admin%2Fx", PathError::EncodedSeparator),
            ("/a%5cb", PathError::EncodedSeparator),
            ("/a%", PathError::BadEscape),
            ("/a%4", PathError::BadEscape),
            ("/a%zz", PathError::BadEscape),
            ("*", PathError::NotAbsolute),
            ("", PathError::NotAbsolute),
        ] {
            assert_eq!(normalize_path(path), Err(error), "{path}");
        }
    }

    #[test]
    fn a_normal_path_is_not_copied() {
        assert!(matches!(
            normalize_path("/api/v1/users/"),
            Ok(Cow::Borrowed(_))
        ));
    }
}
