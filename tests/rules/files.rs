//! Rules files: parsing, errors, live reload, and the layer they drive.
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

#[test]
fn the_commented_example_parses() {
    let rules = Rules::load("examples/rules.yaml").unwrap();
    let text = rules.describe();
    for rule in ["login", "api", "exports", "search-trial", "default"] {
        assert!(text.contains(&format!("rule {rule}:")), "{text}");
    }
}

/// Parses `yaml`, expecting an error that names `place` and says `says`.
fn error_where(yaml: &str, place: &str, says: &str) {
    let err = Rules::parse(yaml).expect_err(yaml).to_string();
    assert!(err.contains(place), "wanted {place}: {err}");
    assert!(err.contains(says), "wanted {says:?}: {err}");
}

/// Parses `yaml`, expecting an error at `line` that says `says`.
fn error(yaml: &str, line: usize, says: &str) {
    error_where(yaml, &format!("line {line} "), says);
}

/// Parses `yaml`, expecting an error at `line` and `column` that says `says`.
fn error_at(yaml: &str, line: usize, column: usize, says: &str) {
    error_where(yaml, &format!("line {line} column {column}:"), says);
}

const HEAD: &str = "rules:\n  - name: a\n    key: client_ip\n    quotas:\n";

#[test]
fn each_mistake_is_reported_where_it_is_written() {
    error(
        &format!("{HEAD}      - {{ algorithm: token-bucket, limit: 5, period: 1m }}\n"),
        5,
        "valid algorithms are token_bucket, leaky_bucket, fixed_window, sliding_log, sliding_window, gcra",
    );
    error(
        &format!("{HEAD}      - algorithm: gcra\n        limit: 5\n        period: 0s\n"),
        7,
        "zero",
    );
    error(
        &format!("{HEAD}      - algorithm: gcra\n        limit: 5\n        period: 5 minutes\n"),
        7,
        "write a number and a unit",
    );
    error(
        &format!("{HEAD}      - algorithm: gcra\n        limit: 0\n        period: 1s\n"),
        5,
        "the limit must be at least 1",
    );
    error(
        &format!("{HEAD}      - {{ algorithm: fixed_window, limit: 5, period: 1s, burst: 9 }}\n"),
        5,
        "fixed_window has no burst",
    );
    error(
        &format!("{HEAD}      - {{ algorithm: gcra, limit: 5, period: 1s, mode: soft }}\n"),
        5,
        "needs soft_percent",
    );
    error(
        &format!("{HEAD}      - {{ algorithm: gcra, limit: 5, period: 1s, limt: 3 }}\n"),
        5,
        "unknown field `limt`",
    );
    error(
        "rules:\n  - name: a\n    key: client_id\n    quotas: []\n",
        3,
        "valid keys are peer_ip, client_ip, header:<name>, user, global, route",
    );
    error(
        "rules:\n  - name: a\n    key: global\n    quotas: []\n",
        4,
        "at least one quota",
    );
    error(
        "allow:\n  ips: [10.0.0.300/8]\nrules: []\n",
        2,
        "not an IP address or network",
    );
    error(
        "headers: x-ratelimit\nrules: []\n",
        1,
        "valid values are ietf, draft6, legacy, none",
    );
    error(
        "rules:\n  - name: a\n    match: { path: \"users/{id}\" }\n    key: global\n    quotas: []\n",
        3,
        "must start with /",
    );
    error("rules:\n  - name: a\n    key: [global\n", 3, "");
}

#[test]
fn mistakes_across_rules_are_named() {
    let two = "rules:\n  - name: a\n    key: global\n    quotas: [{ algorithm: gcra, limit: 1, period: 1s }]\n";
    let err = Rules::parse(&format!("{two}{}", &two["rules:\n".len()..])).unwrap_err();
    assert!(
        err.to_string().contains("two rules are named \"a\""),
        "{err}"
    );
    let zero = format!(
        "{}    overrides:\n      - {{ keys: [\"key:x\"], multiply: 0 }}\n",
        two
    );
    let err = Rules::parse(&zero).unwrap_err();
    assert!(
        err.to_string()
            .contains("rule a, override 1: multiply must be at least 1"),
        "{err}"
    );
    let both = format!("{}    overrides:\n      - {{ keys: [\"key:x\"] }}\n", two);
    assert!(
        Rules::parse(&both)
            .unwrap_err()
            .to_string()
            .contains("either multiply or quotas")
    );
}

const ONE: &str = "{ name: q, algorithm: gcra, limit: 5, period: 1s }";

#[test]
fn settings_that_disable_or_dodge_a_limit_are_refused_with_their_place() {
    let rule =
        |extra: &str| format!("rules:\n  - name: a\n    key: global\n{extra}    quotas: [{ONE}]\n");
    error_at(
        &rule("    cost: 6\n"),
        4,
        11,
        "cost 6 is more than quota \"q\" can ever admit (5)",
    );
    error_at(&rule("    cost: 0\n"), 4, 11, "cost must be at least 1");
    assert!(
        Rules::parse(&rule("    cost: 5\n")).is_ok(),
        "a cost the quota admits"
    );
    error_at(
        &rule(
            "    cost: 3\n    overrides:\n      - keys: [x]\n        quotas: [{ algorithm: gcra, limit: 2, period: 1s }]\n",
        ),
        4,
        11,
        "(override 1) can ever admit (2)",
    );
    error_at(
        &rule("    match: { prefix: api/ }\n"),
        4,
        22,
        "must start with /",
    );
    error_at(
        &rule("    match: { prefix: /api//v1 }\n"),
        4,
        22,
        "write \"/api/v1\"",
    );
    error_at(
        &rule("    match: { path: \"/a/../{id}\" }\n"),
        4,
        20,
        "write \"/{id}\"",
    );
    error_at(
        &format!(
            "{HEAD}      - {{ algorithm: gcra, limit: 5, period: 1s, mode: soft, soft_percent: 1001 }}\n"
        ),
        5,
        9,
        "write at most 1000",
    );
    error_at(
        "client_ip:\n  hops: 1000\nrules: []\n",
        2,
        9,
        "write 1 to 64",
    );
    error_at("client_ip:\n  hops: 0\nrules: []\n", 2, 9, "write 1 to 64");
    error_at(
        "client_ip:\n  ipv6_prefix: 0\nrules: []\n",
        2,
        16,
        "write 1 to 128",
    );
    error_at(
        "backend:\n  memory:\n    max_keys: 0\nrules: []\n",
        3,
        15,
        "at least 1",
    );
}

#[test]
fn mistakes_found_after_parsing_still_say_where_they_are() {
    let two = format!("rules:\n  - name: a\n    key: global\n    quotas: [{ONE}]\n");
    let twice = format!("{two}{}", &two["rules:\n".len()..]);
    error_at(&twice, 5, 11, "two rules are named \"a\"");
    error_at(
        "client_ip:\n  trusted_proxies: [10.0.0.0/8]\n  hops: 1\nrules: []\n",
        3,
        9,
        "give trusted_proxies or hops, not both",
    );
    error_at(
        &format!("{two}    overrides:\n      - {{ keys: [x], multiply: 0 }}\n"),
        6,
        9,
        "rule a, override 1: multiply must be at least 1",
    );
    error_at(
        &format!(
            "{two}    overrides:\n      - {{ keys: [x] }}\n      - {{ keys: [y], multiply: 2, quotas: [{ONE}] }}\n"
        ),
        6,
        9,
        "rule a, override 1: give either multiply or quotas",
    );
    // Without the redis feature, the error says the feature is missing; with
    // it, that the URL is not one. Either way it points at the URL.
    error_at(
        "backend:\n  redis:\n    url: \"not a url\"\nrules: []\n",
        3,
        10,
        "backend: redis",
    );
}

#[test]
fn quota_names_clients_could_not_be_sent_are_refused_where_written() {
    for name in ["\"tab\\there\"", "\"caf\u{e9}\"", "\"\"", &"x".repeat(65)] {
        error_at(
            &format!("{HEAD}      - {{ name: {name}, algorithm: gcra, limit: 5, period: 1s }}\n"),
            5,
            9,
            "must be 1 to 64 printable ASCII characters",
        );
    }
    assert!(
        Rules::parse(&format!("{HEAD}      - {{ name: \"per minute (\\\"burst\\\")\", algorithm: gcra, limit: 5, period: 1s }}\n")).is_ok(),
        "spaces, quotes and backslashes are escaped in headers, so they are fine"
    );
}

fn app(rules: Rules) -> Router {
    Router::new()
        .fallback(any(|| async { "ok" }))
        .layer(RateLimitLayer::from_policy(rules))
}

fn req(method: &str, path: &str, ip: [u8; 4], headers: &[(&str, &str)]) -> Request<Body> {
    let mut r = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let mut r = r.body(Body::empty()).unwrap();
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((ip, 5000))));
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

#[test]
fn concurrency_priority_and_shedding_settings_are_checked_where_written() {
    let rule =
        |extra: &str| format!("rules:\n  - name: a\n    key: global\n    quotas: [{ONE}]\n{extra}");
    let shed = "shedding: { max_in_flight: 8, target_latency: 250ms }\n";
    assert!(
        Rules::parse(&rule(
            "    concurrency: { limit: 4 }\n    priority: critical\n"
        ))
        .is_ok()
    );
    assert!(
        Rules::parse(&format!(
            "{shed}{}",
            rule("    concurrency: { limit: 4, elastic: 8 }\n")
        ))
        .is_ok()
    );
    error_at(
        &rule("    concurrency: { limit: 0 }\n"),
        5,
        27,
        "rule a: concurrency limit must be at least 1",
    );
    error_at(
        &format!(
            "{shed}{}",
            rule("    concurrency: { limit: 4, elastic: 3 }\n")
        ),
        6,
        39,
        "rule a: elastic is 3, below the concurrency limit 4",
    );
    error_at(
        &rule("    concurrency: { limit: 4, elastic: 8 }\n"),
        5,
        39,
        "elastic needs a top-level shedding section",
    );
    error(
        &rule("    concurrency: { limit: 4, ceiling: 8 }\n"),
        5,
        "ceiling",
    );
    error(
        &rule("    priority: urgent\n"),
        5,
        "valid values are background, normal, critical",
    );
    error_at(
        &format!(
            "shedding: {{ max_in_flight: 0, target_latency: 250ms }}\n{}",
            rule("")
        ),
        1,
        28,
        "shedding: max_in_flight must be at least 1",
    );
    error_at(
        &format!(
            "shedding: {{ max_in_flight: 8, target_latency: 0s }}\n{}",
            rule("")
        ),
        1,
        47,
        "the period \"0s\" is zero",
    );
    error_at(
        &format!(
            "shedding:\n  max_in_flight: 8\n  target_latency: 250ms\n  reserved: 0.7\n{}",
            rule("")
        ),
        4,
        13,
        "shedding: the reserved share must be between 0 and 0.5, not 0.7",
    );
    error(
        &format!("shedding: {{ max_in_flight: 8 }}\n{}", rule("")),
        1,
        "target_latency",
    );
}

#[test]
fn elastic_rate_quotas_are_checked_where_written() {
    let shed = "shedding: { max_in_flight: 8, target_latency: 250ms }\n";
    let quota =
        |q: &str| format!("{HEAD}      - {{ algorithm: gcra, limit: 5, period: 1s, {q} }}\n");
    let elastic = quota("mode: elastic, elastic_percent: 100");
    let rules = Rules::parse(&format!("{shed}{elastic}")).unwrap();
    assert!(rules.describe().contains("elastic (+100% with room)"));
    error_at(
        &elastic,
        5,
        56,
        "rule a: quota \"5-per-1s\" is elastic, which needs a top-level shedding section",
    );
    error(
        &format!("{shed}{}", quota("mode: elastic")),
        6,
        "mode elastic needs elastic_percent",
    );
    error(
        &format!("{shed}{}", quota("elastic_percent: 50")),
        6,
        "elastic_percent goes with mode: elastic",
    );
    error(
        &format!("{shed}{}", quota("mode: elastic, elastic_percent: 1001")),
        6,
        "write at most 1000",
    );
    // Overrides with their own quotas are checked too.
    let own = format!(
        "{HEAD}      - {ONE}\n    overrides:\n      - keys: [gold]\n        quotas: [{{ algorithm: gcra, limit: 9, period: 1s, mode: elastic, elastic_percent: 10 }}]\n"
    );
    error(
        &own,
        8,
        "is elastic, which needs a top-level shedding section",
    );
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

#[test]
fn a_rule_may_have_only_a_concurrency_limit() {
    let only = "rules:\n  - name: a\n    key: global\n    concurrency: { limit: 2 }\n";
    let rules = Rules::parse(only).unwrap();
    assert!(rules.describe().contains("at most 2 at once per key"));
    error_at(
        "rules:\n  - name: a\n    key: global\n",
        2,
        11,
        "rule a limits nothing: give it quotas, a concurrency limit, or both",
    );
    error(
        &format!("{only}    overrides:\n      - {{ keys: [gold], multiply: 2 }}\n"),
        6,
        "overrides change rate quotas, and this rule has none",
    );
    error(
        &format!("{only}    count_status: [200]\n"),
        2,
        "count_status counts responses against rate quotas, and this rule has none",
    );
    error(
        "rules:\n  - name: a\n    key: global\n    quotas: [{ algorithm: concurrency, limit: 2 }]\n",
        4,
        "write `concurrency: { limit: N }` on the rule",
    );
    error(
        "rules:\n  - name: a\n    key: global\n    quotas: []\n",
        4,
        "a rule needs at least one quota",
    );
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
