//! Keys from IP addresses: the connection's peer, or the client behind
//! trusted proxies, grouped by network prefix.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::extract::ConnectInfo;
use compact_str::CompactString;
use http::request::Parts;
use ipnet::IpNet;

use super::forwarded::{ForwardedHeader, FromRight};
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
    #[inline]
    fn key(self, ip: IpAddr) -> Key {
        match ip.to_canonical() {
            IpAddr::V4(v4) => self.v4_key(v4),
            IpAddr::V6(v6) => self.v6_key(v6),
        }
    }

    /// The key of an IPv4 address: taken by value, so that the common case
    /// (the whole address) reads it from a register.
    #[inline]
    fn v4_key(self, ip: Ipv4Addr) -> Key {
        if self.v4 >= 32 {
            return Key(CompactString::from(ipv4_key(ip).as_str()));
        }
        self.network_key(IpAddr::V4(ip), self.v4)
    }

    fn v6_key(self, ip: Ipv6Addr) -> Key {
        if self.v6 >= 128 {
            return Key(compact_str::format_compact!("ip:{ip}"));
        }
        self.network_key(IpAddr::V6(ip), self.v6)
    }

    fn network_key(self, ip: IpAddr, prefix: u8) -> Key {
        // Prefixes are clamped when set, so this cannot fail.
        match IpNet::new(ip, prefix) {
            Ok(net) => Key(compact_str::format_compact!("ip:{}", net.trunc())),
            Err(_) => Key(compact_str::format_compact!("ip:{ip}")),
        }
    }
}

/// `ip:a.b.c.d` on the stack, written without the formatting machinery:
/// `Ipv4Addr`'s `Display`, or pushing characters one by one onto the key,
/// costs several times more on this path (callgrind on the layer).
///
/// The dotted octets are joined in a 128-bit number (each is its digits
/// and a dot from [`OCTETS`], at most 16 bytes in all), then stored in two
/// whole halves. Written byte by byte or four at a time, the bytes were
/// then read back a word at a time (the UTF-8 check, the copy into the
/// key) across several stores, which the processor cannot forward: a
/// stall of some ten cycles each, half of the key's time (perf samples).
fn ipv4_key(ip: Ipv4Addr) -> Ipv4Key {
    let mut text = 0u128;
    let mut len = 0;
    for n in ip.octets() {
        let (octet, digits) = OCTETS[usize::from(n)];
        text |= u128::from(u32::from_le_bytes(octet)) << (8 * len);
        len += u32::from(digits) + 1;
    }
    // "ip:" then the text, less its trailing dot.
    let low = u128::from_le_bytes(*b"ip:\0\0\0\0\0\0\0\0\0\0\0\0\0") | text << 24;
    let high = text >> 104;
    let mut bytes = [0; 32];
    bytes[..16].copy_from_slice(&low.to_le_bytes());
    bytes[16..].copy_from_slice(&high.to_le_bytes());
    Ipv4Key {
        bytes,
        len: 3 + len as usize - 1,
    }
}

/// Each octet's decimal digits and a dot, zeros to four bytes, and how
/// many digits: made when compiled.
const OCTETS: [([u8; 4], u8); 256] = {
    const fn digit(d: usize) -> u8 {
        b'0' + (d % 10) as u8
    }
    let mut table = [([0; 4], 0); 256];
    let mut n = 0;
    while n < 256 {
        table[n] = match n {
            100.. => ([digit(n / 100), digit(n / 10), digit(n), b'.'], 3),
            10.. => ([digit(n / 10), digit(n), b'.', 0], 2),
            _ => ([digit(n), b'.', 0, 0], 1),
        };
        n += 1;
    }
    table
};

/// The longest IPv4 key (3 + 15 bytes) in two 16-byte halves, and how much
/// of it is the key. Its bytes are ASCII or zeros and word-aligned, so
/// that their UTF-8 check runs a word at a time over all 32.
#[repr(C, align(16))]
struct Ipv4Key {
    bytes: [u8; 32],
    len: usize,
}

impl Ipv4Key {
    fn as_str(&self) -> &str {
        // Only "ip:", digits, dots and zeros were written, so the check
        // passes and `len` falls between two characters.
        std::str::from_utf8(&self.bytes)
            .ok()
            .and_then(|all| all.get(..self.len))
            .unwrap_or("ip:")
    }
}

/// The peer address of the connection: axum's `ConnectInfo<SocketAddr>`, a
/// `SocketAddr` extension set by other servers, or (with the `tonic`
/// feature) tonic's `TcpConnectInfo`.
pub(crate) fn peer_addr(parts: &Parts) -> Option<IpAddr> {
    let extensions = &parts.extensions;
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
        .or_else(|| extensions.get::<SocketAddr>().copied())
        .or_else(|| tonic_peer(extensions))
        .map(|addr| addr.ip().to_canonical())
}

/// The peer address a tonic server records for a TCP connection.
#[cfg(feature = "tonic")]
fn tonic_peer(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions
        .get::<tonic::transport::server::TcpConnectInfo>()?
        .remote_addr()
}

#[cfg(not(feature = "tonic"))]
fn tonic_peer(_: &http::Extensions) -> Option<SocketAddr> {
    None
}

/// The connection's peer address: `ip:<address>` (IPv6 grouped by /64).
///
/// Serve an axum router with
/// `into_make_service_with_connect_info::<SocketAddr>()` so the address is
/// recorded; a tonic server records it, and `PeerIp` reads it with this
/// crate's `tonic` feature; another server may insert the peer's
/// `SocketAddr` in the request extensions. Without it, requests have no key
/// ([`KeyError::NoPeerAddress`]).
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

    /// The key of a request from `ip` (the admin API names keys by address).
    #[cfg_attr(not(feature = "admin"), allow(dead_code))]
    pub(crate) fn key_of(self, ip: IpAddr) -> Key {
        self.prefixes.key(ip)
    }

    /// The key of the clients an operator writes as `text`: an address, or
    /// a network as long as the one addresses are grouped by
    /// (`2001:db8::/64`); `None` for text that names no key this builds.
    #[cfg_attr(not(feature = "rules"), allow(dead_code))]
    pub(crate) fn key_of_text(self, text: &str) -> Option<Key> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Some(self.key_of(ip));
        }
        let net = IpNet::from(Network::from(text.parse::<IpNet>().ok()?));
        let grouped_by = match net {
            IpNet::V4(_) => self.prefixes.v4,
            IpNet::V6(_) => self.prefixes.v6,
        };
        (net.prefix_len() == grouped_by).then(|| self.key_of(net.addr()))
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

/// A network of trusted proxies, or one proxy's address: parsed from
/// `10.0.0.0/8` or `2001:db8::/32`, or from `127.0.0.1` or `::1`, which
/// mean that address alone (/32, /128). Also made from an [`IpNet`] or an
/// [`IpAddr`]. IPv4 written as IPv4-mapped IPv6, as a dual-stack server
/// logs it (`::ffff:10.0.0.0/104`, `::ffff:203.0.113.7`), is the IPv4
/// network it names (`10.0.0.0/8`), as client addresses are read: it
/// contains the clients it names, however they connect.
///
/// ```
/// use tollgate::key::{ClientIp, Network};
///
/// let key = ClientIp::trusted_proxies(["127.0.0.1".parse()?, "10.0.0.0/8".parse()?]);
/// let loopback: Network = "::1".parse()?;
/// assert_eq!(loopback.to_string(), "::1/128");
/// # let _ = key;
/// # Ok::<(), tollgate::key::NetworkParseError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Network(IpNet);

impl Network {
    /// Whether `ip` is in this network (an IPv4-mapped IPv6 address as
    /// the IPv4 address it is).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip.to_canonical())
    }
}

impl From<IpNet> for Network {
    fn from(net: IpNet) -> Self {
        if let IpNet::V6(v6) = net
            && let Some(v4) = v6.addr().to_ipv4_mapped()
            && let Some(bits) = v6.prefix_len().checked_sub(96)
            && let Ok(v4) = ipnet::Ipv4Net::new(v4, bits)
        {
            return Network(IpNet::V4(v4));
        }
        Network(net)
    }
}

impl From<IpAddr> for Network {
    fn from(ip: IpAddr) -> Self {
        Network(IpNet::from(ip.to_canonical()))
    }
}

impl From<Network> for IpNet {
    fn from(net: Network) -> Self {
        net.0
    }
}

impl std::str::FromStr for Network {
    type Err = NetworkParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Network::from(net));
        }
        s.parse::<IpAddr>()
            .map(Network::from)
            .map_err(|_| NetworkParseError(s.chars().take(64).collect()))
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A string that is neither an IP address nor a network (see [`Network`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkParseError(String);

impl std::fmt::Display for NetworkParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} is not an IP address (such as 127.0.0.1) or network (such as 10.0.0.0/8)",
            self.0
        )
    }
}

impl std::error::Error for NetworkParseError {}

#[derive(Debug, Clone)]
enum Trust {
    Proxies(Vec<Network>),
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
/// let behind_lb = ClientIp::trusted_proxies(["10.0.0.0/8".parse()?, "::1".parse()?]);
/// let behind_two_hops = ClientIp::hops(2).header(ForwardedHeader::Forwarded);
/// # let _ = (behind_lb, behind_two_hops);
/// # Ok::<(), tollgate::key::NetworkParseError>(())
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
    /// Trusts proxies whose addresses are in these networks; a
    /// [`Network`] is parsed from a network (`10.0.0.0/8`) or an address
    /// (`127.0.0.1`, that one proxy alone).
    pub fn trusted_proxies(networks: impl IntoIterator<Item = Network>) -> Self {
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
            // `ip` is read canonical (`peer_addr`, `forwarded`), as the
            // networks are stored: `Network::contains` would convert it
            // again for each.
            Trust::Proxies(nets) => nets.iter().any(|n| n.0.contains(&ip)),
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

#[cfg(test)]
#[path = "ip_tests.rs"]
mod tests;
