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
/// client should be, or a chain shorter than the hop count, is
/// [`KeyError::Malformed`].
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
    pub fn client(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        let peer = peer_addr(parts).ok_or(KeyError::NoPeerAddress)?;
        if !self.trusted(peer) {
            return Ok(peer);
        }
        let chain = chain(&parts.headers, self.header)?;
        if chain.is_empty() {
            return Ok(peer);
        }
        match &self.trust {
            Trust::Hops(hops) => {
                let index = chain.len().checked_sub(*hops).ok_or_else(|| {
                    KeyError::Malformed(format!(
                        "the forwarding header: {} address(es) for {hops} trusted hop(s)",
                        chain.len()
                    ))
                })?;
                chain[index].ok_or_else(not_an_address)
            }
            Trust::Proxies(_) => {
                for hop in chain.iter().rev() {
                    match hop {
                        Some(ip) if self.trusted(*ip) => continue,
                        Some(ip) => return Ok(*ip),
                        None => return Err(not_an_address()),
                    }
                }
                // Every hop is a trusted proxy: the first one is the origin.
                chain[0].ok_or_else(not_an_address)
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

/// The addresses in the forwarding header, left to right, across all its
/// lines; `None` for an entry that is not an address.
fn chain(headers: &HeaderMap, header: ForwardedHeader) -> Result<Vec<Option<IpAddr>>, KeyError> {
    let name = match header {
        ForwardedHeader::XForwardedFor => "x-forwarded-for",
        ForwardedHeader::Forwarded => "forwarded",
        ForwardedHeader::XRealIp => "x-real-ip",
    };
    let mut out = Vec::new();
    for value in headers.get_all(name) {
        let text = value
            .to_str()
            .map_err(|_| KeyError::Malformed(format!("the {name} header (not visible ASCII)")))?;
        match header {
            ForwardedHeader::XForwardedFor | ForwardedHeader::XRealIp => {
                for entry in text.split(',') {
                    let entry = entry.trim();
                    if entry.is_empty() {
                        continue;
                    }
                    out.push(parse_node(entry));
                }
            }
            ForwardedHeader::Forwarded => {
                for element in split_unquoted(text, ',') {
                    let node = split_unquoted(element, ';').into_iter().find_map(|pair| {
                        let (k, v) = pair.split_once('=')?;
                        k.trim().eq_ignore_ascii_case("for").then_some(v.trim())
                    });
                    match node {
                        Some(v) => out.push(parse_node(unquote(v))),
                        None if element.trim().is_empty() => {}
                        None => out.push(None),
                    }
                }
            }
        }
        if out.len() > 64 {
            return Err(KeyError::Malformed(format!(
                "the {name} header (over 64 hops)"
            )));
        }
    }
    if header == ForwardedHeader::XRealIp && out.len() > 1 {
        return Err(KeyError::Malformed(
            "the x-real-ip header (several addresses)".into(),
        ));
    }
    Ok(out)
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
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
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
