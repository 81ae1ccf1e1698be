//! What path normalisation adds to each request the rules see: a path
//! already in normal form (the common case: scanned, not copied) beside one
//! that must be rewritten.
//!
//! `cargo bench --bench rules --features rules` (add `-- --quick` for a fast pass).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::rules::normalize_path;

fn normalise(c: &mut Criterion) {
    let mut g = c.benchmark_group("normalize_path");
    for (name, path) in [
        ("normal", "/api/v1/users/42/orders"),
        ("rewritten", "//api/./v1/%75sers/x/../42/orders/"),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| normalize_path(black_box(path)).map(|p| p.len()))
        });
    }
    g.finish();
}

criterion_group!(benches, normalise);
criterion_main!(benches);
