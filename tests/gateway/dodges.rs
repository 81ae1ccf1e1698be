//! What a hostile client tries against the rules, through the `tollgate`
//! binary on a TCP port: garbling the forwarding header to get past the
//! deny list, spelling a path, a method or a host differently to get past a
//! rule, and sending a header twice.
#![cfg(feature = "gateway")]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use support::gateway::{Gateway, RulesFile, upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Sends `head` (a request line and headers, CRLF-separated, without the
/// blank line) as raw bytes and returns the status and the whole answer.
async fn raw(addr: SocketAddr, head: &[u8]) -> (u16, String) {
    let mut request = head.to_vec();
    request.extend_from_slice(b"\r\nhost: tollgate\r\nconnection: close\r\n\r\n");
    exchange(addr, &request).await
}

/// Sends a whole request as raw bytes, its `Host` lines included, and
/// returns the status and the whole answer.
async fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
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

const SPELLINGS: &str = r#"
rules:
  - name: login
    match: { path: /login, methods: [GET] }
    key: route
    quotas: [{ name: login, algorithm: fixed_window, limit: 1, period: 1h }]
  - name: cafe
    match: { path: "/caf\u00e9" }
    key: global
    quotas: [{ name: cafe, algorithm: fixed_window, limit: 1, period: 1h }]
  - name: menu
    match: { path: /men%C3%BC }
    key: global
    quotas: [{ name: menu, algorithm: fixed_window, limit: 1, period: 1h }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_parameters_methods_and_non_ascii_spellings_meet_the_rule_written_for_them() {
    let up = upstream().await;
    let rules = RulesFile::new("spellings", SPELLINGS);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let line = |line: &str| line.as_bytes().to_vec();

    assert_eq!(raw(gw.addr, &line("GET /login HTTP/1.1")).await.0, 201);
    for dodge in [
        "GET /login;jsessionid=1 HTTP/1.1",
        "GET /login;jsessionid=1/ HTTP/1.1",
        "GET /admin/..;/login HTTP/1.1",
        "HEAD /login HTTP/1.1",
        "get /login HTTP/1.1",
        "Get /login;x HTTP/1.1",
    ] {
        let (status, text) = raw(gw.addr, &line(dodge)).await;
        assert_eq!(status, 429, "{dodge} escaped the GET /login rule: {text}");
    }
    for unreadable in ["GET /login\\x HTTP/1.1", "GET /admin\\..\\login HTTP/1.1"] {
        let (status, text) = raw(gw.addr, &line(unreadable)).await;
        assert_eq!(status, 400, "{unreadable}: {text}");
        assert!(text.contains("application/problem+json"), "{text}");
    }
    // A rule written raw meets the encoded spelling, and one written
    // encoded meets the raw one, whichever comes first.
    for (first, dodges) in [
        (
            "/caf%C3%A9",
            &["/caf\u{e9}", "/caf%c3%a9", "/x/../caf\u{e9};v=2"][..],
        ),
        ("/men\u{fc}", &["/men%C3%BC", "/men%c3%bc"][..]),
    ] {
        let get = |path: &str| format!("GET {path} HTTP/1.1").into_bytes();
        assert_eq!(raw(gw.addr, &get(first)).await.0, 201, "{first}");
        for dodge in dodges {
            let (status, text) = raw(gw.addr, &get(dodge)).await;
            assert_eq!(status, 429, "{dodge} escaped the rule: {text}");
        }
    }
    // POST is not GET: the GET rule leaves it alone.
    assert_eq!(raw(gw.addr, &line("POST /login HTTP/1.1")).await.0, 201);
    let seen: Vec<(String, String)> = (up.seen.lock().unwrap().iter())
        .map(|s| (s.method.clone(), s.uri.clone()))
        .collect();
    let want = [
        ("GET", "/login"),
        ("GET", "/caf%C3%A9"),
        ("GET", "/men%C3%BC"),
        ("POST", "/login"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(m, u)| (m.to_string(), u.to_string()))
        .collect();
    assert_eq!(seen, want);
}

const HOSTS: &str = r#"
rules:
  - name: admin
    match: { headers: [{ name: host, value: Admin.Example. }] }
    key: global
    quotas: [{ name: admin, algorithm: fixed_window, limit: 1, period: 1h }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_a_host_meets_its_rule_and_two_host_lines_are_refused() {
    let up = upstream().await;
    let rules = RulesFile::new("hosts", HOSTS);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let with = |target: &str, hosts: &[&str]| {
        let mut request = format!("GET {target} HTTP/1.1\r\nconnection: close\r\n");
        for host in hosts {
            request.push_str(&format!("host: {host}\r\n"));
        }
        request.push_str("\r\n");
        request.into_bytes()
    };
    assert_eq!(
        exchange(gw.addr, &with("/", &["admin.example"])).await.0,
        201
    );
    assert_eq!(
        exchange(gw.addr, &with("/", &["www.example"])).await.0,
        201,
        "another host is not limited"
    );
    for (target, hosts, want) in [
        ("/", &["ADMIN.example"][..], 429),
        ("/", &["admin.example."], 429),
        ("/", &["admin.example:80"], 429),
        ("/", &["Admin.Example.:80"], 429),
        ("http://admin.example/", &["www.example"], 429),
        ("/", &["www.example", "admin.example"], 400),
        ("/", &["admin.example", "admin.example"], 400),
        ("/", &["admin..example"], 400),
        ("/", &["adm%69n.example"], 400),
        ("/", &["user@admin.example"], 400),
    ] {
        let (status, text) = exchange(gw.addr, &with(target, hosts)).await;
        assert_eq!(status, want, "{target} {hosts:?}: {text}");
    }
    let seen: Vec<String> = (up.seen.lock().unwrap().iter())
        .map(|s| s.headers["host"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(seen, ["admin.example", "www.example"]);
}

const IPV6_HOST: &str = r#"
rules:
  - name: loopback
    match: { headers: [{ name: host, value: "[::1]" }] }
    key: global
    quotas: [{ name: loopback, algorithm: fixed_window, limit: 1, period: 1h }]
"#;

/// An IPv6 address has many spellings; a client that writes another than
/// the rule's meets the rule all the same, and brackets around what is no
/// address are refused, not matched against nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_an_ipv6_host_meets_its_rule() {
    let up = upstream().await;
    let rules = RulesFile::new("ipv6-host", IPV6_HOST);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let with = |host: &str| {
        format!("GET / HTTP/1.1\r\nconnection: close\r\nhost: {host}\r\n\r\n").into_bytes()
    };
    assert_eq!(exchange(gw.addr, &with("[::1]")).await.0, 201);
    for (host, want) in [
        ("[0:0:0:0:0:0:0:1]", 429),
        ("[0::0001]:80", 429),
        ("[..]", 400),
        ("[1.2.3.4]", 400),
    ] {
        let (status, text) = exchange(gw.addr, &with(host)).await;
        assert_eq!(status, want, "{host}: {text}");
    }
}

const KEYS: &str = r#"
deny: { keys: ["key:revoked"] }
rules:
  - name: free
    match: { headers: [{ name: x-tier, value: free }] }
    key: header:x-api-key
    quotas: [{ name: free, algorithm: fixed_window, limit: 1, period: 1h }]
  - name: api
    key: header:x-api-key
    quotas: [{ name: api, algorithm: fixed_window, limit: 100, period: 1h }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_or_match_header_sent_twice_is_refused_whichever_line_the_upstream_reads() {
    let up = upstream().await;
    let rules = RulesFile::new("keys", KEYS);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let get = |headers: &str| format!("GET / HTTP/1.1\r\n{headers}").into_bytes();
    for (headers, want) in [
        ("x-api-key: good", 201),
        ("x-api-key: revoked", 403),
        ("x-api-key: junk\r\nx-api-key: revoked", 400),
        ("x-api-key: revoked\r\nX-Api-Key: junk", 400),
        ("x-api-key: k2\r\nx-tier: free", 201),
        ("x-api-key: k2\r\nx-tier: free", 429),
        ("x-api-key: k2\r\nx-tier: paid\r\nx-tier: free", 400),
    ] {
        let (status, text) = raw(gw.addr, &get(headers)).await;
        assert_eq!(status, want, "{headers:?}: {text}");
        if want == 400 {
            assert!(text.contains("more than one"), "{text}");
            assert!(!text.contains("revoked"), "the key is not echoed: {text}");
        }
    }
    assert_eq!(up.count(), 2, "only the two admitted requests reached it");
}
