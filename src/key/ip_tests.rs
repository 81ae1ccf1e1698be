//! Tests of the IP key extractors and the forwarding headers they read.

use super::*;
use crate::key::ClientIp;
use crate::key::forwarded::{ForwardedHeader, MAX_BYTES, MAX_HOPS};
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

#[test]
fn ipv4_keys_are_written_like_display_for_every_octet_width() {
    use std::net::Ipv4Addr;
    for ip in [
        Ipv4Addr::new(0, 0, 0, 0),
        Ipv4Addr::new(255, 255, 255, 255),
        Ipv4Addr::new(9, 10, 99, 100),
        Ipv4Addr::new(203, 0, 113, 7),
    ] {
        assert_eq!(super::ipv4_key(ip).as_str(), format!("ip:{ip}"));
    }
    for n in 0..=255u8 {
        let ip = Ipv4Addr::new(n, 255 - n, n / 3, n % 7);
        assert_eq!(super::ipv4_key(ip).as_str(), format!("ip:{ip}"));
    }
}

#[test]
fn networks_written_as_mapped_ipv6_are_the_ipv4_networks_they_name() {
    // A dual-stack server logs IPv4 clients as `::ffff:a.b.c.d`; a network
    // copied from such a log names those clients, however they connect.
    for (written, is) in [
        ("::ffff:10.0.0.0/104", "10.0.0.0/8"),
        ("::ffff:203.0.113.7", "203.0.113.7/32"),
        ("::ffff:0:0/96", "0.0.0.0/0"),
        ("::ffff:0:0/80", "::ffff:0.0.0.0/80"),
        ("2001:db8::/32", "2001:db8::/32"),
    ] {
        let net: Network = written.parse().unwrap();
        assert_eq!(net.to_string(), is, "{written}");
    }
    let net: Network = "::ffff:10.0.0.0/104".parse().unwrap();
    assert!(net.contains("10.1.2.3".parse().unwrap()));
    assert!(net.contains("::ffff:10.1.2.3".parse().unwrap()));
    assert!(!net.contains("11.0.0.1".parse().unwrap()));
    // Trusted so, a proxy's forwarding header is read.
    let trusted = ClientIp::trusted_proxies(["::ffff:127.0.0.1".parse().unwrap()]);
    let p = parts("127.0.0.1:5000", &[("x-forwarded-for", "198.51.100.7")]);
    assert_eq!(key(&trusted, &p).unwrap().as_str(), "ip:198.51.100.7");
}
