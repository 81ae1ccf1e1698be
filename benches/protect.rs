//! What protecting the server costs per request: a rate quota alone, with a
//! concurrency quota beside it, and with the load measured and shedding on;
//! tower's own (unkeyed) `ConcurrencyLimit` as the peer.
//!
//! `cargo bench --bench protect`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::key::PeerIp;
use tollgate::layer::{ConcurrencyQuota, MeasuredLoad, Shedding};
use tollgate::{Limiter, MemoryBackend, Quota, RateLimitLayer, RateLimitLayerBuilder};
use tower::limit::ConcurrencyLimitLayer;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

#[path = "support/mod.rs"]
mod support;
use support::{hello, request};

fn builder() -> RateLimitLayerBuilder<MemoryBackend, PeerIp> {
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(1_000_000)
        .build()
        .expect("quota");
    RateLimitLayer::builder(Limiter::new(MemoryBackend::new(), quota), PeerIp::new())
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut g = c.benchmark_group("protect");
    // The response (and with it the slot) is dropped inside each iteration.
    macro_rules! case {
        ($name:expr, $svc:expr) => {{
            let mut svc = $svc;
            g.bench_function($name, |b| {
                b.iter(|| {
                    rt.block_on(async {
                        black_box(svc.ready().await.expect("ready").call(request()).await)
                    })
                })
            });
        }};
    }
    case!("bare", ServiceBuilder::new().service(service_fn(hello)));
    case!(
        "tower-concurrency-limit",
        ServiceBuilder::new()
            .layer(ConcurrencyLimitLayer::new(64))
            .service(service_fn(hello))
    );
    case!(
        "rate",
        ServiceBuilder::new()
            .layer(builder().build())
            .service(service_fn(hello))
    );
    let concurrency = || ConcurrencyQuota::new(64).expect("quota");
    case!(
        "rate+concurrency",
        ServiceBuilder::new()
            .layer(builder().concurrency(concurrency()).build())
            .service(service_fn(hello))
    );
    case!(
        "rate+concurrency+shedding",
        ServiceBuilder::new()
            .layer(
                builder()
                    .concurrency(concurrency())
                    .measure_load(MeasuredLoad::new(1024, Duration::from_secs(1)))
                    .shed(Shedding::new())
                    .build()
            )
            .service(service_fn(hello))
    );
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
