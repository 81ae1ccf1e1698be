//! What a hostile client tries against the rules, through the `tollgate`
//! binary on a TCP port: garbling the forwarding header to get past the
//! deny list, and spelling a path differently to get past a path rule.
#![cfg(feature = "gateway")]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::gateway::{Gateway, RulesFile, upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `head` (a request line and headers, CRLF-separated, without the
/// blank line) as raw bytes and returns the status and the whole answer.
async fn raw(addr: SocketAddr, head: &[u8]) -> (u16, String) {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(head).await.unwrap();
        stream
            .write_all(b"\r\nhost: tollgate\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        answer
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the gateway answers within 10 s");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text:?}"));
    (status, text)
}

/// The gateway's peer (this test, on 127.0.0.1) is the trusted proxy that
/// appended the real client, a denied address, on the right; the client
/// wrote whatever it liked on the left.
const DENY: &str = r#"
on_missing_key: allow
client_ip:
  trusted_proxies: ["127.0.0.1", "10.0.0.0/8"]
  header: HEADER
deny:
  ips: ["198.51.100.0/24"]
rules:
  - name: default
    key: client_ip
    quotas: [{ algorithm: token_bucket, limit: 1000, period: 1m }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_client_never_gets_through_by_garbling_its_forwarding_header() {
    let up = upstream().await;
    let xff = RulesFile::new("deny-xff", &DENY.replace("HEADER", "x-forwarded-for"));
    let fwd = RulesFile::new("deny-fwd", &DENY.replace("HEADER", "forwarded"));
    let (xff_gw, fwd_gw) = (
        Gateway::start(&xff.0, Some(up.addr), &[]),
        Gateway::start(&fwd.0, Some(up.addr), &[]),
    );
    let (status, _) = raw(xff_gw.addr, b"GET / HTTP/1.1\r\nx-forwarded-for: 192.0.2.1").await;
    assert_eq!(status, 201, "an allowed client passes");
    let (status, _) = raw(
        xff_gw.addr,
        b"GET / HTTP/1.1\r\nx-forwarded-for: 198.51.100.7",
    )
    .await;
    assert_eq!(status, 403, "a denied client, plainly written");

    let many = format!("{}198.51.100.7", "203.0.113.9, ".repeat(64));
    let tricks: [(&Gateway, Vec<u8>, &str); 5] = [
        (
            &xff_gw,
            format!("x-forwarded-for: {many}").into_bytes(),
            "65 entries",
        ),
        (
            &xff_gw,
            b"x-forwarded-for: \xff\xfe, 198.51.100.7".to_vec(),
            "a non-ASCII byte",
        ),
        (
            &xff_gw,
            b"x-forwarded-for: 203.0.113.9\r\nx-forwarded-for: \xc3\xa9, 198.51.100.7".to_vec(),
            "a non-ASCII second line",
        ),
        (
            &fwd_gw,
            b"forwarded: for=\"[2001:db8::1, for=198.51.100.7".to_vec(),
            "an unclosed quote",
        ),
        (
            &fwd_gw,
            b"forwarded: for=198.51.100.7, for=\"unclosed".to_vec(),
            "an unclosed quote on the right",
        ),
    ];
    for (gw, header, what) in tricks {
        let mut head = b"GET / HTTP/1.1\r\n".to_vec();
        head.extend_from_slice(&header);
        let (status, text) = raw(gw.addr, &head).await;
        assert!(
            status == 400 || status == 403,
            "{what}: a denied client got {status}: {text}"
        );
        assert!(
            text.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{what}: {text}"
        );
    }
    assert_eq!(
        up.count(),
        1,
        "only the allowed client reached the upstream"
    );
}

const PATHS: &str = r#"
rules:
  - name: user
    match: { path: "/users/{id}" }
    key: global
    quotas: [{ name: user, algorithm: fixed_window, limit: 1, period: 1h }]
  - name: admin
    match: { prefix: /admin }
    key: global
    quotas: [{ name: admin, algorithm: fixed_window, limit: 1, period: 1h }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_rules_see_every_spelling_of_a_path_and_the_upstream_gets_the_one_they_saw() {
    let up = upstream().await;
    let rules = RulesFile::new("paths", PATHS);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let get = |path: &str| format!("GET {path} HTTP/1.1").into_bytes();

    // The first request of each rule spends its one; every other spelling of
    // the same resource must then be refused.
    for (first, dodges) in [
        (
            "/users/1",
            &[
                "//users/1",
                "/users/1/",
                "/%75sers/1",
                "/users/./1",
                "/x/../users/1",
                "/USERS/1",
                "/users//1?a=b",
            ][..],
        ),
        (
            "/admin",
            &[
                "/admin/x",
                "//admin",
                "/%61dmin/x",
                "/ADMIN",
                "/x/../admin/",
            ][..],
        ),
    ] {
        assert_eq!(raw(gw.addr, &get(first)).await.0, 201, "{first}");
        for dodge in dodges {
            let (status, text) = raw(gw.addr, &get(dodge)).await;
            assert_eq!(status, 429, "{dodge} escaped the rule for {first}: {text}");
        }
    }
    for unreadable in ["/admin%2fx", "/admin%2Fx", "/users%5c1", "/admin%zz"] {
        let (status, text) = raw(gw.addr, &get(unreadable)).await;
        assert_eq!(status, 400, "{unreadable}: {text}");
        assert!(text.contains("application/problem+json"), "{text}");
    }
    // Paths no rule limits are forwarded normalised too, query kept.
    assert_eq!(
        raw(gw.addr, &get("/free//a/./b/../c?x=1&y=%2F")).await.0,
        201
    );

    let seen: Vec<String> = up
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.uri.clone())
        .collect();
    assert_eq!(seen, ["/users/1", "/admin", "/free/a/c?x=1&y=%2F"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_may_make_the_trailing_slash_and_case_count() {
    let up = upstream().await;
    let rules = RulesFile::new(
        "strict",
        r#"
rules:
  - name: strict
    match: { path: /exact/, trailing_slash: strict, case: sensitive }
    key: global
    quotas: [{ name: strict, algorithm: fixed_window, limit: 1, period: 1h }]
"#,
    );
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let get = |path: &str| format!("GET {path} HTTP/1.1").into_bytes();
    assert_eq!(raw(gw.addr, &get("/exact/")).await.0, 201);
    assert_eq!(raw(gw.addr, &get("/exact")).await.0, 201, "no rule");
    assert_eq!(raw(gw.addr, &get("/EXACT/")).await.0, 201, "no rule");
    assert_eq!(
        raw(gw.addr, &get("//exact/./")).await.0,
        429,
        "still normalised"
    );
}
