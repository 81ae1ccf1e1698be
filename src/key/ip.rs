//! Keys from IP addresses: the connection's peer, or the client behind
//! trusted proxies, grouped by network prefix.

use std::fmt::Write;
use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use http::HeaderMap;
use http::request::Parts;
use ipnet::IpNet;

use super::{Key, KeyError, KeyExtractor, KeyFuture};

/// How addresses are grouped: one key per IPv4 address and per IPv6 /64 by
/// default, because one IPv6 host owns a /64 (or more) and could otherwise
/// rotate through it.
#[derive(Debug, Clone, Copy)]
struct Prefixes {
    v4: u8,
    v6: u8,
}

impl Default for Prefixes {
    fn default() -> Self {
        Prefixes { v4: 32, v6: 64 }
    }
}

impl Prefixes {
    /// `ip:<address>` or `ip:<network>/<prefix>`. IPv4-mapped IPv6 addresses
    /// (what a dual-stack socket reports for IPv4 clients) count as IPv4.
    fn key(self, ip: IpAddr) -> Key {
        let ip = ip.to_canonical();
        let prefix = match ip {
            IpAddr::V4(_) => self.v4,
            IpAddr::V6(_) => self.v6,
        };
        let full = if ip.is_ipv4() { 32 } else { 128 };
        if prefix >= full {
            // Sized for the longest address, so formatting never regrows it.
            let mut text = String::with_capacity(48);
            text.push_str("ip:");
            match ip {
                // The common case, written without the formatting machinery.
                IpAddr::V4(v4) => {
                    for (i, octet) in v4.octets().into_iter().enumerate() {
                        if i > 0 {
                            text.push('.');
                        }
                        push_octet(&mut text, octet);
                    }
                }
                IpAddr::V6(v6) => {
                    let _ = write!(text, "{v6}");
                }
            }
            return Key(text);
        }
        // Prefixes are clamped when set, so this cannot fail.
        match IpNet::new(ip, prefix) {
            Ok(net) => Key(format!("ip:{}", net.trunc())),
            Err(_) => Key(format!("ip:{ip}")),
        }
    }
}

/// Appends an octet in decimal: `Ipv4Addr`'s `Display` costs several times
/// more on this path (callgrind on the layer).
fn push_octet(out: &mut String, n: u8) {
    if n >= 100 {
        out.push(char::from(b'0' + n / 100));
    }
    if n >= 10 {
        out.push(char::from(b'0' + n / 10 % 10));
    }
    out.push(char::from(b'0' + n % 10));
}

/// The peer address of the connection: axum's `ConnectInfo<SocketAddr>`, or a
/// `SocketAddr` extension set by other servers.
pub(crate) fn peer_addr(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| parts.extensions.get::<SocketAddr>().map(SocketAddr::ip))
        .map(|ip| ip.to_canonical())
}

/// The connection's peer address: `ip:<address>` (IPv6 grouped by /64).
///
/// Serve an axum router with
/// `into_make_service_with_connect_info::<SocketAddr>()` so the address is
/// recorded; without it, requests have no key ([`KeyError::NoPeerAddress`]).
/// Behind a reverse proxy every request has the proxy's address: use
/// [`ClientIp`] there.
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp {
    prefixes: Prefixes,
}

impl PeerIp {
    /// One key per IPv4 address and per IPv6 /64.
    pub fn new() -> Self {
        PeerIp::default()
    }

    /// Groups IPv6 addresses by this prefix length (0 to 128; 64 by default).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v6 = bits.min(128);
        self
    }

    /// Groups IPv4 addresses by this prefix length (0 to 32; 32 by default).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v4 = bits.min(32);
        self
    }
}

impl KeyExtractor for PeerIp {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        KeyFuture::ready(
            peer_addr(parts)
                .map(|ip| self.prefixes.key(ip))
                .ok_or(KeyError::NoPeerAddress),
        )
    }
}

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

#[derive(Debug, Clone)]
enum Trust {
    Proxies(Vec<IpNet>),
    Hops(usize),
}

/// The client's address behind reverse proxies you trust.
///
/// The forwarding header is read from the right: each proxy appends the
/// address it saw, and a client can write anything on the left. Entries added
/// by trusted proxies are skipped; the first untrusted address is the client.
/// The header is ignored unless the connection itself comes from a trusted
/// proxy, so a client talking to the server directly cannot claim another
/// address. Never the leftmost entry: a client sending a made-up
/// `X-Forwarded-For` on every request is still one client.
///
/// ```
/// use tollgate::key::{ClientIp, ForwardedHeader};
///
/// let behind_lb = ClientIp::trusted_proxies(["10.0.0.0/8".parse()?, "::1/128".parse()?]);
/// let behind_two_hops = ClientIp::hops(2).header(ForwardedHeader::Forwarded);
/// # let _ = (behind_lb, behind_two_hops);
/// # Ok::<(), ipnet::AddrParseError>(())
/// ```
///
/// Outcomes: a connection from an untrusted peer is keyed by that peer; a
/// trusted peer that sent no header is keyed by its own address; when every
/// address in the chain is trusted, the leftmost is the client. An entry that
/// is not an address (garbage, `unknown`, an obfuscated `_name`) where the
/// client should be, a chain shorter than the hop count, or no client within
/// the 64 entries and 8 KiB read from the right, is [`KeyError::Malformed`].
/// Several header lines form one chain, in order. Of several `X-Real-IP`
/// values, the last counts (the one the nearest proxy set).
#[derive(Debug, Clone)]
pub struct ClientIp {
    trust: Trust,
    header: ForwardedHeader,
    prefixes: Prefixes,
}

impl ClientIp {
    /// Trusts proxies whose addresses are in these networks.
    pub fn trusted_proxies(networks: impl IntoIterator<Item = IpNet>) -> Self {
        ClientIp {
            trust: Trust::Proxies(networks.into_iter().collect()),
            header: ForwardedHeader::default(),
            prefixes: Prefixes::default(),
        }
    }

    /// Trusts exactly `hops` proxies in front of the server (at least one):
    /// the client is the `hops`-th address from the right. The connection is
    /// assumed to come from the nearest proxy.
    pub fn hops(hops: usize) -> Self {
        ClientIp {
            trust: Trust::Hops(hops.max(1)),
            header: ForwardedHeader::default(),
            prefixes: Prefixes::default(),
        }
    }

    /// Which header to read (`X-Forwarded-For` by default).
    pub fn header(mut self, header: ForwardedHeader) -> Self {
        self.header = header;
        self
    }

    /// Groups IPv6 addresses by this prefix length (64 by default).
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v6 = bits.min(128);
        self
    }

    /// Groups IPv4 addresses by this prefix length (32 by default).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes.v4 = bits.min(32);
        self
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        match &self.trust {
            Trust::Proxies(nets) => nets.iter().any(|n| n.contains(&ip)),
            Trust::Hops(_) => true,
        }
    }

    /// The client's address, or why it cannot be known.
    ///
    /// The forwarding header is read from the right, across its lines in
    /// order, and only as far as needed: at most 64 entries and 8 KiB, so whatever a client writes further left (too many
    /// entries, bytes that are not ASCII, an unclosed quote) is never read.
    /// Only a right part that cannot be read is an error.
    pub fn client(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        let peer = peer_addr(parts).ok_or(KeyError::NoPeerAddress)?;
        if !self.trusted(peer) {
            return Ok(peer);
        }
        let mut hops = FromRight::new(&parts.headers, self.header);
        if self.header == ForwardedHeader::XRealIp {
            // One address set by the proxy: the last one, if a client sent its own too.
            return match hops.next() {
                None => Ok(peer),
                Some(entry) => entry?.ok_or_else(not_an_address),
            };
        }
        match &self.trust {
            Trust::Hops(n) => {
                let mut seen = 0;
                for entry in hops {
                    let entry = entry?;
                    seen += 1;
                    if seen == *n {
                        return entry.ok_or_else(not_an_address);
                    }
                }
                if seen == 0 {
                    return Ok(peer);
                }
                Err(KeyError::Malformed(format!(
                    "the forwarding header: {seen} address(es) for {n} trusted hop(s)"
                )))
            }
            Trust::Proxies(_) => {
                let mut leftmost = peer;
                for entry in hops {
                    match entry? {
                        Some(ip) if self.trusted(ip) => leftmost = ip,
                        Some(ip) => return Ok(ip),
                        None => return Err(not_an_address()),
                    }
                }
                // Every hop is a trusted proxy: the first one is the origin
                // (the peer itself when the header is absent).
                Ok(leftmost)
            }
        }
    }
}

fn not_an_address() -> KeyError {
    KeyError::Malformed("the forwarding header: the client entry is not an IP address".into())
}

impl KeyExtractor for ClientIp {
    fn extract(&self, parts: &Parts) -> KeyFuture {
        KeyFuture::ready(self.client(parts).map(|ip| self.prefixes.key(ip)))
    }
}

/// Entries of a forwarding header read at most, from the right: more trusted
/// hops than this is a misconfiguration or an attack.
const MAX_HOPS: usize = 64;

/// Bytes of a forwarding header read at most, from the right, across its
/// lines: what lies further left is never looked at.
const MAX_BYTES: usize = 8 * 1024;

/// The entries of a forwarding header from right to left, across its lines
/// (the last line first): `Some(address)`, or `None` for an entry that is not
/// an address. Reads at most [`MAX_HOPS`] entries and [`MAX_BYTES`] bytes; an
/// entry past either cap is an error, and ends the walk.
struct FromRight<'a> {
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
    fn new(headers: &'a HeaderMap, header: ForwardedHeader) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    fn parts(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut req = Request::builder();
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (mut parts, ()) = req.body(()).unwrap().into_parts();
        let addr: SocketAddr = peer.parse().unwrap();
        parts.extensions.insert(ConnectInfo(addr));
        parts
    }

    fn parts_bytes(peer: &str, name: &str, lines: &[&[u8]]) -> Parts {
        let mut p = parts(peer, &[]);
        for line in lines {
            p.headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(line).unwrap(),
            );
        }
        p
    }

    fn key(k: &impl KeyExtractor, p: &Parts) -> Result<Key, KeyError> {
        k.extract(p)
            .into_ready()
            .expect("built-in extractors are ready")
    }

    fn lb() -> ClientIp {
        ClientIp::trusted_proxies(["10.0.0.0/8".parse().unwrap()])
    }

    #[test]
    fn xff_is_read_from_the_right_past_trusted_proxies() {
        let p = parts(
            "10.0.0.2:1",
            &[("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.7")],
        );
        assert_eq!(key(&lb(), &p).unwrap().as_str(), "ip:203.0.113.9");
    }

    #[test]
    fn xff_from_an_untrusted_peer_is_ignored() {
        let p = parts("198.51.100.4:1", &[("x-forwarded-for", "1.2.3.4")]);
        assert_eq!(key(&lb(), &p).unwrap().as_str(), "ip:198.51.100.4");
    }

    #[test]
    fn several_header_lines_form_one_chain() {
        let p = parts(
            "10.0.0.2:1",
            &[
                ("x-forwarded-for", "203.0.113.9"),
                ("x-forwarded-for", "10.1.1.1"),
            ],
        );
        assert_eq!(key(&lb(), &p).unwrap().as_str(), "ip:203.0.113.9");
    }

    #[test]
    fn what_a_client_writes_on_the_left_cannot_hide_it() {
        let many = vec!["6.6.6.6"; 200].join(", ") + ", 203.0.113.9, 10.0.0.7";
        let non_ascii = b"\xff\xfe caf\xc3\xa9, 203.0.113.9".to_vec();
        let long = "x".repeat(100_000) + ", 203.0.113.9";
        for value in [many.into_bytes(), non_ascii, long.into_bytes()] {
            let p = parts_bytes("10.0.0.2:1", "x-forwarded-for", &[&value]);
            assert_eq!(key(&lb(), &p).unwrap().as_str(), "ip:203.0.113.9");
        }
        let forwarded = lb().header(ForwardedHeader::Forwarded);
        for value in [
            r#"for="6.6.6.6, for=203.0.113.9;proto=https, for=10.0.0.5"#,
            r#"for="a\"b,c", for=203.0.113.9"#,
            r#"for=6.6.6.6"", for="[203.0.113.9]:80""#,
        ] {
            let p = parts_bytes("10.0.0.2:1", "forwarded", &[value.as_bytes()]);
            assert_eq!(
                key(&forwarded, &p).unwrap().as_str(),
                "ip:203.0.113.9",
                "{value}"
            );
        }
    }

    #[test]
    fn lines_count_in_order_and_the_last_one_is_read_first() {
        let p = parts_bytes(
            "10.0.0.2:1",
            "x-forwarded-for",
            &[b"\x80 garbage", b"198.51.100.1, 203.0.113.9", b"10.0.0.3"],
        );
        assert_eq!(key(&lb(), &p).unwrap().as_str(), "ip:203.0.113.9");
        assert_eq!(
            key(&ClientIp::hops(3), &p).unwrap().as_str(),
            "ip:198.51.100.1"
        );
    }

    #[test]
    fn a_right_part_too_long_to_read_is_malformed() {
        let hops = vec!["10.0.0.9"; MAX_HOPS + 1].join(", ");
        let wide = format!("203.0.113.9, 10.0.0.{}", "9".repeat(MAX_BYTES));
        for value in [hops, wide] {
            let p = parts_bytes("10.0.0.2:1", "x-forwarded-for", &[value.as_bytes()]);
            assert!(
                matches!(lb().client(&p), Err(KeyError::Malformed(_))),
                "{}",
                &value[..40]
            );
        }
        // Exactly at the caps is still read.
        let hops = vec!["10.0.0.9"; MAX_HOPS].join(", ");
        let p = parts_bytes("10.0.0.2:1", "x-forwarded-for", &[hops.as_bytes()]);
        assert_eq!(lb().client(&p), Ok("10.0.0.9".parse().unwrap()));
    }

    #[test]
    fn hop_count_takes_the_nth_from_the_right() {
        let p = parts(
            "192.0.2.1:1",
            &[("x-forwarded-for", "6.6.6.6, 203.0.113.9, 192.0.2.8")],
        );
        assert_eq!(
            key(&ClientIp::hops(2), &p).unwrap().as_str(),
            "ip:203.0.113.9"
        );
        assert!(matches!(
            key(&ClientIp::hops(4), &p),
            Err(KeyError::Malformed(_))
        ));
    }

    #[test]
    fn forwarded_header_with_quoted_ipv6_and_ports() {
        let p = parts(
            "10.0.0.2:1",
            &[(
                "forwarded",
                r#"for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:cafe::17]:4711", for=10.0.0.9"#,
            )],
        );
        let k = lb().header(ForwardedHeader::Forwarded);
        assert_eq!(key(&k, &p).unwrap().as_str(), "ip:2001:db8:cafe::/64");
    }

    #[test]
    fn unknown_or_garbage_where_the_client_should_be_is_malformed() {
        for (h, v) in [
            ("x-forwarded-for", "not-an-ip, 10.0.0.3"),
            ("forwarded", "for=unknown"),
            ("forwarded", "for=_hidden"),
        ] {
            let header = if h == "forwarded" {
                ForwardedHeader::Forwarded
            } else {
                ForwardedHeader::XForwardedFor
            };
            let p = parts("10.0.0.2:1", &[(h, v)]);
            assert!(
                matches!(key(&lb().header(header), &p), Err(KeyError::Malformed(_))),
                "{v}"
            );
        }
        // Garbage to the left of the client is the client's own business.
        let p = parts("10.0.0.2:1", &[("x-forwarded-for", "garbage, 203.0.113.9")]);
        assert_eq!(key(&lb(), &p).unwrap().as_str(), "ip:203.0.113.9");
    }

    #[test]
    fn ipv6_is_grouped_by_prefix_and_mapped_ipv4_is_ipv4() {
        let p = parts("[2001:db8:1:2:aaaa::1]:1", &[]);
        assert_eq!(
            key(&PeerIp::new(), &p).unwrap().as_str(),
            "ip:2001:db8:1:2::/64"
        );
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(48), &p).unwrap().as_str(),
            "ip:2001:db8:1::/48"
        );
        assert_eq!(
            key(&PeerIp::new().ipv6_prefix(128), &p).unwrap().as_str(),
            "ip:2001:db8:1:2:aaaa::1"
        );
        let p = parts("[::ffff:192.0.2.7]:1", &[]);
        assert_eq!(key(&PeerIp::new(), &p).unwrap().as_str(), "ip:192.0.2.7");
    }

    #[test]
    fn ipv4_keys_are_written_in_dotted_decimal() {
        for ip in ["0.0.0.0", "10.20.0.9", "255.255.255.255", "192.0.2.100"] {
            let p = parts(&format!("{ip}:1"), &[]);
            assert_eq!(
                key(&PeerIp::new(), &p).unwrap().as_str(),
                format!("ip:{ip}")
            );
        }
    }

    #[test]
    fn missing_connect_info_is_a_server_error() {
        let (p, ()) = Request::new(()).into_parts();
        let err = key(&PeerIp::new(), &p).unwrap_err();
        assert_eq!(err, KeyError::NoPeerAddress);
        assert_eq!(err.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn x_real_ip_takes_one_address_from_a_trusted_peer() {
        let k = lb().header(ForwardedHeader::XRealIp);
        let p = parts("10.0.0.2:1", &[("x-real-ip", "203.0.113.5")]);
        assert_eq!(key(&k, &p).unwrap().as_str(), "ip:203.0.113.5");
        let p = parts("198.51.100.1:1", &[("x-real-ip", "203.0.113.5")]);
        assert_eq!(key(&k, &p).unwrap().as_str(), "ip:198.51.100.1");
    }
}
