//! `X-Forwarded-For` and `Forwarded` parsing on random input: it never
//! panics, and the client found from the right ignores whatever a client
//! wrote further left (too many entries, bytes that are not ASCII, broken
//! quotes). Test names start with `parse_`: a script runs them for longer
//! outside CI with a larger `PROPTEST_CASES`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::extract::ConnectInfo;
use http::HeaderValue;
use http::request::Parts;
use proptest::prelude::*;
use tollgate::key::{ClientIp, ForwardedHeader, Network};

const HEADERS: [ForwardedHeader; 3] = [
    ForwardedHeader::XForwardedFor,
    ForwardedHeader::Forwarded,
    ForwardedHeader::XRealIp,
];

fn name(header: ForwardedHeader) -> &'static str {
    match header {
        ForwardedHeader::XForwardedFor => "x-forwarded-for",
        ForwardedHeader::Forwarded => "forwarded",
        _ => "x-real-ip",
    }
}

/// A request from `peer` with these lines of one header.
fn parts(peer: IpAddr, header: &str, lines: &[Vec<u8>]) -> Parts {
    let mut req = http::Request::builder();
    for line in lines {
        req = req.header(header, HeaderValue::from_bytes(line).unwrap());
    }
    let (mut parts, ()) = req.body(()).unwrap().into_parts();
    parts
        .extensions
        .insert(ConnectInfo(SocketAddr::new(peer, 4000)));
    parts
}

/// Bytes a header value may hold, weighted towards the ones parsers trip on.
fn header_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => prop::sample::select(b",;=\"\\[]:. \t_fForunkw0123456789abcdef".to_vec()),
        1 => 0x20u8..=0x7e,
        1 => 0x80u8..=0xff,
    ]
}

/// Up to four lines of anything, some of them long: a short pattern
/// repeated, so that the caps on entries and bytes are crossed cheaply.
fn garbage() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(
        (prop::collection::vec(header_byte(), 0..64), 1usize..400)
            .prop_map(|(pattern, times)| pattern.repeat(times)),
        0..4,
    )
}

fn trusted() -> impl Strategy<Value = IpAddr> {
    any::<[u8; 3]>().prop_map(|[a, b, c]| IpAddr::V4(Ipv4Addr::new(10, a, b, c)))
}

fn is_trusted(ip: IpAddr) -> bool {
    matches!(ip.to_canonical(), IpAddr::V4(v4) if v4.octets()[0] == 10)
}

/// An address outside the trusted network, as it will be read back.
fn client() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|n| IpAddr::V4(Ipv4Addr::from(n))),
        any::<u128>().prop_map(|n| IpAddr::V6(Ipv6Addr::from(n))),
    ]
    .prop_map(|ip| ip.to_canonical())
    .prop_filter("outside the trusted network", |ip| !is_trusted(*ip))
}

/// How a proxy writes an address into the header: `(header, with_port)`.
fn entry(header: ForwardedHeader, ip: IpAddr, port: bool, extra: bool) -> String {
    let node = match (ip, port) {
        (IpAddr::V4(v4), false) => v4.to_string(),
        (IpAddr::V4(v4), true) => format!("{v4}:8080"),
        (IpAddr::V6(v6), false) => format!("[{v6}]"),
        (IpAddr::V6(v6), true) => format!("[{v6}]:8080"),
    };
    match header {
        ForwardedHeader::Forwarded if extra => format!("proto=https;for=\"{node}\";by=_lb"),
        ForwardedHeader::Forwarded => format!("for=\"{node}\""),
        _ if ip.is_ipv6() && !port && !extra => ip.to_string(),
        _ => node,
    }
}

/// The garbage lines, then the right part (the client, then the trusted
/// hops) written by proxies: appended to the last garbage line or on lines
/// of their own, split where `splits` says.
fn with_right_part(mut lines: Vec<Vec<u8>>, right: &[String], splits: &[bool]) -> Vec<Vec<u8>> {
    let mut line: Vec<u8> = match lines.pop() {
        Some(last) if splits.first() != Some(&true) => last,
        Some(last) => {
            lines.push(last);
            Vec::new()
        }
        None => Vec::new(),
    };
    for (i, e) in right.iter().enumerate() {
        if i > 0 && splits.get(i).copied().unwrap_or(false) {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.extend_from_slice(b", ");
        }
        line.extend_from_slice(e.as_bytes());
    }
    lines.push(line);
    lines
}

proptest! {
    #[test]
    fn parse_any_forwarding_header_is_read_without_panic(
        lines in garbage(),
        header in prop::sample::select(HEADERS.to_vec()),
        hops in 0usize..4,
        peer in prop_oneof![trusted(), client()],
    ) {
        let extractor = if hops == 0 {
            ClientIp::trusted_proxies(["10.0.0.0/8".parse().unwrap()])
        } else {
            ClientIp::hops(hops)
        }
        .header(header);
        let p = parts(peer, name(header), &lines);
        let found = extractor.client(&p);
        if lines.is_empty() || !is_trusted(peer) && hops == 0 {
            // No header, or a peer whose header is not believed: the peer.
            prop_assert_eq!(found, Ok(peer.to_canonical()));
        }
    }

    #[test]
    fn parse_x_forwarded_for_finds_the_client_from_the_right(
        lines in garbage(),
        client in client(),
        hops in prop::collection::vec(trusted(), 0..6),
        ports in any::<(bool, bool)>(),
        splits in prop::collection::vec(any::<bool>(), 8),
    ) {
        right_part_wins(ForwardedHeader::XForwardedFor, lines, client, &hops, ports, &splits)?;
    }

    #[test]
    fn parse_forwarded_finds_the_client_from_the_right(
        lines in garbage(),
        client in client(),
        hops in prop::collection::vec(trusted(), 0..6),
        ports in any::<(bool, bool)>(),
        splits in prop::collection::vec(any::<bool>(), 8),
    ) {
        right_part_wins(ForwardedHeader::Forwarded, lines, client, &hops, ports, &splits)?;
    }
}

fn right_part_wins(
    header: ForwardedHeader,
    lines: Vec<Vec<u8>>,
    client: IpAddr,
    hops: &[IpAddr],
    (port, extra): (bool, bool),
    splits: &[bool],
) -> Result<(), TestCaseError> {
    let right: Vec<String> = std::iter::once(client)
        .chain(hops.iter().copied())
        .map(|ip| entry(header, ip, port, extra))
        .collect();
    let lines = with_right_part(lines, &right, splits);
    let p = parts("10.9.9.9".parse().unwrap(), name(header), &lines);
    let by_network = ClientIp::trusted_proxies(["10.0.0.0/8".parse().unwrap()]).header(header);
    prop_assert_eq!(by_network.client(&p), Ok(client));
    let by_count = ClientIp::hops(hops.len() + 1).header(header);
    prop_assert_eq!(by_count.client(&p), Ok(client));
    Ok(())
}

#[test]
fn a_trusted_proxy_written_as_an_address_is_that_address_alone() {
    let key = ClientIp::trusted_proxies(["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()]);
    let xff = |peer: &str| {
        parts(
            peer.parse().unwrap(),
            "x-forwarded-for",
            &[b"203.0.113.9".to_vec()],
        )
    };
    let client: IpAddr = "203.0.113.9".parse().unwrap();
    assert_eq!(key.client(&xff("127.0.0.1")), Ok(client));
    assert_eq!(key.client(&xff("::1")), Ok(client));
    // Its neighbours are not trusted: their header is not believed.
    assert_eq!(
        key.client(&xff("127.0.0.2")),
        Ok("127.0.0.2".parse::<IpAddr>().unwrap())
    );
}

#[test]
fn a_trusted_proxy_that_is_no_address_is_refused_with_what_was_written() {
    for bad in ["127.0.0.1/33", "localhost", "", "10.0.0.0/8 "] {
        let err = bad.parse::<Network>().unwrap_err().to_string();
        assert!(err.contains(&format!("{bad:?}")), "{err}");
        assert!(err.contains("10.0.0.0/8"), "{err}");
    }
    let net: Network = "10.0.0.0/8".parse().unwrap();
    assert!(net.contains("10.1.2.3".parse().unwrap()));
    assert!(!net.contains("11.0.0.1".parse().unwrap()));
}
