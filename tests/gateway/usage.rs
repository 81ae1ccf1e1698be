//! Usage-based limits: costs known from the response (LLM tokens), and
//! request and token quotas in one set, through the builder, the layer
//! and real gateways on memory and on Redis. Calendar quotas are in
//! `calendar.rs`; the layer settling with the response's usage in
//! `usage_layer.rs`, real gateways in `usage_gateway.rs`.

#![cfg(feature = "gateway")]

use crate::support::redis as redis_support;

use proptest::prelude::*;
use tollgate::{
    Algorithm, Counts, Limiter, ManualClock, MemoryBackend, Quota, QuotaSet, Settle, Timestamp,
};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// A fake LLM API on plain TCP, written by hand so that the test controls
/// every byte: each request's `x-tokens` header is the usage its answer
/// reports in `x-usage-total-tokens`. With `x-stream: trailer` the answer
/// is chunked and the count comes in the trailer instead (as an HTTP/2 or
/// gRPC server sends it at the end of a stream); with `x-stream: hang` it
/// sends its head and one chunk, then holds the connection until the
/// client goes away (a stream the client drops).
pub(super) struct FakeLlm {
    pub(super) addr: SocketAddr,
    /// Requests answered (or begun, for a hanging stream).
    pub(super) served: Arc<AtomicUsize>,
}

pub(super) async fn fake_llm() -> FakeLlm {
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
pub(super) const NOON: u64 = 1_795_176_000_000_000 + 6 * 86_400_000_000 + 30_000_000;

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
