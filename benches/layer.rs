//! The cost of the layer on one request, through `oneshot`-style calls on a
//! ready service: bare, behind tollgate (memory; IETF, legacy or no
//! headers) and behind tower_governor (its headers on), and the allocations
//! each layer adds to a request.
//!
//! `cargo bench --bench layer`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::key::PeerIp;
use tollgate::{HeaderStyle, Limiter, MemoryBackend, Quota, RateLimitLayer};
use tower::util::BoxCloneService;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

#[path = "support/peers.rs"]
mod peers;
#[path = "support/mod.rs"]
mod support;
use support::{hello, request};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A burst no run spends, as for tower_governor: every request admitted.
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(peers::NEVER_SPENT)
        .build()
        .expect("quota");
    let mut g = c.benchmark_group("layer");
    let mut bare = ServiceBuilder::new().service(service_fn(hello));
    let styles = [
        ("ietf", HeaderStyle::Ietf),
        ("legacy", HeaderStyle::Legacy),
        ("none", HeaderStyle::None),
    ];
    g.bench_function("bare", |b| {
        b.iter(|| {
            rt.block_on(async {
                black_box(bare.ready().await.expect("ready").call(request()).await)
            })
        })
    });
    for (name, style) in styles {
        let limiter = Limiter::new(MemoryBackend::new(), quota.clone());
        let layer = RateLimitLayer::builder(limiter, PeerIp::new())
            .header_style(style)
            .build();
        let mut svc = ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(hello));
        g.bench_function(format!("tollgate/{name}"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    black_box(svc.ready().await.expect("ready").call(request()).await)
                })
            })
        });
        let allocs = allocations(&rt, &mut svc) - allocations(&rt, &mut bare);
        println!("allocations per request added by tollgate, {name} headers: {allocs:.1}");
    }
    let mut governed = ServiceBuilder::new()
        .layer(peers::governor_layer())
        .service(service_fn(hello));
    g.bench_function("tower_governor/headers", |b| {
        b.iter(|| {
            rt.block_on(async {
                black_box(governed.ready().await.expect("ready").call(request()).await)
            })
        })
    });
    let allocs = allocations(&rt, &mut governed) - allocations(&rt, &mut bare);
    println!("allocations per request added by tower_governor, headers on: {allocs:.1}");
    g.finish();
    // Over a boxed service with state (a route of an axum app with state, a
    // tonic client): cloning it allocates.
    let state: std::sync::Arc<str> = "state".into();
    let boxed = || {
        let state = state.clone();
        BoxCloneService::new(service_fn(move |r| {
            black_box(&state);
            hello(r)
        }))
    };
    let mut bare = boxed();
    let limiter = Limiter::new(MemoryBackend::new(), quota.clone());
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter, PeerIp::new()))
        .service(boxed());
    let allocs = allocations(&rt, &mut svc) - allocations(&rt, &mut bare);
    println!(
        "allocations per request added by tollgate over a boxed service with state, ietf headers: {allocs:.1}"
    );
    let mut governed = ServiceBuilder::new()
        .layer(peers::governor_layer())
        .service(boxed());
    let allocs = allocations(&rt, &mut governed) - allocations(&rt, &mut bare);
    println!(
        "allocations per request added by tower_governor over a boxed service with state, headers on: {allocs:.1}"
    );
}

/// Heap allocations per request through `svc`, the request's own included.
fn allocations<S>(rt: &tokio::runtime::Runtime, svc: &mut S) -> f64
where
    S: Service<http::Request<()>>,
    S::Error: std::fmt::Debug,
{
    let before = counting_alloc::allocations();
    for _ in 0..1000 {
        rt.block_on(async {
            let _ = svc.ready().await.expect("ready").call(request()).await;
        });
    }
    (counting_alloc::allocations() - before) as f64 / 1000.0
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
