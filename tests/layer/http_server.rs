//! The layer in a real axum server on a loopback TCP port.

use crate::support;

use std::future::Future;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::{HeaderName, StatusCode};
use support::{client, get as fetch, serve};
use tollgate::backend::CheckRequest;
use tollgate::key::{ClientIp, HeaderKey, KeyExtractorExt, PeerIp};
use tollgate::layer::Policy;
use tollgate::{
    Backend, BackendError, Decision, Limiter, ManualClock, MemoryBackend, OnBackendError, Quota,
    RateLimitLayer, Timestamp,
};

const SEC: Duration = Duration::from_secs(1);

fn clocked(quota: Quota) -> (Limiter<MemoryBackend<ManualClock>>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_040));
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    (Limiter::new(backend, quota), clock)
}

fn app(layer: RateLimitLayer<impl Policy>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

#[tokio::test]
async fn the_limit_holds_per_key_over_tcp() {
    let (limiter, _) = clocked(Quota::sliding_log(3, 60 * SEC).build().unwrap());
    let api_key = HeaderKey::new(HeaderName::from_static("x-api-key"));
    let addr = serve(app(RateLimitLayer::new(limiter, api_key.or(PeerIp::new())))).await;
    let c = client();
    for _ in 0..3 {
        assert_eq!(
            fetch(&c, addr, "/", &[("x-api-key", b"alice")])
                .await
                .status,
            StatusCode::OK
        );
    }
    let refused = fetch(&c, addr, "/", &[("x-api-key", b"alice")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("60"));
    assert_eq!(refused.list("ratelimit")[0].int("r"), 0);
    assert_eq!(
        fetch(&c, addr, "/", &[("x-api-key", b"bob")]).await.status,
        StatusCode::OK
    );
    // No API key: limited by the peer address instead.
    let by_ip = fetch(&c, addr, "/", &[]).await;
    assert_eq!(by_ip.status, StatusCode::OK);
    assert_eq!(by_ip.list("ratelimit")[0].int("r"), 2);
}

#[tokio::test]
async fn a_retry_after_retry_after_passes_over_tcp() {
    let (limiter, clock) = clocked(Quota::token_bucket(2, 10 * SEC).build().unwrap());
    let addr = serve(app(RateLimitLayer::new(limiter, PeerIp::new()))).await;
    let c = client();
    fetch(&c, addr, "/", &[]).await;
    fetch(&c, addr, "/", &[]).await;
    clock.advance(Duration::from_millis(300));
    let refused = fetch(&c, addr, "/", &[]).await;
    let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(wait, 5, "4.7 s rounds up to 5");
    clock.advance(Duration::from_secs(wait - 1));
    assert_eq!(
        fetch(&c, addr, "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(SEC);
    assert_eq!(fetch(&c, addr, "/", &[]).await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_client_inventing_x_forwarded_for_is_still_one_client() {
    // The test client connects from 127.0.0.1, which is not a trusted proxy.
    let (limiter, _) = clocked(Quota::fixed_window(5, 60 * SEC).build().unwrap());
    let key = ClientIp::trusted_proxies(["10.0.0.0/8".parse().unwrap()]);
    let addr = serve(app(RateLimitLayer::new(limiter, key))).await;
    let c = client();
    let mut admitted = 0;
    for i in 0..20 {
        let spoof = format!("198.51.100.{i}, 10.0.0.{i}");
        if fetch(&c, addr, "/", &[("x-forwarded-for", spoof.as_bytes())])
            .await
            .status
            == StatusCode::OK
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_real_client_ip_is_used() {
    // Here 127.0.0.1 plays the trusted proxy, and appends what it saw.
    let (limiter, _) = clocked(Quota::fixed_window(2, 60 * SEC).build().unwrap());
    let key = ClientIp::trusted_proxies(["127.0.0.0/8".parse().unwrap()]);
    let addr = serve(app(RateLimitLayer::new(limiter, key))).await;
    let c = client();
    let via_proxy = |client_ip: &str, claimed: &str| format!("{claimed}, {client_ip}");
    // Client 203.0.113.5 writes a different address on the left each time.
    let mut admitted = 0;
    for i in 0..6 {
        let xff = via_proxy("203.0.113.5", &format!("192.0.2.{i}"));
        let r = fetch(&c, addr, "/", &[("x-forwarded-for", xff.as_bytes())]).await;
        admitted += u32::from(r.status == StatusCode::OK);
    }
    assert_eq!(admitted, 2);
    // Another real client has its own limit.
    let r = fetch(&c, addr, "/", &[("x-forwarded-for", b"203.0.113.6")]).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn bad_input_over_tcp_gets_its_answer_and_the_server_keeps_serving() {
    let (limiter, _) = clocked(Quota::gcra(1000, SEC).build().unwrap());
    let key = ClientIp::trusted_proxies(["127.0.0.0/8".parse().unwrap()]);
    let addr = serve(app(RateLimitLayer::new(limiter, key))).await;
    let c = client();
    // More trusted hops than are read from the right: the client is never reached.
    let long = "127.0.0.9,".repeat(100);
    let cases: [(&str, &[u8]); 4] = [
        ("x-forwarded-for", b"not-an-ip"),
        ("x-forwarded-for", b"\xff\xfe\xfd"),
        ("x-forwarded-for", b"300.1.1.1"),
        ("x-forwarded-for", long.as_bytes()),
    ];
    for (name, value) in cases {
        let r = fetch(&c, addr, "/", &[(name, value)]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{value:?}");
        assert_eq!(r.json()["status"], 400);
        assert_eq!(fetch(&c, addr, "/", &[]).await.status, StatusCode::OK);
    }
}

struct Hung;

impl Backend for Hung {
    fn check<'a>(
        &'a self,
        _: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        std::future::pending()
    }
}

#[tokio::test]
async fn a_hanging_backend_costs_at_most_the_timeout_over_tcp() {
    let quota = Quota::gcra(1, SEC).build().unwrap();
    for (policy, status) in [
        (OnBackendError::Allow, StatusCode::OK),
        (OnBackendError::Reject, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let layer = RateLimitLayer::builder(Limiter::new(Hung, quota.clone()), PeerIp::new())
            .timeout(Duration::from_millis(40))
            .on_backend_error(policy)
            .build();
        let addr = serve(app(layer)).await;
        let c = client();
        for _ in 0..3 {
            let start = Instant::now();
            let r = fetch(&c, addr, "/", &[]).await;
            assert_eq!(r.status, status);
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{:?}",
                start.elapsed()
            );
        }
    }
}

/// A cost read from the request that no quota could ever
/// admit used to fall to the backend-error policy (Allow): the request went
/// through unlimited. It is refused with 413 and a problem body, whatever
/// that policy says, and the handler never sees it.
#[tokio::test]
async fn a_cost_no_quota_can_admit_is_refused_not_let_through_over_tcp() {
    let (limiter, _) = clocked(Quota::gcra(10, 60 * SEC).build().unwrap());
    let layer = RateLimitLayer::builder(limiter, PeerIp::new())
        .on_backend_error(OnBackendError::Allow)
        .cost(|parts| {
            parts
                .headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(1)
        })
        .build();
    let addr = serve(app(layer)).await;
    let c = client();
    let huge = fetch(&c, addr, "/", &[("x-cost", b"1000000")]).await;
    assert_eq!(huge.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        huge.header("content-type"),
        Some("application/problem+json")
    );
    assert_ne!(huge.body, "ok", "the handler answered");
    // The quota is untouched, and fitting costs still pass.
    let fits = fetch(&c, addr, "/", &[("x-cost", b"10")]).await;
    assert_eq!(fits.status, StatusCode::OK);
}
