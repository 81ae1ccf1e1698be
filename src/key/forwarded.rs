//! Forwarding headers read from the right: `X-Forwarded-For`, RFC 7239
//! `Forwarded` and `X-Real-IP`. A client writes what it likes on the left;
//! only the entries trusted proxies appended on the right mean anything, so
//! the walk starts there and never looks further left than it must.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;

use super::KeyError;

/// Which header carries the chain of addresses proxies saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=192.0.2.60;proto=http, for="[2001:db8::1]:4711"`.
    Forwarded,
    /// `X-Real-IP: client`, one address set by the proxy.
    XRealIp,
}

/// Entries of a forwarding header read at most, from the right: more trusted
/// hops than this is a misconfiguration or an attack.
pub(crate) const MAX_HOPS: usize = 64;

/// Bytes of a forwarding header read at most, from the right, across its
/// lines: what lies further left is never looked at.
pub(crate) const MAX_BYTES: usize = 8 * 1024;

/// The entries of a forwarding header from right to left, across its lines
/// (the last line first): `Some(address)`, or `None` for an entry that is not
/// an address. Reads at most [`MAX_HOPS`] entries and [`MAX_BYTES`] bytes; an
/// entry past either cap is an error, and ends the walk.
pub(crate) struct FromRight<'a> {
    header: ForwardedHeader,
    lines: std::iter::Rev<http::header::ValueIter<'a, http::HeaderValue>>,
    /// What is left of the current line, right-aligned.
    rest: &'a [u8],
    /// Whether `rest` starts mid-line (the byte cap cut the line).
    cut: bool,
    budget: usize,
    entries: usize,
    done: bool,
}

impl<'a> FromRight<'a> {
    pub(crate) fn new(headers: &'a HeaderMap, header: ForwardedHeader) -> Self {
        FromRight {
            header,
            lines: headers.get_all(header_name(header)).iter().rev(),
            rest: &[],
            cut: false,
            budget: MAX_BYTES,
            entries: 0,
            done: false,
        }
    }

    fn too_far(&mut self) -> Option<Result<Option<IpAddr>, KeyError>> {
        self.done = true;
        Some(Err(KeyError::Malformed(format!(
            "the {} header (no client within the last {MAX_HOPS} entries or {MAX_BYTES} bytes)",
            header_name(self.header)
        ))))
    }
}

impl Iterator for FromRight<'_> {
    type Item = Result<Option<IpAddr>, KeyError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            if self.rest.is_empty() {
                if self.cut {
                    return self.too_far();
                }
                let Some(line) = self.lines.next() else {
                    self.done = true;
                    return None;
                };
                let bytes = line.as_bytes();
                let take = bytes.len().min(self.budget);
                self.budget -= take;
                self.rest = &bytes[bytes.len() - take..];
                self.cut = take < bytes.len();
                continue;
            }
            let element = match last_separator(self.rest, self.header) {
                Some(at) => {
                    let element = &self.rest[at + 1..];
                    self.rest = &self.rest[..at];
                    element
                }
                // The element begins before the cut: unread.
                None if self.cut => return self.too_far(),
                None => std::mem::take(&mut self.rest),
            };
            let Some(entry) = parse_element(element, self.header) else {
                continue;
            };
            self.entries += 1;
            if self.entries > MAX_HOPS {
                return self.too_far();
            }
            return Some(Ok(entry));
        }
    }
}

fn header_name(header: ForwardedHeader) -> &'static str {
    match header {
        ForwardedHeader::XForwardedFor => "x-forwarded-for",
        ForwardedHeader::Forwarded => "forwarded",
        ForwardedHeader::XRealIp => "x-real-ip",
    }
}

/// Where the last element of a line starts: the index of the last `,`
/// separating elements (outside double quotes in `Forwarded`). Scanned from
/// the right, so a broken quote further left is never reached.
fn last_separator(line: &[u8], header: ForwardedHeader) -> Option<usize> {
    if header != ForwardedHeader::Forwarded {
        return line.iter().rposition(|&b| b == b',');
    }
    let mut quoted = false;
    let mut i = line.len();
    while i > 0 {
        i -= 1;
        match line[i] {
            b'"' if quoted => {
                let backslashes = line[..i].iter().rev().take_while(|&&b| b == b'\\').count();
                if backslashes % 2 == 1 {
                    // An escaped quote inside the string; its escapes are content too.
                    i -= backslashes;
                } else {
                    quoted = false;
                }
            }
            b'"' => quoted = true,
            b',' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// One element: `None` when it is empty (skipped), else its address or
/// `Some(None)` when it holds none (garbage, `unknown`, an obfuscated name).
fn parse_element(element: &[u8], header: ForwardedHeader) -> Option<Option<IpAddr>> {
    let element = element.trim_ascii();
    if element.is_empty() {
        return None;
    }
    let Ok(text) = std::str::from_utf8(element) else {
        return Some(None);
    };
    if header != ForwardedHeader::Forwarded {
        return Some(parse_node(text));
    }
    let node = split_unquoted(text, ';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
    });
    Some(node.and_then(|v| parse_node(unquote(v))))
}

/// An address with or without a port: `192.0.2.1`, `192.0.2.1:80`,
/// `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:80`.
fn parse_node(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(sock) = s.parse::<SocketAddr>() {
        return Some(sock.ip().to_canonical());
    }
    let inner = s.strip_prefix('[')?.split(']').next()?;
    inner.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(v)
}

/// Splits on `sep` outside double quotes.
fn split_unquoted(s: &str, sep: char) -> impl Iterator<Item = &str> {
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    let mut ends = s.char_indices().filter_map(move |(i, c)| {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => return Some(i),
            _ => {}
        }
        None
    });
    std::iter::from_fn(move || {
        if start > s.len() {
            return None;
        }
        let end = ends.next().unwrap_or(s.len());
        let part = &s[start..end];
        start = end + 1;
        Some(part)
    })
}
