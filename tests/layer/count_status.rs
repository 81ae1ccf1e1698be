//! Response-aware limits through a real axum server: 5 failed logins per
//! window, successes free, on memory and on a real redis-server.

use crate::support;

#[cfg(feature = "redis")]
use crate::support::redis as redis_support;

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
/// the calls that reach it; it answers after `delay` (a password hash's
/// work), or never (a handler that hangs) with the header `x-hang`, and
/// panics with `x-panic`.
fn app<B: Backend>(limiter: Limiter<B>, calls: Arc<AtomicU32>, delay: Duration) -> Router {
    let layer = RateLimitLayer::builder(limiter, HeaderKey::new(HeaderName::from_static("x-user")))
        .count_status("401, 403".parse::<CountStatus>().unwrap())
        .timeout(Duration::from_secs(2))
        .build();
    let login = move |headers: HeaderMap| {
        let calls = Arc::clone(&calls);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            if headers.contains_key("x-hang") {
                std::future::pending::<()>().await;
            }
            assert!(!headers.contains_key("x-panic"), "the handler panics");
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
    login_with(c, addr, user, password, None).await
}

async fn login_with(
    c: &support::HttpClient,
    addr: std::net::SocketAddr,
    user: &str,
    password: &str,
    extra: Option<&str>,
) -> support::Reply {
    let mut req = http::Request::post(format!("http://{addr}/login"))
        .header("x-user", user)
        .header("x-password", password);
    if let Some(name) = extra {
        req = req.header(name, "1");
    }
    let req = req.body(http_body_util::Empty::new()).unwrap();
    support::reply(c.request(req).await.unwrap()).await
}

async fn five_failures_per_window<B: Backend>(limiter: Limiter<B>) {
    let calls = Arc::new(AtomicU32::new(0));
    let addr = serve(app(limiter, Arc::clone(&calls), Duration::ZERO)).await;
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

/// 50 concurrent failed logins of one client, each taking 200 ms to fail:
/// every request reserves before it is served, so those in flight hold the
/// limit and at most 5 reach the password check; the rest are refused.
/// Then successes, even concurrent ones of another client, are given back:
/// a client whose logins all succeed is never limited.
async fn a_burst_of_failures_reaches_the_service_at_most_five_times<B: Backend>(
    limiter: Limiter<B>,
) {
    let calls = Arc::new(AtomicU32::new(0));
    let addr = serve(app(limiter, Arc::clone(&calls), Duration::from_millis(200))).await;
    let c = client();
    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let c = c.clone();
        burst.spawn(async move { login_as(&c, addr, "mallory", "wrong").await.status });
    }
    let (mut failed, mut refused) = (0, 0);
    while let Some(status) = burst.join_next().await {
        match status.unwrap() {
            StatusCode::UNAUTHORIZED => failed += 1,
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert!(failed <= 5, "{failed} failures reached the service");
    assert_eq!(failed + refused, 50);
    assert_eq!(calls.load(Ordering::SeqCst), failed);
    // The failures that reached it are kept: mallory stays refused.
    let after = login_as(&c, addr, "mallory", "right").await;
    assert_eq!(after.status, StatusCode::TOO_MANY_REQUESTS);
    // Successes go back, one after another or five at a time.
    for _ in 0..4 {
        let mut wave = tokio::task::JoinSet::new();
        for _ in 0..5 {
            let c = c.clone();
            wave.spawn(async move { login_as(&c, addr, "alice", "right").await });
        }
        while let Some(ok) = wave.join_next().await {
            assert_eq!(ok.unwrap().status, StatusCode::OK);
        }
    }
    let ok = login_as(&c, addr, "alice", "right").await;
    assert_eq!(ok.status, StatusCode::OK);
    assert_eq!(ok.list("ratelimit")[0].int("r"), 5, "nothing kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_failures_reaches_the_service_at_most_five_times_in_memory() {
    let limiter = Limiter::new(MemoryBackend::new(), quota());
    a_burst_of_failures_reaches_the_service_at_most_five_times(limiter).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_failures_reaches_the_service_at_most_five_times_in_redis() {
    let server = redis_support::RedisServer::start();
    let backend = tollgate::RedisBackend::from_url(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    // Named: Redis refuses a set without a name.
    let logins = tollgate::QuotaSet::new("logins", [quota()]).unwrap();
    let limiter = Limiter::new(backend, logins);
    a_burst_of_failures_reaches_the_service_at_most_five_times(limiter).await;
}

/// A response that never comes counts: the client gave up on a handler
/// that hangs, or the handler panicked. Their reservations are kept.
#[tokio::test]
async fn a_reservation_whose_response_never_comes_is_kept() {
    let limiter = Limiter::new(MemoryBackend::new(), quota());
    let calls = Arc::new(AtomicU32::new(0));
    let addr = serve(app(limiter.clone(), Arc::clone(&calls), Duration::ZERO)).await;
    let c = client();
    let gone = login_with(&c, addr, "eve", "right", Some("x-hang"));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), gone)
            .await
            .is_err()
    );
    let panicked = c
        .request(
            http::Request::post(format!("http://{addr}/login"))
                .header("x-user", "eve")
                .header("x-password", "right")
                .header("x-panic", "1")
                .body(http_body_util::Empty::new())
                .unwrap(),
        )
        .await;
    assert!(panicked.is_err(), "the connection dies with the handler");
    // Both reached the handler, and neither gave its unit back.
    for _ in 0..50 {
        if calls.load(Ordering::SeqCst) == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(limiter.peek("key:eve", 0).await.unwrap().remaining(), 3);
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

/// With `matching: all`, a request a later rule refuses was never served:
/// what a `count_status` rule reserved for it goes back.
#[cfg(feature = "rules")]
#[tokio::test]
async fn a_reservation_goes_back_when_a_later_rule_refuses() {
    let rules = tollgate::rules::Rules::parse(
        r#"
matching: all
rules:
  - name: failed-logins
    match: { path: /login }
    key: header:x-user
    count_status: [401]
    quotas:
      - { algorithm: fixed_window, limit: 5, period: 15m }
  - name: per-device
    match: { path: /login }
    key: header:x-device
    quotas:
      - { algorithm: fixed_window, limit: 1, period: 15m }
"#,
    )
    .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let login = move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { StatusCode::UNAUTHORIZED }
    };
    let app = Router::new()
        .route("/login", post(login))
        .layer(RateLimitLayer::from_policy(rules));
    let addr = serve(app).await;
    let c = client();
    let attempt = |device: &'static str| {
        let c = c.clone();
        async move {
            let req = http::Request::post(format!("http://{addr}/login"))
                .header("x-user", "alice")
                .header("x-device", device)
                .body(http_body_util::Empty::new())
                .unwrap();
            support::reply(c.request(req).await.unwrap()).await.status
        }
    };
    assert_eq!(attempt("d0").await, StatusCode::UNAUTHORIZED);
    // The device's limit refuses these: alice's reservations go back.
    for _ in 0..10 {
        assert_eq!(attempt("d0").await, StatusCode::TOO_MANY_REQUESTS);
    }
    // So she has 4 failures left, each from a fresh device.
    for device in ["d1", "d2", "d3", "d4"] {
        assert_eq!(attempt(device).await, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(attempt("d5").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 5);
}
