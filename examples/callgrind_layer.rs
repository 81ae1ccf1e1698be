//! N requests through the layer, polled directly with a no-op waker (no
//! runtime): memory backend, one GCRA quota, `GlobalKey`, IETF headers. For
//! instruction counts that do not depend on machine noise (BENCHMARKS.md):
//! `valgrind --tool=callgrind ./target/release/examples/callgrind_layer 2000`,
//! then 4000, and take the difference.

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use tollgate::key::GlobalKey;
use tollgate::{Limiter, MemoryBackend, Quota, RateLimitLayer};
use tower::{Layer, Service};

fn main() {
    // The number of requests, from the command line (1000 by default).
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(1_000_000, Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    let layer = RateLimitLayer::new(limiter, GlobalKey);
    let mut svc = layer.layer(tower::service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    }));
    let mut cx = Context::from_waker(Waker::noop());
    let mut ok = 0usize;
    for _ in 0..n {
        let fut = svc.call(Request::new(()));
        let mut fut = pin!(fut);
        if let Poll::Ready(Ok(r)) = fut.as_mut().poll(&mut cx) {
            ok += usize::from(r.status().is_success());
        }
    }
    assert_eq!(ok, n);
}
