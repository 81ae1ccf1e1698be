//! What protecting the server costs per request: a rate quota alone, with a
//! concurrency quota beside it, and with the load measured and shedding on;
//! an elastic rate quota with room and without; tower's own (unkeyed)
//! `ConcurrencyLimit` as the peer.
//!
//! `cargo bench --bench protect`, or for instruction counts, a fixed number
//! of requests per case without criterion:
//! `PROTECT_LOOP=<requests> valgrind --tool=callgrind target/release/deps/protect-* <case>`
//! (also `limiter-rate`, `limiter-elastic-room`, `limiter-elastic-no-room`:
//! the limiter alone on a stopped clock).

use std::convert::Infallible;
use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use http::Request;
use tollgate::key::PeerIp;
use tollgate::layer::RateLimitLayerBuilder;
use tollgate::layer::{ConcurrencyQuota, MeasuredLoad, Shedding};
use tollgate::{Limiter, ManualClock, MemoryBackend, Mode, Quota, RateLimitLayer, Timestamp};
use tower::limit::ConcurrencyLimitLayer;
use tower::util::BoxService;
use tower::{Layer, Service, ServiceExt, service_fn};

#[path = "support/mod.rs"]
mod support;
use support::{hello, request};

type Svc = BoxService<Request<()>, (), Infallible>;

fn builder() -> RateLimitLayerBuilder<MemoryBackend, PeerIp> {
    builder_in(Mode::Enforce)
}

fn builder_in(mode: Mode) -> RateLimitLayerBuilder<MemoryBackend, PeerIp> {
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(1_000_000)
        .mode(mode)
        .build()
        .expect("quota");
    RateLimitLayer::builder(Limiter::new(MemoryBackend::new(), quota), PeerIp::new())
}

/// The service behind `layer`, its response (and with it any slot) dropped
/// as soon as it is ready.
fn behind<L>(layer: L) -> Svc
where
    L: Layer<tower::util::ServiceFn<fn(Request<()>) -> support::Hello>>,
    L::Service: Service<Request<()>, Error = Infallible> + Send + 'static,
    <L::Service as Service<Request<()>>>::Future: Send + 'static,
{
    BoxService::new(
        layer
            .layer(service_fn(hello as fn(_) -> _))
            .map_response(drop),
    )
}

fn cases() -> Vec<(&'static str, Svc)> {
    let concurrency = || ConcurrencyQuota::new(64).expect("quota");
    let load = || MeasuredLoad::new(1024, Duration::from_secs(1));
    let elastic = || builder_in(Mode::Elastic { percent: 100 });
    vec![
        ("bare", behind(tower::layer::util::Identity::new())),
        (
            "tower-concurrency-limit",
            behind(ConcurrencyLimitLayer::new(64)),
        ),
        ("rate", behind(builder().build())),
        // Elastic rate quotas with the load measured: with room (idle), and
        // without (a signal stuck at 1).
        // No signal: never room, so every admission is checked twice.
        ("rate-elastic", behind(elastic().build())),
        ("rate+load", behind(builder().measure_load(load()).build())),
        (
            "rate-elastic+load",
            behind(elastic().measure_load(load()).build()),
        ),
        (
            "rate-elastic+load-no-room",
            behind(elastic().measure_load(load()).load_signal(|| 1.0).build()),
        ),
        (
            "rate+concurrency",
            behind(builder().concurrency(concurrency()).build()),
        ),
        (
            "rate+concurrency+shedding",
            behind(
                builder()
                    .concurrency(concurrency())
                    .measure_load(MeasuredLoad::new(1024, Duration::from_secs(1)))
                    .shed(Shedding::new())
                    .build(),
            ),
        ),
    ]
}

/// The limiter cases, without the layer (whose clock reads and runtime
/// make a few hundred instructions of noise per request): a plain quota
/// (`None`), an elastic one with room and without.
fn limiter_case(name: &str) -> Option<Option<bool>> {
    match name {
        "limiter-rate" => Some(None),
        "limiter-elastic-room" => Some(Some(true)),
        "limiter-elastic-no-room" => Some(Some(false)),
        _ => None,
    }
}

/// `n` checks of one key on a stopped clock, each admitted.
fn limiter_loop(n: u64, elastic: Option<bool>) {
    let mode = match elastic {
        Some(_) => Mode::Elastic { percent: 100 },
        None => Mode::Enforce,
    };
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(1_000_000)
        .mode(mode)
        .build()
        .expect("quota");
    let clock = ManualClock::new(Timestamp::from_secs(1_800_000_000));
    let backend = MemoryBackend::builder().clock(clock).build();
    let limiter = Limiter::new(backend, quota);
    let room = elastic.unwrap_or(false);
    for _ in 0..n {
        let decision = limiter.with_room(room).check_now("k", 1);
        assert!(black_box(decision).is_some_and(|d| d.is_ok_and(|d| d.allowed())));
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let call = |svc: &mut Svc| {
        rt.block_on(async { black_box(svc.ready().await.expect("ready").call(request()).await) })
    };
    if let Ok(n) = std::env::var("PROTECT_LOOP") {
        let n: u64 = n.parse().expect("PROTECT_LOOP: a number of requests");
        let wanted = std::env::args().nth(1).unwrap_or_default();
        if let Some(room) = limiter_case(&wanted) {
            limiter_loop(n, room);
            return;
        }
        for (name, mut svc) in cases() {
            if name == wanted {
                for _ in 0..n {
                    let _ = call(&mut svc);
                }
            }
        }
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut g = c.benchmark_group("protect");
    for (name, mut svc) in cases() {
        g.bench_function(name, |b| b.iter(|| call(&mut svc)));
    }
    g.finish();
    c.final_summary();
}
