//! What rules read from a request's head besides its path: the host it
//! names, in one normal form (so that a rule matching `host: admin.example`
//! also sees `ADMIN.example`, `admin.example.` and `admin.example:80`, the
//! spellings a server takes for the same site), and the headers they read
//! one value of, which a request may send only once.

use http::HeaderName;
use http::header::HOST;
use http::request::Parts;

use super::key_part::KeyPart;
use super::model::{HeaderMatch, RulesFile};

/// The normal form of a `Host` value (or of an absolute request target's
/// authority), as rules match it: the name in lower case, one trailing dot
/// dropped, an IPv6 address in its one canonical spelling (RFC 5952:
/// `[0:0::1]` is `[::1]`), and the port dropped when it is HTTP's default
/// (`:80`, or `:` alone). `None` when the text is not a host with an
/// optional port: an empty name or label (`a..b`), a character outside
/// letters, digits and `-._~` (an escape, user info, a space), brackets
/// around anything but an IPv6 address, or a port that is not a number to
/// 65535.
///
/// ```
/// use tollgate::rules::normalize_host;
///
/// assert_eq!(normalize_host("ADMIN.example.:80").as_deref(), Some("admin.example"));
/// assert_eq!(normalize_host("[0:0::1]:8080").as_deref(), Some("[::1]:8080"));
/// assert_eq!(normalize_host("admin..example"), None);
/// assert_eq!(normalize_host("admin.example:http"), None);
/// assert_eq!(normalize_host("[..]"), None);
/// ```
pub fn normalize_host(text: &str) -> Option<String> {
    let (mut out, port) = if let Some(bracketed) = text.strip_prefix('[') {
        // An address has many spellings; a rule names one of them, and a
        // client must not pass it by writing another.
        let (literal, port) = bracketed.split_once(']')?;
        let address: std::net::Ipv6Addr = literal.parse().ok()?;
        (format!("[{address}]"), port)
    } else {
        let end = text.find(':').unwrap_or(text.len());
        let name = &text[..end];
        // A fully qualified name's one trailing dot names the same site.
        let name = name.strip_suffix('.').unwrap_or(name);
        let valid = !name.is_empty()
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~'))
            });
        if !valid {
            return None;
        }
        (name.to_ascii_lowercase(), &text[end..])
    };
    let port = match port.strip_prefix(':') {
        None if port.is_empty() => None,
        None => return None,
        Some("") => None,
        Some(digits) if digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit()) => {
            match digits.parse::<u16>().ok()? {
                80 => None,
                n => Some(n),
            }
        }
        Some(_) => return None,
    };
    if let Some(port) = port {
        out.push(':');
        out.push_str(&port.to_string());
    }
    Some(out)
}

/// The headers a request may send once only, and whether any rule matches
/// the host.
pub(super) fn single_headers(file: &RulesFile) -> (Vec<HeaderName>, bool) {
    let mut names = vec![HOST];
    let mut host_rules = false;
    for rc in &file.rules {
        for h in &rc.matches.headers {
            host_rules |= h.name.0 == HOST;
            names.push(h.name.0.clone());
        }
        for part in &rc.key.0 {
            if let KeyPart::Header(name) = part {
                names.push(name.clone());
            }
        }
    }
    names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    names.dedup();
    (names, host_rules)
}

/// The host a request names: an absolute target's authority, which a
/// server takes over `Host` (RFC 9112 section 3.2.2), or `Host`.
fn request_host(parts: &Parts) -> Option<&[u8]> {
    match parts.uri.authority() {
        Some(authority) => Some(authority.as_str().as_bytes()),
        None => parts.headers.get(HOST).map(|v| v.as_bytes()),
    }
}

impl super::compile::Compiled {
    /// Refuses a request head the rules could read two ways: a single-value
    /// header (`Host`, a match or key header) sent twice, where the rules
    /// would read one line and the upstream perhaps the other (RFC 9112
    /// requires 400 for two `Host` lines), or, while a rule matches the
    /// host, a host with no normal form. The error is the detail for a 400.
    pub(super) fn check_head(&self, parts: &Parts) -> Result<(), String> {
        for name in &self.single_headers {
            if parts.headers.get_all(name).iter().nth(1).is_some() {
                return Err(format!("The request has more than one {name} header."));
            }
        }
        if self.host_rules {
            let host = request_host(parts);
            if host.is_some_and(|h| {
                std::str::from_utf8(h)
                    .ok()
                    .and_then(normalize_host)
                    .is_none()
            }) {
                return Err("The request's host cannot be read.".to_owned());
            }
        }
        Ok(())
    }
}

/// Whether a request meets one of a rule's `headers` matches. The host is
/// compared in its normal form (the rule's value is already).
pub(super) fn header_matches(parts: &Parts, h: &HeaderMatch) -> bool {
    if h.name.0 == HOST {
        let Some(host) = request_host(parts) else {
            return false;
        };
        return match &h.value {
            None => true,
            Some(want) => std::str::from_utf8(host)
                .ok()
                .and_then(normalize_host)
                .is_some_and(|host| host == *want),
        };
    }
    match (parts.headers.get(&h.name.0), &h.value) {
        (Some(v), Some(want)) => v.as_bytes() == want.as_bytes(),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_one_site_has_one_form() {
        for (host, normal) in [
            ("admin.example", "admin.example"),
            ("ADMIN.Example", "admin.example"),
            ("admin.example.", "admin.example"),
            ("admin.example:80", "admin.example"),
            ("admin.example.:80", "admin.example"),
            ("admin.example:", "admin.example"),
            ("admin.example:0080", "admin.example"),
            ("admin.example:8080", "admin.example:8080"),
            ("admin.example:08080", "admin.example:8080"),
            ("10.0.0.1:80", "10.0.0.1"),
            ("[2001:DB8::1]:80", "[2001:db8::1]"),
            ("[::1]:9000", "[::1]:9000"),
            ("[0:0:0:0:0:0:0:1]", "[::1]"),
            ("[2001:0DB8:0::0001]:8080", "[2001:db8::1]:8080"),
            ("[::FFFF:192.0.2.1]", "[::ffff:192.0.2.1]"),
            ("localhost", "localhost"),
        ] {
            assert_eq!(normalize_host(host).as_deref(), Some(normal), "{host}");
        }
        for bad in [
            "",
            ".",
            "admin.example..",
            "admin..example",
            ".admin.example",
            "admin.example:http",
            "admin.example:65536",
            "admin.example:80:80",
            "user@admin.example",
            "adm%69n.example",
            "admin example",
            "admin.example/x",
            "[::1",
            "[]",
            "[::g]",
            "[::1]x",
            "[..]",
            "[:::]",
            "[1.2.3.4]",
            "[fe80::1%25eth0]",
            "caf\u{e9}.example",
        ] {
            assert_eq!(normalize_host(bad), None, "{bad:?}");
        }
    }
}
