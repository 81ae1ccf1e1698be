//! Protecting the server through a real axum server on a TCP
//! port: concurrency quotas, elastic quotas and load shedding, with handlers
//! that block on a gate so the number of requests under way is known.

use crate::support;
#[cfg(feature = "redis")]
use crate::support::redis as redis_support;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::StatusCode;
use http_body::Frame;
use support::gate::{BOUND, Gate};
use support::{HttpClient, Reply, client, get as fetch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::key::HeaderKey;
use tollgate::layer::RateLimitLayerBuilder;
use tollgate::layer::{ConcurrencyQuota, MeasuredLoad, Priority, Refused, Shedding};
use tollgate::{Limiter, MemoryBackend, Mode, Quota, RateLimitLayer};

/// Elastic quotas and shedding, which follow the measured load.
mod load;
/// Concurrency slots shared through a real Redis.
#[cfg(feature = "redis")]
mod redis;

fn builder() -> RateLimitLayerBuilder<MemoryBackend, HeaderKey> {
    let quota = Quota::gcra(10_000, Duration::from_secs(1)).build().unwrap();
    RateLimitLayer::builder(
        Limiter::new(MemoryBackend::new(), quota),
        HeaderKey::new(http::HeaderName::from_static("x-key")),
    )
}

async fn server(gate: &Gate, layer: RateLimitLayer<impl tollgate::layer::Policy>) -> SocketAddr {
    let g = gate.clone();
    let app = Router::new()
        .route("/", get(|| async { "quick" }))
        .route(
            "/held",
            get(move || {
                let g = g.clone();
                async move { g.wait().await }
            }),
        )
        .route(
            "/{priority}/held",
            get({
                let g = gate.clone();
                move || {
                    let g = g.clone();
                    async move { g.wait().await }
                }
            }),
        )
        .route(
            "/panic",
            get(|| async {
                if true {
                    panic!("handler panic (expected by the test)");
                }
                "unreachable"
            }),
        )
        .route("/stream", get(|| async { Body::new(Drip::default()) }))
        .layer(layer);
    support::serve(app).await
}

/// Starts a request in the background.
fn start(
    c: &HttpClient,
    addr: SocketAddr,
    path: &str,
    key: &str,
) -> tokio::task::JoinHandle<Reply> {
    let (c, path, key) = (c.clone(), path.to_owned(), key.to_owned());
    tokio::spawn(async move { fetch(&c, addr, &path, &[("x-key", key.as_bytes())]).await })
}

async fn send(c: &HttpClient, addr: SocketAddr, path: &str, key: &str) -> Reply {
    fetch(c, addr, path, &[("x-key", key.as_bytes())]).await
}

/// Starts a request that the handler holds, and waits until it is inside.
async fn hold(
    c: &HttpClient,
    addr: SocketAddr,
    gate: &Gate,
    path: &str,
    key: &str,
) -> tokio::task::JoinHandle<Reply> {
    let inside = gate.inside.load(Ordering::SeqCst);
    let task = start(c, addr, path, key);
    gate.until_inside(inside + 1).await;
    task
}

async fn finish(tasks: Vec<tokio::task::JoinHandle<Reply>>) -> Vec<StatusCode> {
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(
            tokio::time::timeout(BOUND, t)
                .await
                .unwrap()
                .unwrap()
                .status,
        );
    }
    statuses
}

/// Waits (bounded) until a request of `key` passes again: its slot is back.
async fn until_ok(c: &HttpClient, addr: SocketAddr, key: &str) {
    let start = Instant::now();
    loop {
        let r = send(c, addr, "/", key).await;
        if r.status == StatusCode::OK {
            return;
        }
        assert!(
            start.elapsed() < BOUND,
            "slot never given back: {}",
            r.status
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_concurrency_refusal(r: &Reply, name: &str) {
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    assert_eq!(r.header("retry-after"), Some("1"));
    let policy = r.list("ratelimit-policy");
    let p = policy
        .iter()
        .find(|m| m.name() == name)
        .expect("the concurrency policy");
    let param = |k: &str| {
        p.params
            .iter()
            .find(|(name, _)| name == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        param("qu"),
        Some(support::Value::String("concurrent-requests".into()))
    );
    assert_eq!(param("w"), None, "no window for a concurrency quota");
    assert_eq!(r.json()["type"], tollgate::layer::QUOTA_EXCEEDED);
    assert_eq!(r.json()["violated-policies"][0], name);
}

#[tokio::test]
async fn exactly_n_requests_per_key_are_under_way_and_slots_free_on_completion() {
    let gate = Gate::default();
    let layer = builder()
        .concurrency(ConcurrencyQuota::new(2).unwrap())
        .build();
    let addr = server(&gate, layer).await;
    let c = client();

    let a1 = hold(&c, addr, &gate, "/held", "a").await;
    let a2 = hold(&c, addr, &gate, "/held", "a").await;
    for _ in 0..3 {
        assert_concurrency_refusal(&send(&c, addr, "/held", "a").await, "concurrent");
    }
    // Another key has its own slots.
    let b1 = hold(&c, addr, &gate, "/held", "b").await;
    assert_eq!(gate.inside.load(Ordering::SeqCst), 3);

    gate.open(3);
    assert_eq!(finish(vec![a1, a2, b1]).await, [StatusCode::OK; 3]);
    // Both of a's slots are back: two more pass, showing one left, then none.
    let r = send(&c, addr, "/", "a").await;
    assert_eq!(r.status, StatusCode::OK);
    let state = r.list("ratelimit");
    let s = state.iter().find(|m| m.name() == "concurrent").unwrap();
    assert_eq!(s.int("r"), 1, "one slot taken by this request, one free");
    let a3 = hold(&c, addr, &gate, "/held", "a").await;
    let a4 = hold(&c, addr, &gate, "/held", "a").await;
    assert_concurrency_refusal(&send(&c, addr, "/", "a").await, "concurrent");
    gate.open(2);
    assert_eq!(finish(vec![a3, a4]).await, [StatusCode::OK; 2]);
}

#[tokio::test]
async fn a_request_refused_by_a_rate_quota_gives_its_slot_back() {
    let gate = Gate::default();
    let quota = Quota::fixed_window(1, Duration::from_secs(3600))
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(
        Limiter::new(MemoryBackend::new(), quota),
        HeaderKey::new(http::HeaderName::from_static("x-key")),
    )
    .concurrency(ConcurrencyQuota::new(1).unwrap())
    .build();
    let addr = server(&gate, layer).await;
    let c = client();
    assert_eq!(send(&c, addr, "/", "a").await.status, StatusCode::OK);
    for _ in 0..3 {
        let r = send(&c, addr, "/", "a").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        // Refused by the rate quota, not the concurrency one: no slot kept.
        assert_ne!(r.json()["violated-policies"][0], "concurrent", "{}", r.body);
    }
}

/// A body sending a chunk every 10 ms (for at most 5 s), noting its drop.
#[derive(Default)]
struct Drip {
    sent: usize,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

static DRIP_DROPPED: AtomicBool = AtomicBool::new(false);

impl Drop for Drip {
    fn drop(&mut self) {
        DRIP_DROPPED.store(true, Ordering::SeqCst);
    }
}

impl http_body::Body for Drip {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.sent >= 500 {
            return Poll::Ready(None);
        }
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(10))));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.timer = None;
        self.sent += 1;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"chunk\n")))))
    }
}

#[tokio::test]
async fn a_client_leaving_mid_body_gives_its_slot_back() {
    let gate = Gate::default();
    let layer = builder()
        .concurrency(ConcurrencyQuota::new(1).unwrap())
        .build();
    let addr = server(&gate, layer).await;
    let c = client();

    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /stream HTTP/1.1\r\nhost: test\r\nx-key: a\r\n\r\n")
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("chunk") {
        let n = tokio::time::timeout(BOUND, conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the server closed before the body");
        seen.extend_from_slice(&buf[..n]);
    }
    // Mid-body, the slot is held.
    assert_concurrency_refusal(&send(&c, addr, "/", "a").await, "concurrent");
    drop(conn);
    until_ok(&c, addr, "a").await;
    assert!(
        DRIP_DROPPED.load(Ordering::SeqCst),
        "the body was dropped, not finished"
    );
}

#[tokio::test]
async fn a_panicking_handler_gives_its_slot_back() {
    let gate = Gate::default();
    let layer = builder()
        .concurrency(ConcurrencyQuota::new(1).unwrap())
        .build();
    let addr = server(&gate, layer).await;
    let c = client();
    for _ in 0..3 {
        let sent = c
            .request(
                http::Request::get(format!("http://{addr}/panic"))
                    .header("x-key", "a")
                    .body(http_body_util::Empty::new())
                    .unwrap(),
            )
            .await;
        assert!(sent.is_err(), "the connection dies with the handler");
        until_ok(&c, addr, "a").await;
    }
}

#[tokio::test]
async fn a_custom_rejection_response_answers_concurrency_refusals_too() {
    let gate = Gate::default();
    let quota = Quota::gcra(2, Duration::from_secs(60)).build().unwrap();
    let layer = RateLimitLayer::builder(
        Limiter::new(MemoryBackend::new(), quota),
        HeaderKey::new(http::HeaderName::from_static("x-key")),
    )
    .concurrency(ConcurrencyQuota::new(1).unwrap())
    .rejection_response(|r| {
        let kind = match r.refused {
            Refused::Rate { .. } => "rate",
            Refused::Concurrency { in_use, .. } => &format!("concurrency, {in_use} under way"),
            _ => "other",
        };
        let body = format!(
            "{kind}: {:?} for {}, retry in {:?}",
            r.violated(),
            r.key,
            r.retry_after()
        );
        let mut response = http::Response::new(Bytes::from(body));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response
    })
    .build();
    let addr = server(&gate, layer).await;
    let c = client();
    let held = hold(&c, addr, &gate, "/held", "a").await;
    let r = send(&c, addr, "/", "a").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.body,
        "concurrency, 1 under way: [\"concurrent\"] for key:a, retry in 1s"
    );
    assert_eq!(r.header("retry-after"), Some("1"), "added by the layer");
    assert_eq!(r.list("ratelimit-policy")[0].name(), "concurrent");
    gate.open(1);
    assert_eq!(finish(vec![held]).await, [StatusCode::OK]);
    // The rate quota's refusal goes through the same function.
    until_ok(&c, addr, "a").await;
    let r = send(&c, addr, "/", "a").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.body.starts_with("rate: [\"2-per-60s\"] for key:a"),
        "{}",
        r.body
    );
}

#[tokio::test]
async fn draft6_and_legacy_headers_show_a_concurrency_quota_when_it_binds() {
    use tollgate::layer::HeaderStyle;
    for (style, limit, remaining, reset, retry) in [
        (
            HeaderStyle::Draft6,
            "ratelimit-limit",
            "ratelimit-remaining",
            "ratelimit-reset",
            None,
        ),
        (
            HeaderStyle::Legacy,
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            Some("x-ratelimit-retry-after"),
        ),
    ] {
        let gate = Gate::default();
        // A rate quota of 100 a minute for key a, 1 for key b.
        let quotas = tollgate::QuotaSet::new(
            "s",
            [Quota::gcra(100, Duration::from_secs(60)).build().unwrap()],
        )
        .unwrap();
        let layer = RateLimitLayer::builder(
            Limiter::new(MemoryBackend::new(), quotas),
            HeaderKey::new(http::HeaderName::from_static("x-key")),
        )
        .cost(|parts| {
            if parts.headers["x-key"] == "b" {
                100
            } else {
                1
            }
        })
        .header_style(style)
        .concurrency(ConcurrencyQuota::new(2).unwrap())
        .build();
        let addr = server(&gate, layer).await;
        let c = client();
        let numbers = |r: &Reply| {
            (
                r.header(limit).map(str::to_owned),
                r.header(remaining).map(str::to_owned),
                r.header(reset).map(str::to_owned),
            )
        };
        let s = |v: &str| Some(v.to_owned());
        // One held: the next request takes the last free slot, fewer than
        // the rate quota's 98 left, so the concurrency numbers show (no
        // reset: when a slot frees is not known).
        let held = hold(&c, addr, &gate, "/held", "a").await;
        let r = send(&c, addr, "/", "a").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(numbers(&r), (s("2"), s("0"), None), "{style:?}");
        // Two held: refused by the concurrency quota.
        let held2 = hold(&c, addr, &gate, "/held", "a").await;
        let r = send(&c, addr, "/", "a").await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(numbers(&r), (s("2"), s("0"), None), "{style:?}");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(retry.and_then(|h| r.header(h)), retry.map(|_| "1"));
        // Key b's request spends its whole rate quota: 0 left, fewer than the
        // concurrency quota's free slot, so the rate numbers show.
        let r = send(&c, addr, "/", "b").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(numbers(&r), (s("100"), s("0"), s("60")), "{style:?}");
        gate.open(2);
        assert_eq!(finish(vec![held, held2]).await, [StatusCode::OK; 2]);
    }
}

#[tokio::test]
async fn a_layer_with_only_a_concurrency_quota_limits_requests_under_way_only() {
    let gate = Gate::default();
    let layer = RateLimitLayer::concurrency_builder(
        ConcurrencyQuota::new(1).unwrap(),
        HeaderKey::new(http::HeaderName::from_static("x-key")),
    )
    .build();
    assert!(layer.policy().limiter().is_none());
    let addr = server(&gate, layer).await;
    let c = client();
    // No rate quota: one after another, any number pass.
    for _ in 0..30 {
        let r = send(&c, addr, "/", "a").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(
            r.list("ratelimit-policy").len(),
            1,
            "the concurrency quota's only"
        );
    }
    let held = hold(&c, addr, &gate, "/held", "a").await;
    assert_concurrency_refusal(&send(&c, addr, "/", "a").await, "concurrent");
    assert_eq!(send(&c, addr, "/", "b").await.status, StatusCode::OK);
    gate.open(1);
    assert_eq!(finish(vec![held]).await, [StatusCode::OK]);
    until_ok(&c, addr, "a").await;
}
