//! `tollgate serve` and `tollgate check`, run as the binary, in front of a
//! real upstream on loopback.
#![cfg(feature = "gateway")]

use crate::support;

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::gateway::{Gateway, RulesFile, upstream};

const RULES: &str = r#"
deny: { keys: ["key:revoked"] }
allow: { keys: ["key:monitor"] }
rules:
  - name: api
    match: { prefix: /api/ }
    key: header:x-api-key
    quotas: [{ name: api, algorithm: fixed_window, limit: 2, period: 1h }]
    overrides:
      - { keys: ["key:gold"], multiply: 2 }
  - name: trial
    match: { prefix: /trial }
    key: peer_ip
    quotas: [{ name: trial, algorithm: fixed_window, limit: 1, period: 1h, mode: shadow }]
"#;

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

async fn call(
    gw: &Gateway,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Answer {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", gw.addr));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::new(body)).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_requests_reach_the_upstream_unchanged_and_limited_ones_never_do() {
    let up = upstream().await;
    let rules = RulesFile::new("passthrough", RULES);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    // A body large enough to stream in many frames.
    let body: Bytes = (0..2_000_000u32)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let headers = [
        ("x-api-key", "alice"),
        ("x-custom", "kept"),
        ("x-forwarded-for", "203.0.113.1"),
    ];
    let a = call(
        &gw,
        "PUT",
        "/api/items/7?color=blue&size=2",
        &headers,
        body.clone(),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "the upstream's status");
    assert_eq!(a.headers.get("x-upstream").unwrap(), "yes");
    assert_eq!(a.body, body, "the upstream's body, whole");
    assert!(a.headers.get("ratelimit").is_some());
    {
        let seen = up.seen.lock().unwrap();
        let s = &seen[0];
        assert_eq!(
            (s.method.as_str(), s.uri.as_str()),
            ("PUT", "/api/items/7?color=blue&size=2")
        );
        assert_eq!(s.headers.get("x-custom").unwrap(), "kept");
        assert_eq!(
            s.headers.get("x-forwarded-for").unwrap(),
            "203.0.113.1, 127.0.0.1"
        );
        assert_eq!(s.body, body.to_vec());
    }
    call(&gw, "GET", "/api/x", &headers, Bytes::new()).await;
    for _ in 0..3 {
        let refused = call(
            &gw,
            "GET",
            "/api/x",
            &headers,
            Bytes::from_static(b"secret"),
        )
        .await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.headers.get("retry-after").is_some());
    }
    assert_eq!(up.count(), 2, "refused requests never reach the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_lists_and_shadow_mode_behave_as_written() {
    let up = upstream().await;
    let rules = RulesFile::new("tiers", RULES);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let ok = |n: usize, key: &'static str| {
        let gw = &gw;
        async move {
            let mut passed = 0;
            for _ in 0..n {
                let a = call(gw, "GET", "/api/x", &[("x-api-key", key)], Bytes::new()).await;
                passed += usize::from(a.status == StatusCode::CREATED);
            }
            passed
        }
    };
    assert_eq!(ok(6, "bob").await, 2);
    assert_eq!(ok(6, "gold").await, 4, "gold gets twice the limit");
    assert_eq!(ok(6, "monitor").await, 6, "allowlisted");
    let before = up.count();
    let denied = call(
        &gw,
        "GET",
        "/api/x",
        &[("x-api-key", "revoked")],
        Bytes::new(),
    )
    .await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN);
    assert_eq!(
        up.count(),
        before,
        "a denied request never reaches the upstream"
    );
    for _ in 0..3 {
        let t = call(&gw, "GET", "/trial", &[], Bytes::new()).await;
        assert_eq!(t.status, StatusCode::CREATED, "shadow mode never refuses");
    }
    let t = call(&gw, "GET", "/trial", &[], Bytes::new()).await;
    assert!(
        t.headers
            .get("ratelimit")
            .unwrap()
            .to_str()
            .unwrap()
            .contains("r=0")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_upstream_it_answers_itself_and_a_dead_upstream_is_a_502() {
    let rules = RulesFile::new("echo", RULES);
    let gw = Gateway::start(&rules.0, None, &[]);
    let a = call(
        &gw,
        "GET",
        "/api/x",
        &[("x-api-key", "carol")],
        Bytes::new(),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let text = std::str::from_utf8(&a.body).unwrap();
    assert!(
        text.contains("\"admitted\":true") && text.contains("\"path\":\"/api/x\""),
        "{text}"
    );

    let dead = support::gateway::dead_port();
    let gw = Gateway::start(&rules.0, Some(dead.addr), &[]);
    let a = call(&gw, "GET", "/api/x", &[("x-api-key", "dave")], Bytes::new()).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        a.headers.get("content-type").unwrap(),
        "application/problem+json"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_change_reaches_a_running_gateway() {
    let up = upstream().await;
    let rules = RulesFile::new("reload", RULES);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let erin = [("x-api-key", "erin")];
    for _ in 0..2 {
        call(&gw, "GET", "/api/x", &erin, Bytes::new()).await;
    }
    assert_eq!(
        call(&gw, "GET", "/api/x", &erin, Bytes::new()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    std::fs::write(&rules.0, RULES.replace("limit: 2,", "limit: 50,")).unwrap();
    let start = std::time::Instant::now();
    while call(&gw, "GET", "/api/x", &erin, Bytes::new()).await.status != StatusCode::CREATED {
        assert!(start.elapsed() < Duration::from_secs(2), "reload not seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn check_validates_and_describes() {
    let ok = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config", "examples/rules.yaml"])
        .output()
        .unwrap();
    assert!(ok.status.success());
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(
        out.contains("valid") && out.contains("rule login:"),
        "{out}"
    );

    let bad = RulesFile::new(
        "bad",
        "rules:\n  - name: a\n    key: global\n    quotas:\n      - { algorithm: gcra, limit: 5, period: soon }\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config"])
        .arg(&bad.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 5") && err.contains("\"soon\" is not a period"),
        "{err}"
    );

    let usage = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("serve")
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("--config FILE is required"));
}

#[test]
fn sigterm_stops_the_gateway_gracefully() {
    let rules = RulesFile::new("term", RULES);
    let mut gw = Gateway::start(&rules.0, None, &[]);
    let pid = gw.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = gw.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mkfifo(path: &std::path::Path) {
    let made = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Waits (boundedly) until the log at `path` has a line with all of `words`.
async fn logged(path: &std::path::Path, words: &[&str]) -> String {
    let start = std::time::Instant::now();
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.lines().any(|l| words.iter().all(|w| l.contains(w))) {
            return log;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no line with {words:?} in\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_place_of_the_rules_file_keeps_traffic_and_rules_going() {
    let rules = RulesFile::new("fifo", RULES);
    let log_path = rules.0.with_file_name("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let gw = Gateway::start_logging_to(&rules.0, None, &[], Some(log));
    let fifo = rules.0.with_file_name("next.yaml");
    mkfifo(&fifo);
    std::fs::rename(&fifo, &rules.0).unwrap();
    // Six requests over two seconds, eight reload ticks: each is answered.
    for _ in 0..6 {
        let answer = tokio::time::timeout(
            Duration::from_secs(3),
            call(&gw, "GET", "/elsewhere", &[], Bytes::new()),
        )
        .await
        .expect("a request was not answered while the rules file is a FIFO");
        assert_eq!(answer.status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    logged(
        &log_path,
        &["rules file refused", "is a FIFO, not a regular file"],
    )
    .await;
    // The rules in force still hold (the api key's limit is 2)...
    let key = [("x-api-key", "fifo")];
    let statuses = [
        call(&gw, "GET", "/api/x", &key, Bytes::new()).await.status,
        call(&gw, "GET", "/api/x", &key, Bytes::new()).await.status,
        call(&gw, "GET", "/api/x", &key, Bytes::new()).await.status,
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // ...and a regular file renamed over the FIFO is applied.
    let next = rules.0.with_file_name("next.yaml");
    std::fs::write(&next, RULES.replace("limit: 2,", "limit: 50,")).unwrap();
    std::fs::rename(&next, &rules.0).unwrap();
    let start = std::time::Instant::now();
    while call(&gw, "GET", "/api/x", &key, Bytes::new()).await.status != StatusCode::OK {
        assert!(start.elapsed() < Duration::from_secs(3), "reload not seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `tollgate check` on `path`, killed if it runs past 10 s.
fn check(path: &std::path::Path) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("check")
        .arg("--config")
        .arg(path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tollgate check {} hung", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.success(), err)
}

#[test]
fn check_refuses_a_fifo_and_an_oversized_rules_file_with_the_reason() {
    let rules = RulesFile::new("check-refused", RULES);
    let fifo = rules.0.with_file_name("fifo.yaml");
    mkfifo(&fifo);
    let (ok, err) = check(&fifo);
    assert!(
        !ok && err.contains("is a FIFO, not a regular file"),
        "{err}"
    );

    let big = rules.0.with_file_name("big.yaml");
    let text = format!("{RULES}#{}\n", "x".repeat(4 << 20));
    std::fs::write(&big, &text).unwrap();
    let (ok, err) = check(&big);
    let says = format!("is {} bytes, over the 4194304 accepted", text.len());
    assert!(!ok && err.contains(&says), "{err}");
}
