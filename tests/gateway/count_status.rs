//! The README's failed sign-ins rule through the real gateway: 5 per 15
//! minutes per client, `count_status: [401, 403]`, in front of an upstream
//! that takes 200 ms to refuse a password. 50 concurrent attempts from one
//! client reach the upstream at most 5 times, in memory and on a real
//! Redis; sign-ins that succeed are given back.
#![cfg(feature = "gateway")]

use crate::support;
#[cfg(feature = "redis")]
use crate::support::redis as redis_support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use support::gateway::{Gateway, RulesFile};

const RULE: &str = r#"
timeout: 3s
on_backend_error: reject
rules:
  - name: failed-signins
    match: { path: /signin, methods: [POST] }
    key: peer_ip
    count_status: [401, 403]
    quotas:
      - { algorithm: fixed_window, limit: 5, period: 15m }
"#;

/// A sign-in upstream on TCP: it counts the attempts that reach it, and
/// after 200 ms answers 401, or 200 to the right password.
async fn signin_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let arrived = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&arrived);
    let signin = move |headers: HeaderMap| {
        let count = Arc::clone(&count);
        async move {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            if headers.get("x-password").is_some_and(|p| p == "right") {
                StatusCode::OK
            } else {
                StatusCode::UNAUTHORIZED
            }
        }
    };
    let app = Router::new().route("/signin", post(signin));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, arrived)
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

async fn sign_in(client: &HttpClient, gw: SocketAddr, password: &str) -> StatusCode {
    let req = Request::post(format!("http://{gw}/signin"))
        .header("x-password", password)
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    resp.into_body().collect().await.unwrap();
    status
}

async fn fifty_concurrent_failures_reach_the_upstream_at_most_five_times(rules: &str) {
    let (upstream, arrived) = signin_upstream().await;
    let file = RulesFile::new("count-status", rules);
    let gw = Gateway::start(&file.0, Some(upstream), &[]);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    // Successes first: given back, however many, one after another.
    for _ in 0..12 {
        assert_eq!(sign_in(&client, gw.addr, "right").await, StatusCode::OK);
    }
    assert_eq!(arrived.load(Ordering::SeqCst), 12);
    arrived.store(0, Ordering::SeqCst);
    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (client, addr) = (client.clone(), gw.addr);
        burst.spawn(async move { sign_in(&client, addr, "wrong").await });
    }
    let mut statuses = Vec::new();
    while let Some(status) = burst.join_next().await {
        statuses.push(status.unwrap());
    }
    let failed = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(failed + refused, 50, "{statuses:?}");
    assert!(arrived.load(Ordering::SeqCst) <= 5, "{statuses:?}");
    assert_eq!(arrived.load(Ordering::SeqCst), failed);
    // The failures that got through are kept: the client stays refused,
    // even with the right password.
    assert_eq!(
        sign_in(&client, gw.addr, "right").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_failures_reach_the_upstream_at_most_five_times_in_memory() {
    fifty_concurrent_failures_reach_the_upstream_at_most_five_times(RULE).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_failures_reach_the_upstream_at_most_five_times_in_redis() {
    let redis = redis_support::RedisServer::start();
    let rules = format!(
        "backend:\n  redis:\n    url: {}\n    timeout: 2s\n{RULE}",
        redis.url()
    );
    fifty_concurrent_failures_reach_the_upstream_at_most_five_times(&rules).await;
}
