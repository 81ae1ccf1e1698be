//! The admin API through real gateways: tokens, reset, inspect, overrides,
//! blocks, the penalty box and top offenders, in memory and with two
//! gateways on one real Redis; and the OpenAPI file walked against a
//! running gateway.
#![cfg(all(feature = "gateway", feature = "redis"))]

// By idea: the in-memory operations, the fleet on Redis, the OpenAPI walk;
// the harness and the tokens' tests here.
mod fleet;
mod memory;
mod openapi;

use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use support::gateway::{Gateway, RulesFile};
use support::process::{TempDir, listen_address};

/// The bound the docs state for a change to reach every gateway on Redis.
const FLEET_BOUND: Duration = Duration::from_secs(1);

const TOKEN: &str = "s3cret-token-0123456789";

const RULES: &str = r#"
rules:
  - name: login
    match: { path: /login }
    key: header:x-api-key
    quotas: [{ name: once, algorithm: fixed_window, limit: 1, period: 1h }]
    penalty: { refusals: 2, within: 1m, block: 2h }
  - name: api
    key: header:x-api-key
    quotas: [{ name: hourly, algorithm: sliding_log, limit: 3, period: 1h }]
"#;

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

async fn call(method: Method, url: &str, token: Option<&str>, body: Option<&str>) -> Answer {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::builder().method(method).uri(url);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default().to_owned())))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("answered in time")
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A request through the limited port with `key`.
async fn request(gw: &Gateway, path: &str, key: &str) -> Answer {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::get(format!("http://{}{path}", gw.addr))
        .header("x-api-key", key)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A gateway with the admin API on a port the kernel picks, where, and
/// the gateway's log.
struct Admin {
    gw: Gateway,
    admin: SocketAddr,
    log: std::path::PathBuf,
    _dir: TempDir,
}

impl Admin {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }
}

fn token_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tokens");
    std::fs::write(&path, format!("# admins\nops-alice:{TOKEN}\n")).unwrap();
    path
}

fn start(rules: &RulesFile, name: &str, extra: &[&str]) -> Admin {
    let dir = TempDir::new(&format!("admin-{name}"));
    let tokens = token_file(&dir.0);
    let log_path = dir.0.join("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut args = vec![
        "--admin-listen",
        "127.0.0.1:0",
        "--admin-token-file",
        tokens.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let gw = Gateway::start_logging_to(&rules.0, None, &args, Some(log));
    // The admin listener is bound and logged before the serving line.
    let admin = admin_addr(&log_path);
    Admin {
        gw,
        admin,
        log: log_path,
        _dir: dir,
    }
}

fn admin_addr(log: &Path) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(addr) = (text.lines()).find_map(|l| listen_address(l, "admin API at /v1")) {
            return addr;
        }
        assert!(
            Instant::now() < deadline,
            "no admin line in the log: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_log(admin: &Admin) -> String {
    std::fs::read_to_string(&admin.log).unwrap_or_default()
}

/// Polls `f` until it holds or `bound` passes; returns how long it took.
async fn within<F, Fut>(bound: Duration, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if f().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < bound, "not applied within {bound:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_token_or_with_a_wrong_one_are_refused_and_changes_are_logged_by_name() {
    let rules = RulesFile::new("admin-auth", RULES);
    let a = start(&rules, "auth", &[]);
    let none = call(Method::GET, &a.url("/v1/rules"), None, None).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED, "{}", none.body);
    assert_eq!(none.headers["www-authenticate"], "Bearer");
    assert_eq!(none.headers["content-type"], "application/problem+json");
    let wrong = call(
        Method::GET,
        &a.url("/v1/rules"),
        Some("s3cret-token-0123456788"),
        None,
    )
    .await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN, "{}", wrong.body);
    let ok = call(Method::GET, &a.url("/v1/rules"), Some(TOKEN), None).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.body);
    let json = ok.json();
    let names: Vec<&str> = (json["rules"].as_array().unwrap().iter())
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["login", "api"]);
    assert_eq!(json["rules"][0]["penalty"]["refusals"], 2);
    // A change is logged with the token's name, never the token, and the
    // key as the logs show keys (hashed).
    let reset = call(
        Method::DELETE,
        &a.url("/v1/rules/api/keys/sk_live_XYZ"),
        Some(TOKEN),
        None,
    )
    .await;
    assert_eq!(reset.status, StatusCode::NO_CONTENT, "{}", reset.body);
    let deadline = Instant::now() + Duration::from_secs(5);
    let log = loop {
        let log = read_log(&a);
        if log.contains("admin change") || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let line = log
        .lines()
        .find(|l| l.contains("admin change"))
        .expect("logged");
    assert!(
        line.contains("ops-alice") && line.contains("reset"),
        "{line}"
    );
    assert!(!log.contains(TOKEN), "the token is never logged");
    assert!(!line.contains("sk_live_XYZ"), "the key is hashed: {line}");
}

#[test]
fn a_non_loopback_admin_bind_without_a_token_file_does_not_start() {
    let rules = RulesFile::new("admin-bind", RULES);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config"])
        .arg(&rules.0)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--admin-token-file"), "{err}");
    // A token file that holds no token is a start error too.
    let dir = TempDir::new("admin-empty-tokens");
    let empty = dir.0.join("tokens");
    std::fs::write(&empty, "# nobody\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config"])
        .arg(&rules.0)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "0.0.0.0:0",
            "--admin-token-file",
        ])
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no token"));
}

/// The block `admin`'s gateway holds on `key` of `rule` (null if none).
async fn blocked(admin: &Admin, rule: &str, key: &str) -> Value {
    let url = admin.url(&format!("/v1/rules/{rule}/keys/{key}"));
    call(Method::GET, &url, Some(TOKEN), None).await.json()["blocked"].clone()
}
