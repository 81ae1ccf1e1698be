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
async fn an_elastic_quota_admits_over_its_limit_while_idle_and_not_while_saturated() {
    let gate = Gate::default();
    let load = MeasuredLoad::new(4, Duration::from_secs(60));
    let quota = ConcurrencyQuota::new(1).unwrap().elastic(2).unwrap();
    let layer = builder()
        .concurrency(quota)
        .measure_load(load.clone())
        .build();
    let addr = server(&gate, layer).await;
    let c = client();

    // Idle: a second request of one key passes its limit of 1, up to 2.
    let a1 = hold(&c, addr, &gate, "/held", "a").await;
    let a2 = hold(&c, addr, &gate, "/held", "a").await;
    let r = send(&c, addr, "/", "a").await;
    assert_concurrency_refusal(&r, "concurrent");
    let policy = r.list("ratelimit-policy");
    let p = policy.iter().find(|m| m.name() == "concurrent").unwrap();
    assert_eq!(p.int("q"), 1, "the headers show the limit, not the ceiling");
    gate.open(2);
    assert_eq!(finish(vec![a1, a2]).await, [StatusCode::OK; 2]);

    // Saturated (4 of 4 in flight): back to the limit.
    let mut held = Vec::new();
    for key in ["b", "c", "d"] {
        held.push(hold(&c, addr, &gate, "/held", key).await);
    }
    held.push(hold(&c, addr, &gate, "/held", "a").await);
    assert_eq!(load.in_flight(), 4);
    assert_concurrency_refusal(&send(&c, addr, "/held", "a").await, "concurrent");
    gate.open(4);
    assert_eq!(finish(held).await, [StatusCode::OK; 4]);
    assert_eq!(load.in_flight(), 0);
}

/// A layer of one elastic rate quota on `backend`: 2 per minute (GCRA,
/// one unit back every 30 s, so none returns during a test), up to 4 with
/// room.
fn elastic_rate<B: tollgate::Backend>(backend: B) -> RateLimitLayerBuilder<B, HeaderKey> {
    let quota = Quota::gcra(2, Duration::from_secs(60))
        .name("per-minute")
        .mode(Mode::Elastic { percent: 100 })
        .build()
        .unwrap();
    RateLimitLayer::builder(
        // Named: Redis refuses a set without a name.
        Limiter::new(
            backend,
            tollgate::QuotaSet::new("per-minute", [quota]).unwrap(),
        ),
        HeaderKey::new(http::HeaderName::from_static("x-key")),
    )
    .timeout(BOUND)
    .on_backend_error(tollgate::OnBackendError::Reject)
}

/// The rate quota's `q` and `r` on a response.
fn rate_numbers(r: &Reply) -> (i64, i64) {
    let policy = r.list("ratelimit-policy");
    let state = r.list("ratelimit");
    let p = policy.iter().find(|m| m.name() == "per-minute").unwrap();
    let s = state.iter().find(|m| m.name() == "per-minute").unwrap();
    (p.int("q"), s.int("r"))
}

/// Idle: a key passes its limit of 2, up to the ceiling of 4, the headers
/// showing the limit. Saturated (4 of 4 in flight): another key gets its
/// limit only.
async fn elastic_rate_trace(gate: &Gate, addr: SocketAddr, load: &MeasuredLoad) {
    let c = client();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = send(&c, addr, "/", "a").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        seen.push(rate_numbers(&r));
    }
    assert_eq!(seen, [(2, 1), (2, 0), (2, 0), (2, 0)]);
    let r = send(&c, addr, "/", "a").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "over the ceiling");
    assert_eq!(rate_numbers(&r), (2, 0));

    let mut held = Vec::new();
    for i in 0..4 {
        held.push(hold(&c, addr, gate, "/held", &format!("h{i}")).await);
    }
    assert_eq!(load.in_flight(), 4);
    for _ in 0..2 {
        assert_eq!(send(&c, addr, "/", "b").await.status, StatusCode::OK);
    }
    let r = send(&c, addr, "/", "b").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "saturated: the limit"
    );
    assert_eq!(r.json()["violated-policies"][0], "per-minute");
    gate.open(4);
    assert_eq!(finish(held).await, [StatusCode::OK; 4]);
}

#[tokio::test]
async fn an_elastic_rate_quota_admits_over_its_limit_while_idle_and_not_while_saturated() {
    let gate = Gate::default();
    let load = MeasuredLoad::new(4, Duration::from_secs(60));
    let layer = elastic_rate(MemoryBackend::new())
        .measure_load(load.clone())
        .build();
    let addr = server(&gate, layer).await;
    elastic_rate_trace(&gate, addr, &load).await;
}

#[tokio::test]
async fn an_elastic_rate_quota_without_a_load_signal_keeps_its_limit() {
    let gate = Gate::default();
    let addr = server(&gate, elastic_rate(MemoryBackend::new()).build()).await;
    let c = client();
    for _ in 0..2 {
        assert_eq!(send(&c, addr, "/", "a").await.status, StatusCode::OK);
    }
    let r = send(&c, addr, "/", "a").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "no signal, no room"
    );
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

#[tokio::test]
async fn under_overload_lower_priorities_are_shed_first_and_critical_is_served() {
    let gate = Gate::default();
    let load = MeasuredLoad::new(10, Duration::from_secs(60));
    let shedding = Shedding::new().priority(|parts| match parts.uri.path() {
        p if p.starts_with("/critical") => Priority::Critical,
        p if p.starts_with("/background") => Priority::Background,
        _ => Priority::Normal,
    });
    let layer = builder().measure_load(load.clone()).shed(shedding).build();
    let addr = server(&gate, layer).await;
    let c = client();
    let shed = |r: &Reply| {
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(
            r.json()["type"],
            tollgate::layer::TEMPORARY_REDUCED_CAPACITY
        );
    };

    let mut held = Vec::new();
    for i in 0..6 {
        held.push(hold(&c, addr, &gate, "/background/held", &format!("k{i}")).await);
    }
    // 6 of 10 in flight: background is shed, the rest served.
    shed(&send(&c, addr, "/background/held", "x").await);
    for i in 6..8 {
        held.push(hold(&c, addr, &gate, "/normal/held", &format!("k{i}")).await);
    }
    // 8 of 10: normal is shed too; the reserved 20% is for critical.
    shed(&send(&c, addr, "/normal/held", "x").await);
    shed(&send(&c, addr, "/background/held", "x").await);
    for i in 8..10 {
        held.push(hold(&c, addr, &gate, "/critical/held", &format!("k{i}")).await);
    }
    // Full: even critical waits.
    shed(&send(&c, addr, "/critical/held", "x").await);
    assert_eq!(load.in_flight(), 10);

    gate.open(10);
    assert_eq!(finish(held).await, [StatusCode::OK; 10]);
    // Load gone: every priority is served again.
    for path in ["/background/held", "/normal/held", "/critical/held"] {
        gate.open(1);
        assert_eq!(send(&c, addr, path, "x").await.status, StatusCode::OK);
    }
}

#[tokio::test]
async fn shedding_without_a_load_signal_refuses() {
    let gate = Gate::default();
    let layer = builder().shed(Shedding::new()).build();
    let addr = server(&gate, layer).await;
    let r = send(&client(), addr, "/", "a").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
}

/// Concurrency slots shared through a real Redis.
#[cfg(feature = "redis")]
mod redis {
    use super::redis_support::RedisServer;
    use super::*;
    use tollgate::backend::{Acquired, RedisSlots, Slot, SlotStore};

    async fn take(slots: &RedisSlots, key: &str, limit: u64) -> Acquired {
        slots.acquire(key, limit).await.unwrap()
    }

    fn granted(a: Acquired) -> Slot {
        match a {
            Acquired::Granted { slot, .. } => slot,
            Acquired::Full { in_use } => panic!("full at {in_use}"),
        }
    }

    #[tokio::test]
    async fn two_servers_share_one_limit_through_the_layer() {
        let redis = RedisServer::start();
        let gate = Gate::default();
        let mut addrs = Vec::new();
        for _ in 0..2 {
            // Generous timeouts: a slow first connection on a busy machine
            // must not let a request through unlimited.
            let slots = RedisSlots::from_url(&redis.url(), "t:")
                .unwrap()
                .timeout(BOUND);
            let quota = ConcurrencyQuota::new(2).unwrap().store(slots);
            let layer = builder()
                .concurrency(quota)
                .timeout(BOUND)
                .on_backend_error(tollgate::OnBackendError::Reject)
                .build();
            addrs.push(server(&gate, layer).await);
        }
        let c = client();
        let a1 = hold(&c, addrs[0], &gate, "/held", "a").await;
        let a2 = hold(&c, addrs[1], &gate, "/held", "a").await;
        for &addr in &addrs {
            assert_concurrency_refusal(&send(&c, addr, "/", "a").await, "concurrent");
        }
        assert_eq!(send(&c, addrs[0], "/", "b").await.status, StatusCode::OK);
        gate.open(2);
        assert_eq!(finish(vec![a1, a2]).await, [StatusCode::OK; 2]);
        // Given back by a task after the response: bounded wait.
        until_ok(&c, addrs[1], "a").await;
    }

    #[tokio::test]
    async fn an_elastic_rate_quota_on_redis_admits_over_its_limit_only_while_idle() {
        let redis = RedisServer::start();
        let backend = tollgate::RedisBackend::from_url(redis.url())
            .timeout(BOUND)
            .build()
            .unwrap();
        let gate = Gate::default();
        let load = MeasuredLoad::new(4, Duration::from_secs(60));
        let layer = elastic_rate(backend).measure_load(load.clone()).build();
        let addr = server(&gate, layer).await;
        elastic_rate_trace(&gate, addr, &load).await;
    }

    /// Two servers built from one rules file on one Redis: the rule's
    /// concurrency limit is the fleet's, and both decide on the async path
    /// (a Redis backend without leases cannot decide without waiting).
    #[cfg(feature = "rules")]
    #[tokio::test]
    async fn two_rules_servers_share_one_concurrency_limit_in_redis() {
        let redis = RedisServer::start();
        let text = format!(
            "backend: {{ redis: {{ url: \"{}\", timeout: 5s }} }}\n\
             on_backend_error: reject\n\
             timeout: 5s\n\
             rules:\n  - name: held\n    key: header:x-key\n    quotas: [{{ algorithm: gcra, limit: 1000, period: 1s }}]\n    concurrency: {{ limit: 2 }}\n",
            redis.url()
        );
        let gate = Gate::default();
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let rules = tollgate::rules::Rules::parse(&text).unwrap();
            addrs.push(server(&gate, RateLimitLayer::from_policy(rules)).await);
        }
        let c = client();
        let a1 = hold(&c, addrs[0], &gate, "/held", "a").await;
        let a2 = hold(&c, addrs[1], &gate, "/held", "a").await;
        for &addr in &addrs {
            assert_concurrency_refusal(&send(&c, addr, "/", "a").await, "concurrent");
        }
        assert_eq!(send(&c, addrs[1], "/", "b").await.status, StatusCode::OK);
        gate.open(2);
        assert_eq!(finish(vec![a1, a2]).await, [StatusCode::OK; 2]);
        until_ok(&c, addrs[0], "a").await;
    }

    #[tokio::test]
    async fn a_dead_servers_slots_come_free_within_their_lifetime() {
        let redis = RedisServer::start();
        let lifetime = Duration::from_millis(300);
        let url = redis.url();
        // The server that dies: its own runtime, shut down with its slots
        // still held, so nothing gives them back or refreshes them.
        let taken = Instant::now();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let slots = RedisSlots::from_url(&url, "t:")
                    .unwrap()
                    .lifetime(lifetime)
                    .timeout(BOUND);
                for _ in 0..2 {
                    std::mem::forget(granted(take(&slots, "k", 2).await));
                }
            });
            drop(rt);
        })
        .join()
        .unwrap();

        let survivor = RedisSlots::from_url(&redis.url(), "t:")
            .unwrap()
            .lifetime(lifetime);
        assert!(matches!(
            take(&survivor, "k", 2).await,
            Acquired::Full { in_use: 2 }
        ));
        // A live holder keeps its slot past the lifetime by refreshing it.
        let kept = granted(take(&survivor, "live", 1).await);
        let slot = loop {
            match take(&survivor, "k", 2).await {
                Acquired::Granted { slot, .. } => break slot,
                Acquired::Full { .. } => {
                    assert!(taken.elapsed() < lifetime * 3, "never freed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        let freed = taken.elapsed();
        assert!(
            freed >= lifetime - Duration::from_millis(50),
            "freed early: {freed:?}"
        );
        tokio::time::sleep(lifetime).await;
        assert!(
            matches!(
                take(&survivor, "live", 1).await,
                Acquired::Full { in_use: 1 }
            ),
            "a refreshed slot outlives its lifetime"
        );
        drop((kept, slot));
    }
}
