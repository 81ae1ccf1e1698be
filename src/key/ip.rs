//! Keys from IP addresses grouped by network prefix: the connection's
//! peer ([`PeerIp`]), and the keys [`ClientIp`](super::ClientIp) makes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::extract::ConnectInfo;
use compact_str::CompactString;
use http::request::Parts;
use ipnet::IpNet;

use super::client_ip::Network;
use super::{Key, KeyError, KeyExtractor, KeyFuture};

/// How addresses are grouped: one key per IPv4 address and per IPv6 /64 by
/// default, because one IPv6 host owns a /64 (or more) and could otherwise
/// rotate through it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Prefixes {
    v4: u8,
    v6: u8,
}

impl Default for Prefixes {
    fn default() -> Self {
        Prefixes { v4: 32, v6: 64 }
    }
}

impl Prefixes {
    /// Groups IPv6 addresses by `bits` (at most 128).
    pub(super) fn ipv6(&mut self, bits: u8) {
        self.v6 = bits.min(128);
    }

    /// Groups IPv4 addresses by `bits` (at most 32).
    pub(super) fn ipv4(&mut self, bits: u8) {
        self.v4 = bits.min(32);
    }

    /// `ip:<address>` or `ip:<network>/<prefix>`. IPv4-mapped IPv6 addresses
    /// (what a dual-stack socket reports for IPv4 clients) count as IPv4.
    #[inline]
    pub(super) fn key(self, ip: IpAddr) -> Key {
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
/// [`ClientIp`](super::ClientIp) there.
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
        self.prefixes.ipv6(bits);
        self
    }

    /// Groups IPv4 addresses by this prefix length (0 to 32; 32 by default).
    pub fn ipv4_prefix(mut self, bits: u8) -> Self {
        self.prefixes.ipv4(bits);
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

#[cfg(test)]
#[path = "ip_tests.rs"]
mod tests;
