//! Usage-based limits: costs known from the response (LLM tokens), and
//! request and token quotas in one set, through the builder, the layer
//! and real gateways on memory and on Redis. Calendar quotas are in
//! `calendar.rs`.

#![cfg(feature = "gateway")]

use crate::support;
use crate::support::redis as redis_support;

use proptest::prelude::*;
use tollgate::{
    Algorithm, Counts, Limiter, ManualClock, MemoryBackend, Quota, QuotaSet, Settle, Timestamp,
};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::routing::get;
use axum::{Extension, Router};
use http::HeaderName;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tollgate::key::HeaderKey;
use tollgate::layer::{CostFromResponse, RateLimitLayer, Usage};

/// A fake LLM API on plain TCP, written by hand so that the test controls
/// every byte: each request's `x-tokens` header is the usage its answer
/// reports in `x-usage-total-tokens`. With `x-stream: trailer` the answer
/// is chunked and the count comes in the trailer instead (as an HTTP/2 or
/// gRPC server sends it at the end of a stream); with `x-stream: hang` it
/// sends its head and one chunk, then holds the connection until the
/// client goes away (a stream the client drops).
struct FakeLlm {
    addr: SocketAddr,
    /// Requests answered (or begun, for a hanging stream).
    served: Arc<AtomicUsize>,
}

async fn fake_llm() -> FakeLlm {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&served);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let _ = answer_all(socket, count).await;
            });
        }
    });
    FakeLlm { addr, served }
}

/// Answers the requests of one connection (kept alive) until it closes.
async fn answer_all(
    socket: tokio::net::TcpStream,
    served: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let (read, mut write) = socket.into_split();
    let mut read = BufReader::new(read);
    loop {
        let mut tokens = 0u64;
        let mut stream = String::new();
        let mut length = 0usize;
        let mut first = true;
        loop {
            let mut line = String::new();
            if read.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let line = line.trim_end();
            if line.is_empty() {
                if first {
                    continue;
                }
                break;
            }
            first = false;
            if let Some((name, value)) = line.split_once(':') {
                let value = value.trim();
                match name.to_ascii_lowercase().as_str() {
                    "x-tokens" => tokens = value.parse().unwrap_or(0),
                    "x-stream" => stream = value.to_owned(),
                    "content-length" => length = value.parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        read.read_exact(&mut body).await?;
        served.fetch_add(1, Ordering::SeqCst);
        match stream.as_str() {
            "trailer" => {
                let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-usage-total-tokens\r\ncontent-type: text/plain\r\n\r\n";
                let chunk = "5\r\nhello\r\n";
                let end = format!("0\r\nx-usage-total-tokens: {tokens}\r\n\r\n");
                write
                    .write_all(format!("{head}{chunk}{end}").as_bytes())
                    .await?;
            }
            "hang" => {
                let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/plain\r\n\r\n5\r\nhello\r\n";
                write.write_all(head.as_bytes()).await?;
                // Until the client hangs up: a read of 0 bytes or an error.
                let mut rest = [0u8; 64];
                while matches!(read.read(&mut rest).await, Ok(n) if n > 0) {}
                return Ok(());
            }
            _ => {
                let body = "{\"answer\":\"hello\"}";
                let head = format!(
                    "HTTP/1.1 200 OK\r\nx-usage-total-tokens: {tokens}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                write.write_all(head.as_bytes()).await?;
            }
        }
    }
}

/// One request to the fake upstream straight, no gateway: it answers as
/// the gateway tests expect it to.
#[tokio::test]
async fn the_fake_llm_reports_usage_in_a_header_and_a_trailer() {
    let llm = fake_llm().await;
    let mut socket = tokio::net::TcpStream::connect(llm.addr).await.unwrap();
    socket
        .write_all(
            b"POST /v1/chat HTTP/1.1\r\nhost: x\r\nx-tokens: 321\r\ncontent-length: 2\r\n\r\n{}",
        )
        .await
        .unwrap();
    let mut got = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut got))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&got[..n]);
    assert!(text.contains("x-usage-total-tokens: 321"), "{text}");
    socket
        .write_all(b"GET /s HTTP/1.1\r\nhost: x\r\nx-tokens: 7\r\nx-stream: trailer\r\n\r\n")
        .await
        .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut got))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&got[..n]);
    assert!(
        text.ends_with("0\r\nx-usage-total-tokens: 7\r\n\r\n"),
        "{text}"
    );
    assert_eq!(llm.served.load(Ordering::SeqCst), 2);
}

/// 2026-11-26T12:00:00Z: a moment in the middle of a minute-long window.
const NOON: u64 = 1_795_176_000_000_000 + 6 * 86_400_000_000 + 30_000_000;

pub(crate) fn memory(quota: Quota) -> (Limiter<MemoryBackend<ManualClock>>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_micros(NOON));
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    (Limiter::new(backend, quota), clock)
}

/// An answer that took more than its reservation puts the key in debt:
/// the next request is refused, and its Retry-After covers the debt.
#[tokio::test]
async fn an_under_estimate_puts_the_key_in_debt_and_retry_after_covers_it() {
    // 1 000 tokens a minute: one token each 60 ms.
    let (tokens, clock) = memory(Quota::gcra(1_000, Duration::from_secs(60)).build().unwrap());
    let answer = tokens.reserve("key", 100).await.unwrap();
    assert!(answer.decision().allowed());
    let left = answer.settle(Settle::Actual(1_500)).await.unwrap().unwrap();
    assert_eq!(left.remaining(), 0);
    let refused = tokens.check("key", 1).await.unwrap();
    assert!(!refused.allowed());
    // 1 500 tokens spent of a 1 000 burst: one more fits once 501 have
    // come back, 30.06 s.
    let wait = refused.retry_after().unwrap();
    assert!(wait >= Duration::from_millis(30_060), "{wait:?}");
    clock.advance(wait - Duration::from_millis(1));
    assert!(!tokens.check("key", 1).await.unwrap().allowed());
    clock.advance(Duration::from_millis(1));
    assert!(tokens.check("key", 1).await.unwrap().allowed());
}

/// Debt on a fixed window lasts to the window's end, which Retry-After says.
#[tokio::test]
async fn a_fixed_window_in_debt_refuses_until_its_end() {
    let (tokens, clock) = memory(
        Quota::fixed_window(1_000, Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    let answer = tokens.reserve("key", 500).await.unwrap();
    answer.settle(Settle::Actual(4_000)).await.unwrap();
    let refused = tokens.check("key", 1).await.unwrap();
    assert!(!refused.allowed());
    // NOON is 30 s into its minute.
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(30)));
    clock.advance(Duration::from_secs(30));
    assert!(tokens.check("key", 1).await.unwrap().allowed());
}

/// Below the reservation, the rest goes back; equal, nothing changes; a
/// refused reservation was not served, and settling it changes nothing.
#[tokio::test]
async fn an_over_estimate_gives_the_rest_back() {
    let (tokens, _clock) = memory(
        Quota::fixed_window(1_000, Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    let a = tokens.reserve("key", 500).await.unwrap();
    let left = a.settle(Settle::Actual(120)).await.unwrap().unwrap();
    assert_eq!(left.remaining(), 880);
    let b = tokens.reserve("key", 80).await.unwrap();
    assert_eq!(b.settle(Settle::Actual(80)).await.unwrap(), None);
    assert_eq!(tokens.peek("key", 0).await.unwrap().remaining(), 800);
    let refused = tokens.reserve("key", 900).await.unwrap();
    assert!(!refused.decision().allowed());
    assert_eq!(refused.settle(Settle::Actual(5_000)).await.unwrap(), None);
    assert_eq!(tokens.peek("key", 0).await.unwrap().remaining(), 800);
}

fn quota_of(algorithm: Algorithm, capacity: u64) -> Quota {
    Quota::builder(algorithm, capacity, Duration::from_secs(3_600))
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Settling never loses or creates units: at one moment, what the
    /// quota has spent is what the admitted requests really cost
    /// (reserved - returned + extra = charged), up to the capacity, past
    /// which the key is in debt and has nothing left.
    #[test]
    fn settle_never_loses_or_creates_units(
        algorithm in prop::sample::select(vec![
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ]),
        steps in prop::collection::vec((1u64..400, 0u64..700), 1..40),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let capacity = 5_000;
            let (limiter, _clock) = memory(quota_of(algorithm, capacity));
            let mut charged = 0u64;
            for (reserve, actual) in steps {
                let r = limiter.reserve("k", reserve).await.unwrap();
                let admitted = r.decision().allowed();
                r.settle(Settle::Actual(actual)).await.unwrap();
                if admitted {
                    charged += actual;
                }
                let left = limiter.peek("k", 0).await.unwrap().remaining();
                prop_assert_eq!(
                    capacity - left,
                    charged.min(capacity),
                    "{:?} after reserving {} and using {}", algorithm, reserve, actual
                );
            }
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Settling never loses or creates units across a request quota and a
    /// token quota in one set: the tokens spent are what the admitted
    /// requests really cost (reserved - returned + extra = charged), the
    /// requests spent are the admitted reservations not given back whole,
    /// whatever their costs and however they settled.
    #[test]
    fn settle_never_loses_or_creates_units_across_both_quotas(
        algorithm in prop::sample::select(vec![
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::Gcra,
        ]),
        steps in prop::collection::vec((0u64..400, 0u64..700, 0u8..4), 1..40),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (requests_limit, capacity) = (30, 5_000);
            let set = QuotaSet::new("llm", [
                Quota::builder(algorithm, requests_limit, Duration::from_secs(3_600))
                    .name("requests")
                    .counts(Counts::Requests)
                    .build()
                    .unwrap(),
                Quota::builder(algorithm, capacity, Duration::from_secs(3_600))
                    .name("tokens")
                    .build()
                    .unwrap(),
            ])
            .unwrap();
            let clock = ManualClock::new(Timestamp::from_micros(NOON));
            let backend = MemoryBackend::builder().clock(clock.clone()).build();
            let limiter = Limiter::new(backend, set);
            let (mut charged, mut counted) = (0u64, 0u64);
            for (reserve, actual, how) in steps {
                let r = limiter.reserve("k", reserve).await.unwrap();
                let admitted = r.decision().allowed();
                let (used, request) = match how {
                    0 => {
                        r.settle(Settle::GiveBack).await.unwrap();
                        (0, 0)
                    }
                    1 => {
                        r.settle(Settle::Keep).await.unwrap();
                        (reserve, 1)
                    }
                    _ => {
                        r.settle(Settle::Actual(actual)).await.unwrap();
                        (actual, 1)
                    }
                };
                if admitted {
                    charged += used;
                    counted += request;
                }
                let left = limiter.peek("k", 0).await.unwrap();
                let [requests, tokens] = left.quotas() else { panic!("two quotas") };
                prop_assert_eq!(
                    requests_limit - requests.remaining(),
                    counted.min(requests_limit),
                    "{:?}: requests after {} reserved, {} used, settled {}",
                    algorithm, reserve, actual, how
                );
                prop_assert_eq!(
                    capacity - tokens.remaining(),
                    charged.min(capacity),
                    "{:?}: tokens after {} reserved, {} used, settled {}",
                    algorithm, reserve, actual, how
                );
            }
            Ok(())
        })?;
    }
}

pub(crate) fn redis_on(
    server: &redis_support::RedisServer,
    clock: &ManualClock,
) -> tollgate::RedisBackend {
    tollgate::RedisBackend::from_url(server.url())
        .prefix("usage:")
        .clock(clock.clone())
        .denial_cache(0)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("build the Redis backend")
}

/// What a decision says, as the traces compare it.
pub(crate) fn seen(d: &tollgate::Decision) -> (bool, u64, Option<Duration>, Option<Duration>) {
    let reset = d.quotas().first().map(|q| q.reset());
    (d.allowed(), d.remaining(), d.retry_after(), reset)
}

/// Reservations settled above, at and below their estimate, on the same
/// timeline, give the same decisions in memory and on Redis, for every
/// algorithm: the charge past the limit and its debt mean the same in
/// both.
#[tokio::test]
async fn settling_traces_match_in_memory_and_on_redis() {
    let server = redis_support::RedisServer::start();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for algorithm in Algorithm::ALL {
        let quota = Quota::builder(algorithm, 1_000, Duration::from_secs(60))
            .name("tokens")
            .build()
            .unwrap();
        let set = tollgate::QuotaSet::new(format!("t-{}", algorithm.name()), [quota]).unwrap();
        let clock = ManualClock::new(Timestamp::from_micros(NOON));
        let memory = Limiter::new(
            MemoryBackend::builder().clock(clock.clone()).build(),
            set.clone(),
        );
        let redis = Limiter::new(redis_on(&server, &clock), set);
        for step in 0..60 {
            let (reserve, actual) = (1 + next(300), next(900));
            let m = memory.reserve("k", reserve).await.unwrap();
            let r = redis.reserve("k", reserve).await.unwrap();
            assert_eq!(
                seen(m.decision()),
                seen(r.decision()),
                "{algorithm} step {step}: reserve {reserve}"
            );
            let m = m.settle(Settle::Actual(actual)).await.unwrap();
            let r = r.settle(Settle::Actual(actual)).await.unwrap();
            assert_eq!(
                m.as_ref().map(seen),
                r.as_ref().map(seen),
                "{algorithm} step {step}: used {actual}"
            );
            let (m, r) = (
                memory.peek("k", 1).await.unwrap(),
                redis.peek("k", 1).await.unwrap(),
            );
            assert_eq!(seen(&m), seen(&r), "{algorithm} step {step}: after");
            clock.advance(Duration::from_millis(next(9_000)));
        }
    }
}

// ---- The layer: cost from the response --------------------------------

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

// ---- The gateway: a rule's cost from the response ----------------------

/// 5 requests and 1 000 tokens a minute per API key: two rules on the same
/// requests, the second taking its cost from the fake LLM's answer.
const LLM_RULES: &str = r#"
matching: all
rules:
  - name: requests
    key: header:x-api-key
    quotas: [{ name: requests, algorithm: fixed_window, limit: 5, period: 1m }]
  - name: tokens
    key: header:x-api-key
    cost_from_response: { header: x-usage-total-tokens, reserve: 500, reserve_header: x-max-tokens }
    quotas: [{ name: tokens, algorithm: fixed_window, limit: 1000, period: 1m }]
"#;

/// The same limits as one rule and one set: the request quota counts
/// requests, the token quota the cost from the response.
const LLM_ONE_RULE: &str = r#"
rules:
  - name: llm
    key: header:x-api-key
    cost_from_response: { header: x-usage-total-tokens, reserve: 500, reserve_header: x-max-tokens }
    quotas:
      - { name: requests, algorithm: fixed_window, limit: 5, period: 1m, counts: requests }
      - { name: tokens, algorithm: fixed_window, limit: 1000, period: 1m }
"#;

/// Waits, if need be, until at least 25 s of the wall clock's minute are
/// left: the quotas here are fixed windows of a minute aligned to the
/// clock, and a trace that crossed into the next window would see every
/// count start again (a pass where a refusal is asserted).
async fn well_inside_a_minute() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    let into = now.as_millis() % 60_000;
    if into > 35_000 {
        tokio::time::sleep(Duration::from_millis(60_000 - into as u64 + 100)).await;
    }
}

/// One call through a gateway: its status and Retry-After.
async fn call(
    gw: &support::gateway::Gateway,
    key: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<u64>) {
    let (status, retry, _) = call_read(gw, key, headers).await;
    (status, retry)
}

/// [`call`], with the body (a refusal's problem details name the quota).
async fn call_read(
    gw: &support::gateway::Gateway,
    key: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<u64>, String) {
    use http_body_util::BodyExt;
    let client = support::client();
    let mut req =
        http::Request::get(format!("http://{}/v1/chat", gw.addr)).header("x-api-key", key);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(req.body(http_body_util::Empty::new()).unwrap()),
    )
    .await
    .unwrap()
    .unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}

/// Both limits hold through `gateways` (taken in turn): a key spending
/// little runs into the request limit, one spending 300 tokens a call
/// (its estimate exact) into the token limit.
async fn five_requests_and_a_thousand_tokens(gateways: &[&support::gateway::Gateway]) {
    well_inside_a_minute().await;
    let mut passed = 0;
    for i in 0..7 {
        let (status, _) = call(
            gateways[i % gateways.len()],
            "small",
            &[("x-tokens", "10"), ("x-max-tokens", "10")],
        )
        .await;
        passed += usize::from(status == 200);
    }
    assert_eq!(passed, 5, "five requests a minute");
    let mut passed = 0;
    for i in 0..5 {
        let (status, _) = call(
            gateways[i % gateways.len()],
            "big",
            &[("x-tokens", "300"), ("x-max-tokens", "300")],
        )
        .await;
        passed += usize::from(status == 200);
    }
    assert_eq!(passed, 3, "three answers of 300 tokens in 1 000");
}

/// After an answer that took far more than reserved, calls of one token
/// pass until the settle lands, then are refused; the refusal's
/// Retry-After is the rest of the window (the debt lasts as long).
async fn an_under_estimate_is_refused_after(
    gw: &support::gateway::Gateway,
    headers: &[(&str, &str)],
) {
    let (status, _) = call(gw, "debtor", headers).await;
    assert_eq!(status, 200);
    for _ in 0..4 {
        let (status, retry) = call(gw, "debtor", &[("x-tokens", "1"), ("x-max-tokens", "1")]).await;
        if status == 429 {
            let retry = retry.expect("a Retry-After");
            assert!((1..=60).contains(&retry), "{retry}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the usage beyond the reservation was never charged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_memory_holds_requests_and_tokens_a_minute() {
    let llm = fake_llm().await;
    let rules = support::gateway::RulesFile::new("usage-memory", LLM_RULES);
    let gw = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &[]);
    five_requests_and_a_thousand_tokens(&[&gw]).await;
    an_under_estimate_is_refused_after(&gw, &[("x-tokens", "1500"), ("x-max-tokens", "100")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_redis_share_requests_and_tokens() {
    let redis = redis_support::RedisServer::start();
    let llm = fake_llm().await;
    let rules = support::gateway::RulesFile::new("usage-redis", LLM_RULES);
    let url = redis.url();
    let a = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &["--redis", &url]);
    let b = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &["--redis", &url]);
    five_requests_and_a_thousand_tokens(&[&a, &b]).await;
    // The count in a trailer, at the end of a chunked answer.
    an_under_estimate_is_refused_after(
        &b,
        &[
            ("x-tokens", "1500"),
            ("x-max-tokens", "100"),
            ("x-stream", "trailer"),
        ],
    )
    .await;
    let served = llm.served.load(Ordering::SeqCst);
    // Five small answers, three of 300 tokens, the one in debt.
    assert!(served > 5 + 3, "{served}");
}

/// One set, "5 requests and 1 000 tokens a minute": through `gateways`
/// (taken in turn), the 6th cheap request is refused by the request
/// quota, and a big one, with requests left, by the token quota; an
/// estimate of 0 tokens still counts its request.
async fn one_set_of_requests_and_tokens(gateways: &[&support::gateway::Gateway]) {
    well_inside_a_minute().await;
    let gw = |i: usize| gateways[i % gateways.len()];
    for i in 0..4 {
        let (status, _) = call(
            gw(i),
            "small",
            &[("x-tokens", "10"), ("x-max-tokens", "10")],
        )
        .await;
        assert_eq!(status, 200, "cheap request {i}");
    }
    let (status, _) = call(gw(4), "small", &[("x-tokens", "0"), ("x-max-tokens", "0")]).await;
    assert_eq!(status, 200, "the fifth, free of tokens");
    let (status, retry, body) = call_read(
        gw(5),
        "small",
        &[("x-tokens", "10"), ("x-max-tokens", "10")],
    )
    .await;
    assert_eq!(status, 429, "the sixth cheap request");
    assert!(
        body.contains(r#""violated-policies":["requests"]"#),
        "{body}"
    );
    assert!(retry.is_some_and(|r| (1..=60).contains(&r)), "{retry:?}");
    for i in 0..3 {
        let (status, _) = call(
            gw(i),
            "big",
            &[("x-tokens", "300"), ("x-max-tokens", "300")],
        )
        .await;
        assert_eq!(status, 200, "big answer {i}");
    }
    let (status, _, body) = call_read(
        gw(3),
        "big",
        &[("x-tokens", "300"), ("x-max-tokens", "300")],
    )
    .await;
    assert_eq!(status, 429, "a fourth answer of 300 tokens");
    assert!(body.contains(r#""violated-policies":["tokens"]"#), "{body}");
    // Answers that took fewer tokens than reserved give the rest back
    // (once the settle lands): two of 600 reserved and 50 used leave room
    // for a third of 800, which without the tokens given back would be
    // refused; a refused call spends no request.
    for (i, (used, estimate)) in [("50", "600"), ("50", "600"), ("800", "800")]
        .into_iter()
        .enumerate()
    {
        let mut status = 0;
        for _ in 0..20 {
            (status, _) = call(
                gw(i),
                "over",
                &[("x-tokens", used), ("x-max-tokens", estimate)],
            )
            .await;
            if status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            status, 200,
            "answer {i} of {used} tokens, {estimate} reserved"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_set_on_memory_counts_requests_and_tokens_apart() {
    let llm = fake_llm().await;
    let rules = support::gateway::RulesFile::new("usage-one-set", LLM_ONE_RULE);
    let gw = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &[]);
    one_set_of_requests_and_tokens(&[&gw]).await;
    an_under_estimate_is_refused_after(&gw, &[("x-tokens", "1500"), ("x-max-tokens", "100")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_set_on_redis_counts_requests_and_tokens_apart_across_two_gateways() {
    let redis = redis_support::RedisServer::start();
    let llm = fake_llm().await;
    let rules = support::gateway::RulesFile::new("usage-one-set-redis", LLM_ONE_RULE);
    let url = redis.url();
    let a = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &["--redis", &url]);
    let b = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &["--redis", &url]);
    one_set_of_requests_and_tokens(&[&a, &b]).await;
    an_under_estimate_is_refused_after(&b, &[("x-tokens", "1500"), ("x-max-tokens", "100")]).await;
}
