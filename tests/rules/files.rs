//! Rules files served: matching, tiers and lists, live reload, elastic and
//! concurrency-only rules, through the layer they drive.
#![cfg(feature = "rules")]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::any;
use http::{Request, StatusCode};
use support::{Reply, reply};
use tollgate::RateLimitLayer;
use tollgate::rules::Rules;
use tower::ServiceExt;

fn app(rules: Rules) -> Router {
    Router::new()
        .fallback(any(|| async { "ok" }))
        .layer(RateLimitLayer::from_policy(rules))
}

fn req(
    method: &str,
    path: &str,
    ip: impl Into<std::net::IpAddr>,
    headers: &[(&str, &str)],
) -> Request<Body> {
    let mut r = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let mut r = r.body(Body::empty()).unwrap();
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((ip.into(), 5000))));
    r
}

async fn send(app: &Router, r: Request<Body>) -> Reply {
    reply(app.clone().oneshot(r).await.unwrap()).await
}

const TIERS: &str = r#"
allow: { keys: ["key:monitor"], ips: ["192.0.2.99"] }
deny: { keys: ["key:revoked"], ips: ["198.51.100.0/24"] }
rules:
  - name: login
    match: { path: /login, methods: [POST] }
    key: peer_ip
    quotas: [{ name: login, algorithm: sliding_log, limit: 2, period: 1m }]
  - name: api
    match: { prefix: /api/ }
    key: header:x-api-key
    quotas: [{ name: api, algorithm: fixed_window, limit: 2, period: 1m }]
    overrides:
      - { keys: ["key:gold"], multiply: 3 }
  - name: trial
    match: { path: "/search/{term}" }
    key: peer_ip
    quotas: [{ name: trial, algorithm: fixed_window, limit: 1, period: 1m, mode: shadow }]
"#;

/// Without a `client_ip` section, IPv6 clients are grouped by /64, as the
/// guide says: one /64 shares a limit, another has its own.
#[tokio::test]
async fn ipv6_clients_are_keyed_by_their_64_without_a_client_ip_section() {
    let rules = r#"
rules:
  - name: all
    key: peer_ip
    quotas: [{ name: all, algorithm: fixed_window, limit: 2, period: 1m }]
"#;
    let app = app(Rules::parse(rules).unwrap());
    let ip = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap();
    let (one, same_64, other_64) = (
        ip("2001:db8:1:1::1"),
        ip("2001:db8:1:1::2"),
        ip("2001:db8:1:2::1"),
    );
    assert_eq!(admitted(&app, 1, || req("GET", "/", one, &[])).await, 1);
    assert_eq!(admitted(&app, 3, || req("GET", "/", same_64, &[])).await, 1);
    assert_eq!(
        admitted(&app, 3, || req("GET", "/", other_64, &[])).await,
        2
    );
}

/// Lists copied from a dual-stack server's log, which writes IPv4 clients
/// as IPv4-mapped IPv6: they name those clients.
#[tokio::test]
async fn ip_lists_written_as_mapped_ipv6_name_ipv4_clients() {
    let rules = r#"
allow: { ips: ["::ffff:192.0.2.99"] }
deny: { ips: ["::ffff:198.51.100.0/120"] }
rules:
  - name: all
    key: peer_ip
    quotas: [{ name: all, algorithm: fixed_window, limit: 1, period: 1m }]
"#;
    let app = app(Rules::parse(rules).unwrap());
    let denied = send(&app, req("GET", "/", [198, 51, 100, 7], &[])).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN);
    assert_eq!(
        admitted(&app, 3, || req("GET", "/", [192, 0, 2, 99], &[])).await,
        3
    );
    assert_eq!(
        admitted(&app, 3, || req("GET", "/", [192, 0, 2, 1], &[])).await,
        1
    );
}

async fn admitted(app: &Router, n: usize, make: impl Fn() -> Request<Body>) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(send(app, make()).await.status == StatusCode::OK);
    }
    ok
}

#[tokio::test]
async fn rules_match_by_path_method_and_prefix_and_apply_tiers_and_lists() {
    let app = app(Rules::parse(TIERS).unwrap());
    let ip = [192, 0, 2, 1];
    assert_eq!(
        admitted(&app, 5, || req("POST", "/login", ip, &[])).await,
        2
    );
    assert_eq!(
        admitted(&app, 5, || req("GET", "/login", ip, &[])).await,
        5,
        "GET matches no rule"
    );
    let key = |k: &'static str| move || req("GET", "/api/x", ip, &[("x-api-key", k)]);
    assert_eq!(admitted(&app, 10, key("plain")).await, 2);
    assert_eq!(
        admitted(&app, 10, key("gold")).await,
        6,
        "the gold tier gets 3x"
    );
    assert_eq!(
        admitted(&app, 10, key("monitor")).await,
        10,
        "allowlisted key"
    );
    assert_eq!(
        send(&app, key("revoked")()).await.status,
        StatusCode::FORBIDDEN
    );
    let no_key = send(&app, req("GET", "/api/x", ip, &[])).await;
    assert_eq!(no_key.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        admitted(&app, 5, || req("POST", "/login", [192, 0, 2, 99], &[])).await,
        5,
        "allowlisted ip"
    );
    let denied = send(&app, req("GET", "/anything", [198, 51, 100, 7], &[])).await;
    assert_eq!(denied.status, StatusCode::FORBIDDEN);
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    // Shadow mode: never refused, but the headers tell.
    let trial = || req("GET", "/search/cats", ip, &[]);
    assert_eq!(admitted(&app, 3, trial).await, 3);
    assert_eq!(send(&app, trial()).await.list("ratelimit")[0].int("r"), 0);
}

#[tokio::test]
async fn matching_all_checks_every_matching_rule() {
    let yaml = r#"
matching: all
rules:
  - name: route
    match: { prefix: /a }
    key: peer_ip
    quotas: [{ name: route, algorithm: fixed_window, limit: 5, period: 1m }]
  - name: global
    key: global
    quotas: [{ name: global, algorithm: fixed_window, limit: 3, period: 1m }]
"#;
    let app = app(Rules::parse(yaml).unwrap());
    let r = send(&app, req("GET", "/a", [192, 0, 2, 1], &[])).await;
    let names: Vec<String> = r
        .list("ratelimit")
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    assert_eq!(names, ["route", "global"]);
    assert_eq!(
        admitted(&app, 5, || req("GET", "/b", [192, 0, 2, 2], &[])).await,
        2,
        "global: 3 in all"
    );
}

struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("tollgate-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rules.yaml");
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }

    fn write(&self, text: &str) {
        // Write then rename, as editors and config managers do.
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

fn two_rules(a_limit: u32, b_limit: u32) -> String {
    format!(
        r#"
rules:
  - name: a
    match: {{ prefix: /a }}
    key: peer_ip
    quotas: [{{ name: a, algorithm: fixed_window, limit: {a_limit}, period: 1h }}]
  - name: b
    key: peer_ip
    quotas: [{{ name: b, algorithm: fixed_window, limit: {b_limit}, period: 1h }}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_takes_effect_while_traffic_flows() {
    let file = TempFile::new("reload", &two_rules(100, 10));
    let rules = Rules::load(&file.0).unwrap();
    let _watch = rules.watch(Duration::from_millis(50));
    let app = app(rules);
    let ip = [192, 0, 2, 1];
    // Traffic on both rules, then rule a shrinks to 20 while b stays.
    assert_eq!(admitted(&app, 15, || req("GET", "/a", ip, &[])).await, 15);
    assert_eq!(admitted(&app, 4, || req("GET", "/b", ip, &[])).await, 4);
    file.write(&two_rules(20, 10));
    let changed = std::time::Instant::now();
    loop {
        // Keep traffic flowing until the new limit shows.
        let r = send(&app, req("GET", "/a", ip, &[])).await;
        if r.list("ratelimit-policy")[0].int("q") == 20 {
            break;
        }
        assert!(
            changed.elapsed() < Duration::from_secs(1),
            "the new limit did not hold within a second"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The changed quota starts afresh (its meaning changed); b kept its 4.
    let b = send(&app, req("GET", "/b", ip, &[])).await;
    assert_eq!(b.list("ratelimit")[0].int("r"), 10 - 5);

    // A broken file leaves the rules in force.
    file.write("rules:\n  - name: a\n    key: nonsense\n");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = send(&app, req("GET", "/b", ip, &[])).await;
    assert_eq!(
        (b.status, b.list("ratelimit")[0].int("r")),
        (StatusCode::OK, 4)
    );
}

#[test]
fn reload_reports_an_invalid_file_and_keeps_the_old_rules() {
    let file = TempFile::new("invalid", &two_rules(5, 5));
    let rules = Rules::load(&file.0).unwrap();
    assert_eq!(rules.reload(), Ok(false), "nothing changed");
    file.write("rules: [");
    let err = rules.reload().unwrap_err();
    assert!(err.to_string().contains("rules.yaml"), "{err}");
    assert!(rules.describe().contains("rule a:"));
    file.write(&two_rules(6, 5));
    assert_eq!(rules.reload(), Ok(true));
    assert!(rules.describe().contains("fixed_window 6 per"));
}

/// One fixed-window rule on `prefix`, as a rules-file list item.
fn rule_item(name: &str, prefix: &str, limit: u32) -> String {
    format!(
        "  - name: {name}\n    match: {{ prefix: {prefix} }}\n    key: peer_ip\n    quotas: [{{ name: {name}, algorithm: fixed_window, limit: {limit}, period: 1h }}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_in_place_applies_only_once_complete() {
    let login = rule_item("login", "/login", 2);
    let original = format!("rules:\n{login}{}", rule_item("original", "/original", 9));
    // The new version: twelve rules, then login's. Cut after any rule, it
    // is valid rules with login unlimited.
    let mut pieces: Vec<String> = (0..12)
        .map(|i| rule_item(&format!("r{i}"), &format!("/r{i}"), 100))
        .collect();
    pieces[0].insert_str(0, "rules:\n");
    pieces.push(login.clone());
    let mut prefix = String::new();
    for piece in &pieces {
        prefix.push_str(piece);
        assert!(Rules::parse(&prefix).is_ok(), "{prefix}");
    }
    let file = TempFile::new("in-place", &original);
    let rules = Rules::load(&file.0).unwrap();
    let every = Duration::from_millis(200);
    let _watch = rules.watch(every);
    let app = app(rules.clone());

    // Truncate, then write a rule at a time, pausing a tenth of the
    // interval between writes: the writing spans ticks, and between two
    // ticks the file always changed.
    let path = file.0.clone();
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        for piece in pieces {
            f.write_all(piece.as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let is_final = |d: &str| d.contains("rule login:") && d.contains("rule r11:");
    let started = std::time::Instant::now();
    let mut admitted_logins = 0;
    loop {
        let described = rules.describe();
        assert!(
            described.contains("rule original:") || is_final(&described),
            "a half-written version was applied:\n{described}"
        );
        let r = send(&app, req("POST", "/login", [192, 0, 2, 7], &[])).await;
        admitted_logins += usize::from(r.status == StatusCode::OK);
        if writer.is_finished() && is_final(&described) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the complete file was not applied:\n{described}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    writer.join().unwrap();
    // Login's quota never changed, so it kept its count all along.
    assert_eq!(admitted_logins, 2);
    assert!(rules.describe().contains("\"r0\": fixed_window 100 per"));
}

#[test]
fn a_fifo_a_directory_or_an_oversized_file_is_refused_with_the_reason() {
    let file = TempFile::new("not-regular", &two_rules(5, 5));
    let dir = file.0.parent().unwrap();
    let err = Rules::load(dir).unwrap_err().to_string();
    assert!(err.contains("is a directory, not a regular file"), "{err}");

    // Opening a FIFO for reading would wait for a writer that never comes.
    let fifo = dir.join("fifo.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let err = Rules::load(&fifo).unwrap_err().to_string();
    assert!(err.contains("is a FIFO, not a regular file"), "{err}");

    let max = tollgate::rules::MAX_RULES_FILE_BYTES;
    let big = dir.join("big.yaml");
    let mut text = two_rules(5, 5);
    text.push_str(&"#".repeat(max as usize + 1 - text.len()));
    text.push('\n');
    std::fs::write(&big, &text).unwrap();
    let err = Rules::load(&big).unwrap_err().to_string();
    assert!(
        err.contains(&format!("is {} bytes, over the {max} accepted", text.len())),
        "{err}"
    );
    // One byte less is read.
    text.truncate(max as usize - 1);
    text.push('\n');
    std::fs::write(&big, &text).unwrap();
    assert!(Rules::load(&big).is_ok());

    // A reload meeting any of them keeps the rules in force.
    let rules = Rules::load(&file.0).unwrap();
    std::fs::remove_file(&file.0).unwrap();
    std::fs::rename(&fifo, &file.0).unwrap();
    let err = rules.reload().unwrap_err().to_string();
    assert!(err.contains("FIFO"), "{err}");
    assert!(rules.describe().contains("rule a:"));
}

/// An elastic rate quota in a rules file: over its limit while the file's
/// measured load says there is room, and only to its limit with 9 of 10
/// requests in flight (a load of 0.9, where normal traffic is shed, so the
/// rule is critical; a normal one shows when the load is reached).
#[tokio::test]
async fn elastic_rate_quotas_in_rules_follow_the_measured_load() {
    let text = r#"
shedding: { max_in_flight: 10, target_latency: 60s }
rules:
  - name: held
    match: { prefix: /held }
    key: header:x-key
    priority: critical
    quotas: [{ algorithm: gcra, limit: 100, period: 1m }]
  - name: probe
    match: { prefix: /probe }
    key: global
    quotas: [{ algorithm: gcra, limit: 100, period: 1m }]
  - name: a
    key: global
    priority: critical
    quotas: [{ name: q, algorithm: gcra, limit: 2, period: 1m, mode: elastic, elastic_percent: 100 }]
"#;
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let g = std::sync::Arc::clone(&gate);
    let app = Router::new()
        .route(
            "/held",
            any(move || {
                let g = std::sync::Arc::clone(&g);
                async move {
                    // Bounded: a test that forgets to open the gate fails.
                    let _ = tokio::time::timeout(Duration::from_secs(5), g.acquire()).await;
                    "held"
                }
            }),
        )
        .fallback(any(|| async { "ok" }))
        .layer(RateLimitLayer::from_policy(Rules::parse(text).unwrap()));
    let make = || req("GET", "/", [192, 0, 2, 1], &[]);
    assert_eq!(admitted(&app, 3, make).await, 3, "idle: over the limit");

    let mut held = Vec::new();
    for i in 0..9 {
        let r = req(
            "GET",
            "/held",
            [192, 0, 2, 1],
            &[("x-key", &format!("h{i}"))],
        );
        held.push(tokio::spawn(app.clone().oneshot(r)));
    }
    // The held requests are counted from their decision: wait (bounded)
    // until normal traffic is shed, at a load of 0.8 or more.
    let start = std::time::Instant::now();
    loop {
        let probe = send(&app, req("GET", "/probe", [192, 0, 2, 1], &[])).await;
        if probe.status == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{}", probe.status);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The ceiling of 4 would admit one more; without room the 3 already
    // admitted are over the limit of 2.
    let r = send(&app, make()).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.list("ratelimit-policy")[0].int("q"), 2, "the limit shown");
    gate.add_permits(9);
    for h in held {
        let response = tokio::time::timeout(Duration::from_secs(5), h).await;
        assert_eq!(response.unwrap().unwrap().unwrap().status(), StatusCode::OK);
    }
}

/// A rule with only a concurrency limit: requests of one key under way are
/// limited, and nothing else; other rules' quotas still apply beside it.
#[tokio::test]
async fn a_concurrency_only_rule_limits_requests_under_way_and_nothing_else() {
    let text = r#"
matching: all
rules:
  - name: at-once
    key: global
    concurrency: { limit: 2 }
  - name: slow
    match: { prefix: /slow }
    key: global
    quotas: [{ name: slow, algorithm: gcra, limit: 1, period: 1m }]
"#;
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let g = std::sync::Arc::clone(&gate);
    let app = Router::new()
        .route(
            "/held",
            any(move || {
                let g = std::sync::Arc::clone(&g);
                async move {
                    let _ = tokio::time::timeout(Duration::from_secs(5), g.acquire()).await;
                    "held"
                }
            }),
        )
        .fallback(any(|| async { "ok" }))
        .layer(RateLimitLayer::from_policy(Rules::parse(text).unwrap()));
    let make = || req("GET", "/", [192, 0, 2, 1], &[]);
    // No rate quota: any number one after another.
    assert_eq!(admitted(&app, 20, make).await, 20);
    let r = send(&app, make()).await;
    let policy = r.list("ratelimit-policy");
    assert_eq!(policy.len(), 1, "only the concurrency quota's policy");
    assert_eq!(policy[0].name(), "concurrent");
    // Two under way: the third is refused.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(tokio::spawn(app.clone().oneshot(req(
            "GET",
            "/held",
            [192, 0, 2, 1],
            &[],
        ))));
    }
    let start = std::time::Instant::now();
    let refused = loop {
        let r = send(&app, make()).await;
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            break r;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "never refused");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(refused.json()["violated-policies"][0], "concurrent");
    gate.add_permits(2);
    for h in held {
        let response = tokio::time::timeout(Duration::from_secs(5), h).await;
        assert_eq!(response.unwrap().unwrap().unwrap().status(), StatusCode::OK);
    }
    // The other rule's rate quota still applies beside it.
    let slow = || req("GET", "/slow", [192, 0, 2, 1], &[]);
    assert_eq!(admitted(&app, 3, slow).await, 1);
}
