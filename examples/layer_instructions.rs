//! Requests polled through the layer in a loop, for callgrind: the
//! instructions per request are the difference between two run lengths
//! divided by the difference in requests, free of start-up costs and of
//! machine noise. See `scripts/callgrind-layer.sh`.
//!
//! `layer_instructions N [prometheus]`: N requests (memory backend, IETF
//! headers, one hot key, no runtime); with `prometheus`, a Prometheus
//! recorder is installed first, to price the metrics when someone listens.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::extract::ConnectInfo;
use http::{Request, Response};
use tollgate::key::PeerIp;
use tollgate::{Limiter, MemoryBackend, Quota, RateLimitLayer};
use tower::{Layer, Service, service_fn};

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    if args.next().as_deref() == Some("prometheus") {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("recorder");
    }
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(1_000_000)
        .build()
        .expect("quota");
    let limiter = Limiter::new(MemoryBackend::new(), quota);
    let layer = RateLimitLayer::new(limiter, PeerIp::new());
    let mut svc = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..n {
        let mut request = Request::new(());
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1234))));
        assert!(svc.poll_ready(&mut cx).is_ready());
        let future = pin!(svc.call(request));
        match future.poll(&mut cx) {
            Poll::Ready(response) => {
                black_box(response.expect("response"));
            }
            Poll::Pending => panic!("a memory decision never waits"),
        }
    }
}
