//! The client's address behind trusted reverse proxies ([`ClientIp`]),
//! and the networks that say which proxies are trusted ([`Network`]).

use std::net::IpAddr;

use http::request::Parts;
use ipnet::IpNet;

use super::forwarded::{ForwardedHeader, FromRight};
use super::ip::{Prefixes, peer_addr};
use super::{KeyError, KeyExtractor, KeyFuture};

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
