//! Requests polled through the layer in a loop, for callgrind: the
//! instructions per request are the difference between two run lengths
//! divided by the difference in requests, free of start-up costs and of
//! machine noise. See `scripts/callgrind-layer.sh`.
//!
//! `layer_instructions N [tollgate|tollgate-no-headers|rules|governor|bare]
//! [prometheus]`: N requests through tollgate's layer (memory backend, IETF
//! headers, or none), the same quota from a rules file (`rules`, with the
//! `rules` feature), tower_governor's (its headers on) or none, one hot key,
//! no runtime; with `prometheus`, a Prometheus recorder is installed first,
//! to price the metrics when someone listens. What a layer adds is its
//! count less bare's.
//!
//! `layer_instructions N time`: time, not instructions. Bare, tollgate and
//! tower_governor take turns in one process, a block of 1 000 requests
//! each, until each has sent N; each block is timed. A shared VM's speed
//! drifts by more than a layer costs between runs and between processes, so
//! only cases interleaved this finely compare (`scripts/bench-time.sh layer`).

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, Response};
use tollgate::key::PeerIp;
use tollgate::layer::HeaderStyle;
use tollgate::{Limiter, MemoryBackend, Quota, QuotaSet, RateLimitLayer};
use tower::{Layer, Service, service_fn};

#[path = "support/interleave.rs"]
mod interleave;
#[path = "support/peers.rs"]
mod peers;

use interleave::{Run, interleave};

fn main() {
    // `cargo bench` runs every bench target with `--bench`; a harness is run
    // with its own arguments (by a script, or under valgrind) and does
    // nothing then.
    if std::env::args().any(|a| a == "--bench") {
        return;
    }
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let mut mode = "tollgate".to_owned();
    let mut time = false;
    for arg in args {
        if arg == "time" {
            time = true;
        } else if arg == "prometheus" {
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("recorder");
        } else {
            mode = arg;
        }
    }
    let hello =
        service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(Body::empty())) });
    if time {
        let limiter = Limiter::new(MemoryBackend::new(), quota());
        let tollgate = RateLimitLayer::new(limiter, PeerIp::new()).layer(hello);
        let governor = peers::governor_layer().layer(hello);
        return interleaved(hello, tollgate, governor, n);
    }
    match mode.as_str() {
        "bare" => drive(hello, n),
        "tollgate" => {
            let limiter = Limiter::new(MemoryBackend::new(), quota());
            drive(RateLimitLayer::new(limiter, PeerIp::new()).layer(hello), n);
        }
        #[cfg(feature = "rules")]
        "rules" => {
            let yaml = format!(
                "rules:\n  - name: api\n    key: peer_ip\n    quotas: [{{ algorithm: gcra, limit: 1000000, period: 1s, burst: {} }}]\n",
                peers::NEVER_SPENT
            );
            let rules = tollgate::rules::Rules::parse(&yaml).expect("rules");
            drive(RateLimitLayer::from_policy(rules).layer(hello), n);
        }
        "tollgate-no-headers" => {
            let limiter = Limiter::new(MemoryBackend::new(), quota());
            let layer = RateLimitLayer::builder(limiter, PeerIp::new())
                .header_style(HeaderStyle::None)
                .build();
            drive(layer.layer(hello), n);
        }
        "governor" => {
            drive(peers::governor_layer().layer(hello), n);
        }
        other => panic!("unknown mode {other:?}"),
    }
}

/// One request first, uncounted, then `n` counted: the first one pays for
/// what happens once (the clock's calibration, which loops for a while of
/// wall time and so costs a different number of instructions on each run).
/// GCRA at a million a second with a burst never spent: every request
/// admitted.
fn quota() -> QuotaSet {
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(peers::NEVER_SPENT)
        .build()
        .expect("quota");
    QuotaSet::single(quota)
}

fn drive<S, B>(mut svc: S, n: u64)
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    send(&mut svc, 1);
    counted(&mut svc, n);
}

/// Bare, tollgate and tower_governor in turn, 1 000 requests at a time;
/// prints the nanoseconds a bare request took and what each layer added.
fn interleaved<A, B, C, X, Y, Z>(mut bare: A, mut tollgate: B, mut governor: C, n: u64)
where
    A: Service<Request<()>, Response = Response<X>>,
    A::Error: std::fmt::Debug,
    B: Service<Request<()>, Response = Response<Y>>,
    B::Error: std::fmt::Debug,
    C: Service<Request<()>, Response = Response<Z>>,
    C::Error: std::fmt::Debug,
{
    let mut runs: [Run; 3] = [
        Box::new(|k| send(&mut bare, k)),
        Box::new(|k| send(&mut tollgate, k)),
        Box::new(|k| send(&mut governor, k)),
    ];
    let ns = interleave(&mut runs, n, 1000);
    let (bare, tollgate, governor) = (ns[0], ns[1] - ns[0], ns[2] - ns[0]);
    println!("bare: {bare:.1} ns");
    println!(
        "tollgate: {tollgate:.1} ns added, {:.3}x tower_governor",
        tollgate / governor
    );
    println!("tower_governor: {governor:.1} ns added, 1.000x tower_governor");
}

/// What `scripts/callgrind-layer.sh` counts (`--toggle-collect`), so never
/// inlined.
#[inline(never)]
fn counted<S, B>(svc: &mut S, n: u64)
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    send(svc, n);
}

/// Sends `n` requests from one peer through `svc`, each polled once.
fn send<S, B>(svc: &mut S, n: u64)
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
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
                let response = response.expect("response");
                assert!(response.status().is_success(), "the limit is never reached");
                black_box(response);
            }
            Poll::Pending => panic!("a memory decision never waits"),
        }
    }
}
