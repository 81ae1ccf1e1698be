//! Usage-based limits through the layer: the cost known from the
//! response (a header or the trailers) settles the reservation.

#![cfg(feature = "gateway")]

use crate::support;

use tollgate::{Limiter, ManualClock, MemoryBackend, Quota, Timestamp};

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use http::HeaderName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::key::HeaderKey;
use tollgate::layer::{CostFromResponse, RateLimitLayer, Usage};

use super::usage::NOON;

/// 10 000 tokens an hour per API key, on a manual clock; 500 reserved a
/// request unless it says `x-max-tokens`.
type TokenLimiter = Limiter<MemoryBackend<ManualClock>>;
type TokenLayer =
    RateLimitLayer<tollgate::layer::LimitPolicy<MemoryBackend<ManualClock>, HeaderKey>>;

fn token_layer(clock: &ManualClock) -> (TokenLimiter, TokenLayer) {
    let limiter = Limiter::new(
        MemoryBackend::builder().clock(clock.clone()).build(),
        Quota::fixed_window(10_000, Duration::from_secs(3_600))
            .build()
            .unwrap(),
    );
    let from = CostFromResponse::header(HeaderName::from_static("x-usage-total-tokens"), 500)
        .reserve_header(HeaderName::from_static("x-max-tokens"));
    let layer = RateLimitLayer::builder(
        limiter.clone(),
        HeaderKey::new(HeaderName::from_static("x-api-key")),
    )
    .cost_from_response(from)
    .build();
    (limiter, layer)
}

/// What is left for `key`, once it is `expected` (the settle runs in a task
/// of its own after the body ends): polled, at most five seconds.
async fn left_becomes(limiter: &Limiter<MemoryBackend<ManualClock>>, key: &str, expected: u64) {
    let mut left = 0;
    for _ in 0..500 {
        left = limiter.peek(key, 0).await.unwrap().remaining();
        if left == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{key}: {left} left, not {expected}");
}

/// The handler's answer carries the tokens it "used" (from `x-tokens`).
async fn answer_with_usage(headers: http::HeaderMap) -> impl axum::response::IntoResponse {
    let tokens = headers
        .get("x-tokens")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("0")
        .to_owned();
    ([("x-usage-total-tokens", tokens)], "hello")
}

#[tokio::test]
async fn the_layer_settles_with_the_usage_the_response_reports() {
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let (limiter, layer) = token_layer(&clock);
    let reported = |Extension(usage): Extension<Usage>| async move {
        usage.report(42);
        "done"
    };
    let app = Router::new()
        .route("/chat", get(answer_with_usage))
        .route("/reported", get(reported))
        .layer(layer);
    let addr = support::serve(app).await;
    let client = support::client();
    // Used 700 of the 500 reserved: 700 charged.
    let r = support::get(
        &client,
        addr,
        "/chat",
        &[("x-api-key", b"a"), ("x-tokens", b"700")],
    )
    .await;
    assert_eq!(r.status, 200);
    left_becomes(&limiter, "key:a", 9_300).await;
    // Reserved 2 000 (its own estimate), used 150: 1 850 back.
    let r = support::get(
        &client,
        addr,
        "/chat",
        &[
            ("x-api-key", b"a"),
            ("x-tokens", b"150"),
            ("x-max-tokens", b"2000"),
        ],
    )
    .await;
    assert_eq!(r.status, 200);
    left_becomes(&limiter, "key:a", 9_150).await;
    // The handler's own report.
    let r = support::get(&client, addr, "/reported", &[("x-api-key", b"b")]).await;
    assert_eq!(r.status, 200);
    left_becomes(&limiter, "key:b", 10_000 - 42).await;
    // A response that says nothing of its usage keeps the reservation; so
    // does one whose header is not a plain number.
    let r = support::get(
        &client,
        addr,
        "/chat",
        &[("x-api-key", b"c"), ("x-tokens", b"-5")],
    )
    .await;
    assert_eq!(r.status, 200);
    tokio::time::sleep(Duration::from_millis(100)).await;
    left_becomes(&limiter, "key:c", 9_500).await;
}

/// The count in the body's trailers (as an HTTP/2 or gRPC server sends
/// it) settles the reservation.
#[tokio::test]
async fn the_layer_reads_the_usage_in_the_trailers() {
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let (limiter, layer) = token_layer(&clock);
    let stream = || async {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-usage-total-tokens", "1234".parse().unwrap());
        axum::body::Body::new(Frames(
            [
                http_body::Frame::data(bytes::Bytes::from_static(b"hel")),
                http_body::Frame::data(bytes::Bytes::from_static(b"lo")),
                http_body::Frame::trailers(trailers),
            ]
            .into(),
        ))
    };
    let app = Router::new().route("/stream", get(stream)).layer(layer);
    let addr = support::serve(app).await;
    let r = support::get(&support::client(), addr, "/stream", &[("x-api-key", b"t")]).await;
    assert_eq!(r.body, "hello");
    left_becomes(&limiter, "key:t", 10_000 - 1_234).await;
}

/// A body of ready frames, in order.
struct Frames(std::collections::VecDeque<http_body::Frame<bytes::Bytes>>);

impl http_body::Body for Frames {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// 50 requests at once, each reserving 500 of 10 000 tokens and held in
/// the handler until all have been decided: exactly 20 pass, and once they
/// report 400 each, the rest is back.
#[tokio::test]
async fn fifty_concurrent_requests_never_pass_more_than_the_reservations_allow() {
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let (limiter, layer) = token_layer(&clock);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let held = Arc::clone(&gate);
    let handler = move || {
        let held = Arc::clone(&held);
        async move {
            let _ = held.acquire().await.map(|p| p.forget());
            ([("x-usage-total-tokens", "400")], "ok")
        }
    };
    let app = Router::new().route("/chat", get(handler)).layer(layer);
    let addr = support::serve(app).await;
    let client = support::client();
    let mut calls = Vec::new();
    for _ in 0..50 {
        let client = client.clone();
        calls.push(tokio::spawn(async move {
            support::get(&client, addr, "/chat", &[("x-api-key", b"same")])
                .await
                .status
        }));
    }
    // Every request decided: 20 reservations hold all 10 000 tokens.
    left_becomes(&limiter, "key:same", 0).await;
    let mut refused = 0;
    for _ in 0..200 {
        refused = calls.iter().filter(|c| c.is_finished()).count();
        if refused == 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        refused, 30,
        "the 30 beyond the reservations are answered at once"
    );
    gate.add_permits(50);
    let mut passed = 0;
    for call in calls {
        match tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .unwrap()
            .unwrap()
            .as_u16()
        {
            200 => passed += 1,
            429 => {}
            other => panic!("status {other}"),
        }
    }
    assert_eq!(passed, 20);
    left_becomes(&limiter, "key:same", 10_000 - 20 * 400).await;
}

/// A stream the client drops before its end keeps its reservation: its
/// usage is not known, even with a count in its headers.
#[tokio::test]
async fn a_dropped_stream_keeps_its_reservation() {
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let (limiter, layer) = token_layer(&clock);
    struct Endless;
    impl http_body::Body for Endless {
        type Data = bytes::Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            std::task::Poll::Pending
        }
    }
    let stream = || async {
        http::Response::builder()
            .header("x-usage-total-tokens", "10")
            .body(axum::body::Body::new(Endless))
            .unwrap()
    };
    let app = Router::new().route("/stream", get(stream)).layer(layer);
    let addr = support::serve(app).await;
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\nx-api-key: d\r\n\r\n")
        .await
        .unwrap();
    let mut head = vec![0; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut head))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&head[..n]).starts_with("HTTP/1.1 200"));
    drop(socket);
    // The server notices the client gone and drops the body; the 500
    // reserved stand, not the 10 in the headers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    left_becomes(&limiter, "key:d", 9_500).await;
}
