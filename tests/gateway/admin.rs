//! The admin API through real gateways: tokens, reset, inspect, overrides,
//! blocks, the penalty box and top offenders, in memory and with two
//! gateways on one real Redis; and the OpenAPI file walked against a
//! running gateway.
#![cfg(all(feature = "gateway", feature = "redis"))]

use crate::support;
use crate::support::redis::RedisServer;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_reset_inspect_overrides_blocks_and_the_penalty_box_work_through_the_gateway() {
    let rules = RulesFile::new("admin-memory", RULES);
    let a = start(&rules, "memory", &["--log-raw-keys"]);
    let t = Some(TOKEN);
    for _ in 0..3 {
        assert_eq!(request(&a.gw, "/x", "k1").await.status, StatusCode::OK);
    }
    assert_eq!(
        request(&a.gw, "/x", "k1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Inspect: nothing left, spending nothing.
    let seen = call(Method::GET, &a.url("/v1/rules/api/keys/k1"), t, None)
        .await
        .json();
    assert_eq!(seen["key"], "key:k1");
    assert_eq!(seen["quotas"][0]["name"], "hourly");
    assert_eq!(seen["quotas"][0]["remaining"], 0);
    assert!(seen["quotas"][0]["retry_after_ms"].as_u64().unwrap() > 0);
    // Reset: a full quota again.
    let r = call(Method::DELETE, &a.url("/v1/rules/api/keys/k1"), t, None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let seen = call(Method::GET, &a.url("/v1/rules/api/keys/key%3Ak1"), t, None)
        .await
        .json();
    assert_eq!(seen["quotas"][0]["remaining"], 3);
    assert_eq!(request(&a.gw, "/x", "k1").await.status, StatusCode::OK);

    // An override: k2 gets one request an hour; deleting it restores the rule's.
    let body = r#"{"quotas": [{"algorithm": "fixed_window", "limit": 1, "period": "1h"}], "expires_in": "1d"}"#;
    let o = call(
        Method::PUT,
        &a.url("/v1/rules/api/overrides/k2"),
        t,
        Some(body),
    )
    .await;
    assert_eq!(o.status, StatusCode::OK, "{}", o.body);
    assert_eq!(o.json()["quotas"][0]["limit"], 1);
    assert!(o.json()["expires_at_ms"].as_u64().is_some());
    assert_eq!(request(&a.gw, "/x", "k2").await.status, StatusCode::OK);
    assert_eq!(
        request(&a.gw, "/x", "k2").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let list = call(Method::GET, &a.url("/v1/rules/api/overrides"), t, None)
        .await
        .json();
    assert_eq!(list["overrides"][0]["key"], "key:k2");
    let d = call(
        Method::DELETE,
        &a.url("/v1/rules/api/overrides/k2"),
        t,
        None,
    )
    .await;
    assert_eq!(d.status, StatusCode::NO_CONTENT);
    assert_eq!(request(&a.gw, "/x", "k2").await.status, StatusCode::OK);
    let gone = call(Method::GET, &a.url("/v1/rules/api/overrides/k2"), t, None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.headers["content-type"], "application/problem+json");
    // A bad override is refused with the parser's reason.
    let bad = r#"{"quotas": [{"algorithm": "fixed_window", "limit": 1, "period": "soon"}]}"#;
    let b = call(
        Method::PUT,
        &a.url("/v1/rules/api/overrides/k2"),
        t,
        Some(bad),
    )
    .await;
    assert_eq!(b.status, StatusCode::BAD_REQUEST, "{}", b.body);
    assert!(b.body.contains("soon"), "{}", b.body);

    // A block: 429 with its Retry-After; lifting it restores service.
    let blk = call(
        Method::PUT,
        &a.url("/v1/rules/api/blocks/k3"),
        t,
        Some(r#"{"for": "15m"}"#),
    )
    .await;
    assert_eq!(blk.status, StatusCode::OK, "{}", blk.body);
    let refused = request(&a.gw, "/x", "k3").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((890..=900).contains(&retry), "{retry}");
    let lift = call(Method::DELETE, &a.url("/v1/rules/api/blocks/k3"), t, None).await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT);
    assert_eq!(request(&a.gw, "/x", "k3").await.status, StatusCode::OK);

    // The penalty box: 1 an hour, 2 refusals within a minute block for two
    // hours.
    assert_eq!(request(&a.gw, "/login", "p1").await.status, StatusCode::OK);
    assert_eq!(
        request(&a.gw, "/login", "p1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        request(&a.gw, "/login", "p1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let boxed = request(&a.gw, "/login", "p1").await;
    assert_eq!(boxed.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = boxed.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry > 3_600,
        "the block's Retry-After, not the window's: {retry}"
    );
    let seen = call(Method::GET, &a.url("/v1/rules/login/keys/p1"), t, None)
        .await
        .json();
    assert_eq!(seen["blocked"]["penalty"], true, "{seen}");
    let lift = call(Method::DELETE, &a.url("/v1/rules/login/blocks/p1"), t, None).await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT);
    // Lifted, the key meets its quota again (spent, so the window's wait);
    // reset, it is served.
    let after = request(&a.gw, "/login", "p1").await;
    assert_eq!(after.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = after.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry <= 3_600, "{retry}");
    let r = call(Method::DELETE, &a.url("/v1/rules/login/keys/p1"), t, None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(request(&a.gw, "/login", "p1").await.status, StatusCode::OK);

    // Top offenders, raw keys as asked (--log-raw-keys).
    for _ in 0..20 {
        request(&a.gw, "/x", "heavy").await;
    }
    let top = call(Method::GET, &a.url("/v1/rules/api/top?n=1"), t, None)
        .await
        .json();
    assert_eq!(top["keys_shown"], "raw");
    assert_eq!(top["refused"]["keys"][0]["key"], "key:heavy", "{top}");
    assert_eq!(top["refused"]["keys"].as_array().unwrap().len(), 1);
    let bad_n = call(Method::GET, &a.url("/v1/rules/api/top?n=0"), t, None).await;
    assert_eq!(bad_n.status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_offenders_show_hashed_keys_unless_raw_keys_are_asked_for() {
    let rules = RulesFile::new("admin-top", RULES);
    let a = start(&rules, "top", &["--metrics-listen", "127.0.0.1:0"]);
    for _ in 0..6 {
        request(&a.gw, "/x", "sk_live_heavy").await;
    }
    let top = call(Method::GET, &a.url("/v1/rules/api/top"), Some(TOKEN), None).await;
    assert_eq!(top.status, StatusCode::OK);
    let json = top.json();
    assert_eq!(json["keys_shown"], "hashed");
    assert_eq!(json["refused"]["keys"][0]["count"], 3, "{json}");
    assert_eq!(json["admitted"]["keys"][0]["count"], 3, "{json}");
    assert!(!top.body.contains("sk_live_heavy"), "{}", top.body);
    // The gauge of the heaviest keys' counts, set by the call, labels
    // bounded (rule, kind, rank; never a key).
    let scraped = call(
        Method::GET,
        &format!("http://{}/metrics", a.gw.metrics_addr()),
        None,
        None,
    )
    .await;
    let line = (scraped.body.lines())
        .find(|l| {
            l.starts_with("tollgate_top_key_decisions{")
                && l.contains("rule=\"api\"")
                && l.contains("of=\"refused\"")
                && l.contains("rank=\"1\"")
        })
        .unwrap_or_else(|| panic!("no gauge in {}", scraped.body));
    assert!(line.ends_with(" 3"), "{line}");
    assert!(!scraped.body.contains("sk_live_heavy"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_two_gateways_agree_on_overrides_resets_and_blocks_within_the_bound() {
    let redis = RedisServer::start();
    let url = redis.url();
    let rules = RulesFile::new("admin-redis", RULES);
    let a = start(&rules, "ra", &["--redis", &url]);
    let b = start(&rules, "rb", &["--redis", &url]);
    // Borrowed, so the polling closures' futures can hold them.
    let (a, b) = (&a, &b);
    let t = Some(TOKEN);

    // Reset returns a spent key to a full quota on both.
    for _ in 0..3 {
        assert_eq!(request(&a.gw, "/x", "r1").await.status, StatusCode::OK);
    }
    assert_eq!(
        request(&a.gw, "/x", "r1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        request(&b.gw, "/x", "r1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let r = call(Method::DELETE, &a.url("/v1/rules/api/keys/r1"), t, None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    // Both serve it again: B once its denial cache has heard of the reset.
    within(FLEET_BOUND, || async move {
        request(&b.gw, "/x", "r1").await.status == StatusCode::OK
    })
    .await;
    assert_eq!(request(&a.gw, "/x", "r1").await.status, StatusCode::OK);

    // An override set on A is applied by B within the bound.
    let body = r#"{"quotas": [{"algorithm": "fixed_window", "limit": 1, "period": "1h"}]}"#;
    let o = call(
        Method::PUT,
        &a.url("/v1/rules/api/overrides/r2"),
        t,
        Some(body),
    )
    .await;
    assert_eq!(o.status, StatusCode::OK, "{}", o.body);
    let took = within(FLEET_BOUND, || async move {
        let seen = call(Method::GET, &b.url("/v1/rules/api/keys/r2"), t, None)
            .await
            .json();
        seen["overridden"] == true
    })
    .await;
    assert!(took < FLEET_BOUND);
    assert_eq!(request(&b.gw, "/x", "r2").await.status, StatusCode::OK);
    assert_eq!(
        request(&b.gw, "/x", "r2").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Its counters are the fleet's: A refuses too.
    assert_eq!(
        request(&a.gw, "/x", "r2").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let listed = call(Method::GET, &b.url("/v1/rules/api/overrides/r2"), t, None).await;
    assert_eq!(listed.status, StatusCode::OK);

    // A block set on A answers 429 on both; lifting it restores service.
    // (B is watched through its admin API: requests would spend the key's
    // quota until the block arrives.)
    let blk = call(
        Method::PUT,
        &a.url("/v1/rules/api/blocks/r3"),
        t,
        Some(r#"{"for": "10m"}"#),
    )
    .await;
    assert_eq!(blk.status, StatusCode::OK, "{}", blk.body);
    assert_eq!(
        request(&a.gw, "/x", "r3").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    within(FLEET_BOUND, || async move {
        !blocked(b, "api", "r3").await.is_null()
    })
    .await;
    let refused = request(&b.gw, "/x", "r3").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (590..=600).contains(&retry),
        "the block's Retry-After: {retry}"
    );
    let lift = call(Method::DELETE, &b.url("/v1/rules/api/blocks/r3"), t, None).await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT, "{}", lift.body);
    assert_eq!(request(&b.gw, "/x", "r3").await.status, StatusCode::OK);
    within(FLEET_BOUND, || async move {
        blocked(a, "api", "r3").await.is_null()
    })
    .await;
    assert_eq!(request(&a.gw, "/x", "r3").await.status, StatusCode::OK);

    // A penalty block made on A holds on B.
    assert_eq!(request(&a.gw, "/login", "p9").await.status, StatusCode::OK);
    assert_eq!(
        request(&a.gw, "/login", "p9").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        request(&a.gw, "/login", "p9").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    within(FLEET_BOUND, || async move {
        blocked(b, "login", "p9").await["penalty"] == true
    })
    .await;
    let boxed = request(&b.gw, "/login", "p9").await;
    assert_eq!(boxed.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = boxed.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 3_600, "the block's Retry-After: {retry}");
}

/// The block `admin`'s gateway holds on `key` of `rule` (null if none).
async fn blocked(admin: &Admin, rule: &str, key: &str) -> Value {
    let url = admin.url(&format!("/v1/rules/{rule}/keys/{key}"));
    call(Method::GET, &url, Some(TOKEN), None).await.json()["blocked"].clone()
}

/// Every path and method of the OpenAPI file, called on a running gateway:
/// the status is one the file lists, with the content type it names, and a
/// JSON body has the fields its schema requires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_file_matches_what_the_server_answers() {
    let rules = RulesFile::new("admin-openapi", RULES);
    let a = start(&rules, "openapi", &[]);
    let spec: Value = serde_saphyr::from_str(tollgate::admin::OPENAPI).unwrap();
    let served = call(Method::GET, &a.url("/v1/openapi.yaml"), Some(TOKEN), None).await;
    assert_eq!(served.body, tollgate::admin::OPENAPI);
    // An order that leaves something to read or delete: PUT before GET
    // before DELETE.
    let order = ["put", "get", "delete"];
    let mut walked = 0;
    for (path, item) in spec["paths"].as_object().unwrap() {
        for method in order {
            let Some(op) = item.get(method) else { continue };
            let url = a.url(&path.replace("{rule}", "api").replace("{key}", "walker%2F1"));
            let body = op["requestBody"]["content"]["application/json"]["example"].clone();
            let body = (!body.is_null()).then(|| body.to_string());
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let answer = call(m, &url, Some(TOKEN), body.as_deref()).await;
            check(&spec, op, &answer, &format!("{method} {path}"));
            walked += 1;
        }
        // A rule that does not exist: a documented 404 where one is listed.
        for method in order {
            let Some(op) = item.get(method) else { continue };
            if op["responses"].get("404").is_none() {
                continue;
            }
            let url = a.url(&path.replace("{rule}", "nope").replace("{key}", "x"));
            let body = op["requestBody"]["content"]["application/json"]["example"].clone();
            let body = (!body.is_null()).then(|| body.to_string());
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let answer = call(m, &url, Some(TOKEN), body.as_deref()).await;
            assert_eq!(
                answer.status,
                StatusCode::NOT_FOUND,
                "{method} {path}: {}",
                answer.body
            );
            check(&spec, op, &answer, &format!("{method} {path} (no rule)"));
        }
    }
    assert_eq!(walked, 11, "every operation walked");
}

/// `answer` is one of `op`'s documented responses.
fn check(spec: &Value, op: &Value, answer: &Answer, what: &str) {
    let code = answer.status.as_u16().to_string();
    let mut documented = op["responses"]
        .get(&code)
        .unwrap_or_else(|| panic!("{what}: {code} is not documented: {}", answer.body))
        .clone();
    if let Some(r) = documented.get("$ref").and_then(Value::as_str) {
        documented = resolve(spec, r);
    }
    let Some(content) = documented.get("content").and_then(Value::as_object) else {
        assert!(
            answer.body.is_empty(),
            "{what}: no body documented: {}",
            answer.body
        );
        return;
    };
    let ct = answer.headers["content-type"].to_str().unwrap();
    let (media, entry) = content.iter().next().unwrap();
    assert_eq!(ct, media, "{what}");
    if !media.ends_with("json") {
        return;
    }
    let body: Value = serde_json::from_str(&answer.body).unwrap();
    let mut schema = entry["schema"].clone();
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        schema = resolve(spec, r);
    }
    for field in schema["required"].as_array().into_iter().flatten() {
        let field = field.as_str().unwrap();
        assert!(body.get(field).is_some(), "{what}: no {field:?} in {body}");
    }
}

fn resolve(spec: &Value, reference: &str) -> Value {
    let mut at = spec;
    for part in reference.trim_start_matches("#/").split('/') {
        at = &at[part];
    }
    at.clone()
}
