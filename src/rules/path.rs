//! One normal form for request paths, so that a rule written for
//! `/users/{id}` also sees `//users/1`, `/users/./1`, `/%75sers/1` and
//! `/users;jsessionid=2/1`: the forms an upstream server takes for the same
//! resource.

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
    /// A raw `\`: Windows servers (and some frameworks) take it for `/`,
    /// others for a character of the segment, so no one form is right.
    Backslash,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::NotAbsolute => "the path does not start with /",
            PathError::BadEscape => "the path has a % not followed by two hex digits",
            PathError::EncodedSeparator => "the path has an encoded / or \\ (%2F, %5C)",
            PathError::Backslash => "the path has a \\",
        })
    }
}

impl std::error::Error for PathError {}

/// The normal form of a request path (without its query), as rules match it
/// and as the `tollgate` gateway forwards it:
///
/// - percent-encoded unreserved characters (letters, digits, `-._~`) are
///   decoded, other escapes keep their encoding with upper-case hex digits;
/// - bytes a URI path may not hold raw (anything not ASCII, spaces,
///   controls, `"`, `<`, `>`, `[`, `]`, `^`, `` ` ``, `{`, `|`, `}`) are
///   percent-encoded, so `/é` and `/%C3%A9` are one path;
/// - path parameters are dropped from every segment (`/login;jsessionid=1`
///   is `/login`, `/a/..;/b` is `/b`), as servlet containers do before they
///   route;
/// - runs of slashes become one (`//a` is `/a`);
/// - dot segments are resolved (`/a/./b/../c` is `/a/c`; `..` never climbs
///   above the root).
///
/// A trailing slash is kept, and case is not changed: rules choose how to
/// treat them (`trailing_slash`, `case`). An encoded `/` or `\`, a raw `\`, a
/// broken escape, or a path not starting with `/` has no normal form and is
/// an error. Returns the path itself, unallocated, when it is already
/// normal.
///
/// ```
/// use tollgate::rules::{PathError, normalize_path};
///
/// assert_eq!(normalize_path("//users/./%31/").unwrap(), "/users/1/");
/// assert_eq!(normalize_path("/x/../%75sers/1").unwrap(), "/users/1");
/// assert_eq!(normalize_path("/login;jsessionid=1").unwrap(), "/login");
/// assert_eq!(normalize_path("/caf\u{e9}").unwrap(), "/caf%C3%A9");
/// assert_eq!(normalize_path("/admin%2fx"), Err(PathError::EncodedSeparator));
/// assert_eq!(normalize_path("/admin\\x"), Err(PathError::Backslash));
/// ```
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    normalize(path, false)
}

/// [`normalize_path`] of a pattern as written in a rules file: its `{` and
/// `}` (parameters) stay as they are.
pub(crate) fn normalize_pattern(text: &str) -> Result<Cow<'_, str>, PathError> {
    normalize(text, true)
}

/// `text` with only the bytes a URI path may not hold raw percent-encoded
/// (braces kept, as in [`normalize_pattern`]): how a rules file's pattern
/// written with `é` is stored, so that it means what `%C3%A9` means.
pub(crate) fn escape_raw(text: &str) -> Cow<'_, str> {
    if !text.bytes().any(|b| must_escape(b, true)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        push_byte(&mut out, b, true);
    }
    Cow::Owned(out)
}

fn normalize(path: &str, keep_braces: bool) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let decoded = canonical_bytes(path, keep_braces)?;
    if is_normal(&decoded) {
        return Ok(decoded);
    }
    let mut kept: Vec<&str> = Vec::new();
    let mut segments = decoded[1..].split('/').peekable();
    let mut trailing = false;
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        // Parameters go first, so that `..;x` is the `..` a servlet
        // container resolves.
        let segment = segment.split(';').next().unwrap_or(segment);
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
/// segment and no parameter (but perhaps a trailing slash).
fn is_normal(path: &str) -> bool {
    let body = path.strip_suffix('/').unwrap_or(path);
    !path.contains(';')
        && (body.is_empty() || !body[1..].split('/').any(|s| matches!(s, "" | "." | "..")))
}

/// Whether byte `b` is written as an escape in the normal form: anything
/// but ASCII letters and digits, `-._~`, the sub-delimiters `!$&'()*+,;=`,
/// `:`, `@`, `/` and `%` (RFC 3986's `pchar`), and braces in patterns.
fn must_escape(b: u8, keep_braces: bool) -> bool {
    let raw = b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%".contains(&b);
    !(raw || keep_braces && matches!(b, b'{' | b'}'))
}

fn push_byte(out: &mut String, b: u8, keep_braces: bool) {
    if must_escape(b, keep_braces) {
        out.push('%');
        out.push(char::from(b"0123456789ABCDEF"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789ABCDEF"[usize::from(b & 15)]));
    } else {
        out.push(char::from(b));
    }
}

/// Decodes escapes of unreserved characters, upper-cases the others, and
/// escapes raw bytes a path may not hold.
fn canonical_bytes(path: &str, keep_braces: bool) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    let Some(first) = bytes
        .iter()
        .position(|&b| b == b'%' || b == b'\\' || must_escape(b, keep_braces))
    else {
        return Ok(Cow::Borrowed(path));
    };
    let mut out = String::with_capacity(path.len() + 8);
    out.push_str(&path[..first]);
    let mut i = first;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' {
            return Err(PathError::Backslash);
        }
        if b != b'%' {
            push_byte(&mut out, b, keep_braces);
            i += 1;
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
        ] {
            assert_eq!(normalize_path(path).as_deref(), Ok(normal), "{path}");
        }
        for (path, error) in [
            ("/admin%2fx", PathError::EncodedSeparator),
            ("/admin%2Fx", PathError::EncodedSeparator),
            ("/a%5cb", PathError::EncodedSeparator),
            ("/a\\b", PathError::Backslash),
            ("/admin\\..\\x", PathError::Backslash),
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
    fn path_parameters_are_dropped_before_dot_segments_are_resolved() {
        for (path, normal) in [
            ("/login;jsessionid=1", "/login"),
            ("/login;jsessionid=1/", "/login/"),
            ("/users;v=2/1;x", "/users/1"),
            ("/admin/..;/login", "/login"),
            ("/.;/login", "/login"),
            ("/;x/login", "/login"),
            ("/a/;x", "/a/"),
            ("/a%3Bb", "/a%3Bb"),
            ("/a%3bb", "/a%3Bb"),
        ] {
            assert_eq!(normalize_path(path).as_deref(), Ok(normal), "{path}");
        }
    }

    #[test]
    fn raw_bytes_a_path_may_not_hold_are_escaped_as_their_encoded_spelling_is() {
        for (raw, encoded) in [
            ("/caf\u{e9}", "/caf%C3%A9"),
            ("/\u{e9}/%C3%A9", "/%C3%A9/%C3%A9"),
            ("/a\"b", "/a%22b"),
            ("/a{b}|c^[d]", "/a%7Bb%7D%7Cc%5E%5Bd%5D"),
            ("/a b", "/a%20b"),
        ] {
            assert_eq!(normalize_path(raw).as_deref(), Ok(encoded), "{raw}");
            assert_eq!(normalize_path(encoded).as_deref(), Ok(encoded), "{encoded}");
        }
        assert_eq!(
            normalize_pattern("/u/{id}/\u{e9}").unwrap(),
            "/u/{id}/%C3%A9"
        );
        assert_eq!(escape_raw("/{id}/\u{e9}//"), "/{id}/%C3%A9//");
        assert!(matches!(escape_raw("/a/{b}"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_normal_path_is_not_copied() {
        assert!(matches!(
            normalize_path("/api/v1/users/"),
            Ok(Cow::Borrowed(_))
        ));
    }
}
