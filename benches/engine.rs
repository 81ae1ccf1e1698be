//! One in-memory decision, tollgate beside governor's keyed limiter, in one
//! run: a hot key, a million keys, and several threads on one key.
//!
//! `cargo bench --bench engine` (add `-- --quick` for a fast pass).

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::{Algorithm, Limiter, MemoryBackend, Quota};

#[path = "support/peers.rs"]
mod peers;

const KEYS: usize = 1_000_000;

/// A quota that admits every check (see `peers::admitting`), on a backend
/// with room for the million-key case.
fn tollgate(algorithm: Algorithm) -> Limiter<MemoryBackend> {
    let backend = MemoryBackend::builder().max_keys(4 * KEYS).build();
    Limiter::new(backend, peers::admitting(algorithm))
}

/// The algorithms whose state is fixed-size; the sliding log's cost grows
/// with its limit and is measured with a small one.
fn algorithms() -> Vec<(Algorithm, &'static str)> {
    Algorithm::ALL.iter().map(|a| (*a, a.name())).collect()
}

fn hot_key(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot_key");
    let key = "client-42".to_owned();
    for (algorithm, name) in algorithms() {
        let limiter = tollgate(algorithm);
        g.bench_function(format!("tollgate/{name}"), |b| {
            b.iter(|| black_box(limiter.check_now(black_box(&key), 1)))
        });
    }
    let gov = peers::governor_admitting();
    g.bench_function("governor/gcra", |b| {
        b.iter(|| black_box(gov.check_key(black_box(&key))))
    });
    g.finish();
}

fn many_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("million_keys");
    g.sample_size(30);
    let keys: Vec<String> = (0..KEYS)
        .map(|i| format!("ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    for (algorithm, name) in algorithms() {
        if algorithm == Algorithm::SlidingLog {
            continue;
        }
        let limiter = tollgate(algorithm);
        for k in &keys {
            let _ = limiter.check_now(k, 1);
        }
        let mut i = 0;
        g.bench_function(format!("tollgate/{name}"), |b| {
            b.iter(|| {
                i = (i + 7919) % KEYS;
                black_box(limiter.check_now(&keys[i], 1))
            })
        });
    }
    let gov = peers::governor_admitting();
    for k in &keys {
        let _ = gov.check_key(k);
    }
    let mut i = 0;
    g.bench_function("governor/gcra", |b| {
        b.iter(|| {
            i = (i + 7919) % KEYS;
            black_box(gov.check_key(&keys[i]))
        })
    });
    g.finish();
}

/// The three-quota case on one key (10 a minute, 2 per 3 s, a 1 s
/// minimum interval) beside one GCRA quota and governor: every check after
/// the first refused, by a mix of quotas that changes as the clock runs.
/// Then the same three algorithms with every check admitted, refused by
/// the interval alone (a flood), and refused by all three.
fn three_quotas(c: &mut Criterion) {
    let mut g = c.benchmark_group("three_quotas");
    let set = peers::three_quotas();
    let key = "ip:203.0.113.7".to_owned();
    let three = Limiter::new(MemoryBackend::new(), set);
    g.bench_function("tollgate/three_quotas", |b| {
        b.iter(|| black_box(three.check_now(black_box(&key), 1)))
    });
    let admitted = Limiter::new(MemoryBackend::new(), peers::three_quotas_admitted());
    g.bench_function("tollgate/three_quotas_admitted", |b| {
        b.iter(|| black_box(admitted.check_now(black_box(&key), 1)))
    });
    let flood = Limiter::new(MemoryBackend::new(), peers::three_quotas_flood());
    g.bench_function("tollgate/three_quotas_flood", |b| {
        b.iter(|| black_box(flood.check_now(black_box(&key), 1)))
    });
    let refused = Limiter::new(MemoryBackend::new(), peers::three_quotas_refused());
    g.bench_function("tollgate/three_quotas_refused", |b| {
        b.iter(|| black_box(refused.check_now(black_box(&key), 1)))
    });
    let one = tollgate(Algorithm::Gcra);
    g.bench_function("tollgate/gcra", |b| {
        b.iter(|| black_box(one.check_now(black_box(&key), 1)))
    });
    let gov = peers::governor_admitting();
    g.bench_function("governor/gcra", |b| {
        b.iter(|| black_box(gov.check_key(black_box(&key))))
    });
    g.finish();
}

/// A flood of keys never seen before into a full backend: every check
/// evicts one state (the DoS case the key bound exists for).
fn new_keys_into_full(c: &mut Criterion) {
    let mut g = c.benchmark_group("new_keys_full_backend");
    let quota = Quota::gcra(10, Duration::from_secs(3600))
        .build()
        .expect("quota");
    let limiter = Limiter::new(MemoryBackend::builder().max_keys(100_000).build(), quota);
    for i in 0..100_000 {
        let _ = limiter.check_now(&format!("old-{i}"), 1);
    }
    let mut i = 0u64;
    g.bench_function("tollgate/gcra", |b| {
        b.iter_batched(
            || {
                i += 1;
                format!("new-{i}")
            },
            |key| black_box(limiter.check_now(&key, 1)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// `iters` checks split over `threads` threads hammering one key.
fn contended(threads: usize, iters: u64, check: Arc<dyn Fn() + Send + Sync>) -> Duration {
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (barrier, check) = (Arc::clone(&barrier), Arc::clone(&check));
            std::thread::spawn(move || {
                barrier.wait();
                for _ in 0..iters / threads as u64 {
                    check();
                }
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    for h in handles {
        h.join().expect("bench thread");
    }
    start.elapsed()
}

fn threads_on_one_key(c: &mut Criterion) {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .max(2);
    let mut g = c.benchmark_group(format!("one_key_{threads}_threads"));
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
    ] {
        let limiter = Arc::new(tollgate(algorithm));
        g.bench_function(format!("tollgate/{}", algorithm.name()), |b| {
            b.iter_custom(|iters| {
                let l = Arc::clone(&limiter);
                contended(
                    threads,
                    iters,
                    Arc::new(move || {
                        black_box(l.check_now("hot", 1));
                    }),
                )
            })
        });
    }
    let gov = Arc::new(peers::governor_admitting());
    let key = "hot".to_owned();
    g.bench_function("governor/gcra", |b| {
        b.iter_custom(|iters| {
            let (g, k) = (Arc::clone(&gov), key.clone());
            contended(
                threads,
                iters,
                Arc::new(move || {
                    black_box(g.check_key(&k)).ok();
                }),
            )
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = hot_key, three_quotas, many_keys, threads_on_one_key, new_keys_into_full
}
criterion_main!(benches);
