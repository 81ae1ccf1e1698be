//! Bytes per key at a million keys, for each algorithm of `MemoryBackend`
//! and for governor's keyed limiter, counted by a wrapping allocator (bytes
//! requested, key bytes included), with two kinds of key: IP keys
//! (`ip:10.1.2.3`, 11 to 15 bytes) and 64-byte API keys. The backend is
//! filled to its bound (`max_keys` = the number of keys; bytes are divided by the keys
//! actually stored, 99.7% of them, since each shard holds its exact share).
//!
//! `cargo bench --bench memory`

use std::num::NonZeroU32;
use std::time::Duration;

use tollgate::{Algorithm, Limiter, MemoryBackend, Quota};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

const KEYS: usize = 1_000_000;

fn ip_keys() -> Vec<String> {
    (0..KEYS)
        .map(|i| format!("ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect()
}

fn api_keys() -> Vec<String> {
    (0..KEYS).map(|i| format!("key:{i:060}")).collect()
}

/// Bytes requested per stored key by `fill` (which checks every key once
/// and says how many keys it holds), net of what was allocated before.
fn per_key(fill: impl FnOnce() -> usize) -> f64 {
    let before = counting_alloc::live_bytes();
    let stored = fill();
    (counting_alloc::live_bytes() - before) as f64 / stored as f64
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    println!("| limiter | keys | bytes per key | tollgate / governor |");
    println!("|---|---|---:|---:|");
    for (kind, keys) in [("IP", ip_keys()), ("64-byte", api_keys())] {
        let mut limiter_held = Vec::new();
        let gov = per_key(|| {
            let gov: governor::DefaultKeyedRateLimiter<String> = governor::RateLimiter::keyed(
                governor::Quota::per_minute(NonZeroU32::new(10).expect("non-zero")),
            );
            for k in &keys {
                let _ = gov.check_key(k);
            }
            let stored = gov.len();
            limiter_held.push(Box::new(gov) as Box<dyn std::any::Any>);
            stored
        });
        println!("| governor (keyed, `String` keys) | {kind} | {gov:.1} | |");
        drop(limiter_held);
        for algorithm in Algorithm::ALL {
            let quota = Quota::builder(algorithm, 10, Duration::from_secs(60))
                .build()
                .expect("quota");
            let mut held = None;
            let bytes = per_key(|| {
                let backend = MemoryBackend::builder().max_keys(KEYS).build();
                let limiter = Limiter::new(backend.clone(), quota);
                for k in &keys {
                    let _ = limiter.check_now(k, 1);
                }
                // Each shard holds its share of the bound exactly, and keys
                // do not spread exactly evenly, so a few are evicted.
                let stored = backend.len();
                assert!(stored > KEYS * 99 / 100, "{stored} keys stored");
                held = Some(limiter);
                stored
            });
            println!(
                "| tollgate {algorithm} | {kind} | {bytes:.1} | {:.2}x |",
                bytes / gov
            );
            drop(held);
        }
    }
}
