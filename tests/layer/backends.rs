//! Stores that fail, hang, or decide only one way, behind the layer:
//! failure policies, timeouts, and which of `check_now` and `check` the
//! layer asks.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use tollgate::backend::{BackendErrorKind, CheckRequest, Now};
use tollgate::key::{KeyExtractor, KeyFuture, PeerIp};
use tollgate::{
    Backend, BackendError, Decision, Limiter, MemoryBackend, OnBackendError, Quota, RateLimitLayer,
};

use super::http_layer::{SEC, app, clock, from, limiter, send};

/// A backend that always fails.
struct Down;

impl Backend for Down {
    fn check<'a>(
        &'a self,
        _: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        std::future::ready(Err(BackendError::new(
            BackendErrorKind::Unavailable,
            "down for the test",
        )))
    }
}

/// A backend that never answers.
struct Hung;

impl Backend for Hung {
    fn check<'a>(
        &'a self,
        _: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        std::future::pending()
    }
}

fn quota() -> Quota {
    Quota::gcra(1, SEC).build().unwrap()
}

#[tokio::test]
async fn a_failing_backend_fails_open_by_default_or_closed_when_told() {
    let open = app(RateLimitLayer::new(
        Limiter::new(Down, quota()),
        PeerIp::new(),
    ));
    for _ in 0..3 {
        let r = send(&open, from("192.0.2.1")).await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.header("ratelimit").is_none(), "no numbers to report");
    }
    let closed = app(
        RateLimitLayer::builder(Limiter::new(Down, quota()), PeerIp::new())
            .on_backend_error(OnBackendError::Reject)
            .build(),
    );
    let r = send(&closed, from("192.0.2.1")).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
}

#[tokio::test]
async fn a_hanging_backend_is_cut_off_at_the_timeout() {
    for (policy, status) in [
        (OnBackendError::Allow, StatusCode::OK),
        (OnBackendError::Reject, StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let app = app(
            RateLimitLayer::builder(Limiter::new(Hung, quota()), PeerIp::new())
                .timeout(Duration::from_millis(50))
                .on_backend_error(policy)
                .build(),
        );
        let start = Instant::now();
        let r = send(&app, from("192.0.2.1")).await;
        let took = start.elapsed();
        assert_eq!(r.status, status);
        assert!(took >= Duration::from_millis(50), "{took:?}");
        assert!(
            took < Duration::from_secs(2),
            "answered within the timeout, not hung: {took:?}"
        );
    }
}

/// A cost no quota admits is refused with 413 under either failure policy
/// (under `Allow` it used to pass unlimited; under
/// `Reject` it was a 503, as if the limiter were down).
#[tokio::test]
async fn a_cost_no_quota_admits_is_refused_whatever_the_failure_policy() {
    for policy in [OnBackendError::Reject, OnBackendError::Allow] {
        let c = clock();
        let layer = RateLimitLayer::builder(limiter(&c, quota()), PeerIp::new())
            .cost(|_| 5)
            .on_backend_error(policy)
            .build();
        assert_eq!(
            send(&app(layer), from("192.0.2.1")).await.status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{policy:?}"
        );
    }
}

/// A store that decides now (from memory) and fails when awaited: the
/// status says which of the two the layer asked.
struct DecidesNow(MemoryBackend);

impl Backend for DecidesNow {
    fn check<'a>(
        &'a self,
        _: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        std::future::ready(Err(BackendError::new(
            BackendErrorKind::Unavailable,
            "awaited, though it decides now",
        )))
    }

    fn check_now(&self, request: CheckRequest<'_>) -> Now {
        self.0.check_now(request)
    }
}

#[tokio::test]
async fn a_custom_backend_that_implements_check_now_alone_is_asked_now() {
    let layer = RateLimitLayer::builder(
        Limiter::new(
            DecidesNow(MemoryBackend::new()),
            Quota::gcra(1, 60 * SEC).build().unwrap(),
        ),
        PeerIp::new(),
    )
    .on_backend_error(OnBackendError::Reject)
    .build();
    let app = app(layer);
    // An awaited check would answer 503.
    assert_eq!(send(&app, from("192.0.2.1")).await.status, StatusCode::OK);
    let refused = send(&app, from("192.0.2.1")).await.status;
    assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
}

/// Counts the keys it extracts.
struct Counted(Arc<AtomicUsize>);

impl KeyExtractor for Counted {
    fn extract(&self, parts: &http::request::Parts) -> KeyFuture {
        self.0.fetch_add(1, Ordering::Relaxed);
        PeerIp::new().extract(parts)
    }
}

/// A store that implements `check` alone, as most custom stores do.
struct AwaitedOnly(MemoryBackend);

impl Backend for AwaitedOnly {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        self.0.check(request)
    }
}

#[tokio::test]
async fn a_backend_that_never_decides_now_has_each_key_extracted_once_after_its_first_answer() {
    let extracted = Arc::new(AtomicUsize::new(0));
    let limiter = Limiter::new(
        AwaitedOnly(MemoryBackend::new()),
        Quota::gcra(3, 60 * SEC).build().unwrap(),
    );
    let app = app(RateLimitLayer::new(
        limiter,
        Counted(Arc::clone(&extracted)),
    ));
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(send(&app, from("192.0.2.1")).await.status);
    }
    let admitted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(admitted, 3, "{statuses:?}");
    // The first request asked `check_now`, heard `Never`, and was prepared
    // again for `check`; every later one went straight to `check`.
    assert_eq!(extracted.load(Ordering::Relaxed), 10 + 1);
}
