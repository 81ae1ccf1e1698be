//! The cost of the layer on one request, through `oneshot`-style calls on a
//! ready service: bare, behind tollgate (memory, IETF headers), and the
//! allocations each request makes.
//!
//! `cargo bench --bench layer`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::key::PeerIp;
use tollgate::{HeaderStyle, Limiter, MemoryBackend, Quota, RateLimitLayer};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

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
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(1_000_000)
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
        // Allocations per request, beyond the request itself and the bare service.
        let count = |svc: &mut dyn FnMut()| {
            let before = counting_alloc::allocations();
            for _ in 0..1000 {
                svc();
            }
            (counting_alloc::allocations() - before) as f64 / 1000.0
        };
        let bare_allocs = count(&mut || {
            rt.block_on(async {
                let _ = bare.ready().await.expect("ready").call(request()).await;
            })
        });
        let allocs = count(&mut || {
            rt.block_on(async {
                let _ = svc.ready().await.expect("ready").call(request()).await;
            })
        });
        println!(
            "allocations per request, {name} headers: {:.1} (bare: {bare_allocs:.1})",
            allocs - bare_allocs
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
