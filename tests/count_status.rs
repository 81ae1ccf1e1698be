//! Response-aware limits through a real axum server: 5 failed logins per
//! window, successes free, on memory and on a real redis-server.

mod support;

#[cfg(feature = "redis")]
#[path = "support/redis.rs"]
mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::{HeaderMap, HeaderName, StatusCode};
use support::{client, serve};
use tollgate::key::HeaderKey;
use tollgate::{Backend, CountStatus, Limiter, MemoryBackend, Quota, RateLimitLayer};

/// A login that fails (401) unless the password header is right, counting
/// the calls that reach it.
fn app<B: Backend>(limiter: Limiter<B>, calls: Arc<AtomicU32>) -> Router {
    let layer = RateLimitLayer::builder(limiter, HeaderKey::new(HeaderName::from_static("x-user")))
        .count_status("401, 403".parse::<CountStatus>().unwrap())
        .timeout(Duration::from_secs(2))
        .build();
    let login = move |headers: HeaderMap| {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if headers.get("x-password").is_some_and(|p| p == "right") {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        }
    };
    Router::new().route("/login", post(login)).layer(layer)
}

async fn login_as(
    c: &support::HttpClient,
    addr: std::net::SocketAddr,
    user: &str,
    password: &str,
) -> support::Reply {
    let req = http::Request::post(format!("http://{addr}/login"))
        .header("x-user", user)
        .header("x-password", password)
        .body(http_body_util::Empty::new())
        .unwrap();
    support::reply(c.request(req).await.unwrap()).await
}

async fn five_failures_per_window<B: Backend>(limiter: Limiter<B>) {
    let calls = Arc::new(AtomicU32::new(0));
    let addr = serve(app(limiter, Arc::clone(&calls))).await;
    let c = client();
    // Successes are free, however many.
    for _ in 0..12 {
        let ok = login_as(&c, addr, "alice", "right").await;
        assert_eq!(ok.status, StatusCode::OK);
        assert_eq!(ok.list("ratelimit")[0].int("r"), 5);
    }
    // Each failure is counted once its 401 is known.
    for left in (0..5).rev() {
        let failed = login_as(&c, addr, "alice", "wrong").await;
        assert_eq!(failed.status, StatusCode::UNAUTHORIZED);
        assert_eq!(failed.list("ratelimit")[0].int("r"), left);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 17);
    // The counted limit is reached: refused before the service, even with
    // the right password.
    for password in ["wrong", "right"] {
        let refused = login_as(&c, addr, "alice", password).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.header("retry-after").is_some());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 17);
    // Another user is untouched.
    assert_eq!(
        login_as(&c, addr, "bob", "wrong").await.status,
        StatusCode::UNAUTHORIZED
    );
}

fn quota() -> Quota {
    Quota::fixed_window(5, Duration::from_secs(15 * 60))
        .build()
        .unwrap()
}

#[tokio::test]
async fn five_failed_logins_per_window_in_memory() {
    five_failures_per_window(Limiter::new(MemoryBackend::new(), quota())).await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn five_failed_logins_per_window_in_redis() {
    let server = redis_support::RedisServer::start();
    let backend = tollgate::RedisBackend::from_url(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // Named: Redis refuses a set without a name.
    let logins = tollgate::QuotaSet::new("logins", [quota()]).unwrap();
    five_failures_per_window(Limiter::new(backend, logins)).await;
}

#[cfg(feature = "rules")]
#[tokio::test]
async fn a_rule_counts_only_its_statuses() {
    let rules = tollgate::rules::Rules::parse(
        r#"
rules:
  - name: failed-logins
    match: { path: /login }
    key: header:x-user
    count_status: [401, "403"]
    quotas:
      - { algorithm: fixed_window, limit: 5, period: 15m }
"#,
    )
    .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let login = move |headers: HeaderMap| {
        let calls = Arc::clone(&counted);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            if headers.get("x-password").is_some_and(|p| p == "right") {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        }
    };
    let app = Router::new()
        .route("/login", post(login))
        .layer(RateLimitLayer::from_policy(rules));
    let addr = serve(app).await;
    let c = client();
    for _ in 0..8 {
        assert_eq!(
            login_as(&c, addr, "alice", "right").await.status,
            StatusCode::OK
        );
    }
    for _ in 0..5 {
        let failed = login_as(&c, addr, "alice", "wrong").await;
        assert_eq!(failed.status, StatusCode::UNAUTHORIZED);
    }
    let refused = login_as(&c, addr, "alice", "right").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 13);
    // A bad setting is refused when the file is read.
    let bad = tollgate::rules::Rules::parse(
        "rules:\n  - name: x\n    key: global\n    count_status: [\"6xy\"]\n    quotas:\n      - { algorithm: gcra, limit: 1, period: 1s }\n",
    );
    assert!(bad.is_err());
}
