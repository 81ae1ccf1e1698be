//! Bytes per key at a million keys, for each algorithm of `MemoryBackend`
//! and for governor's keyed limiter, counted by a wrapping allocator.
//!
//! `cargo bench --bench memory`

use std::num::NonZeroU32;
use std::time::Duration;

use tollgate::{Algorithm, Limiter, MemoryBackend, Quota};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

const KEYS: usize = 1_000_000;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let keys: Vec<String> = (0..KEYS).map(|i| format!("{i:08}")).collect();
    let key_bytes = 8.0;
    println!("| limiter | bytes per key, all in | without the 8 key bytes |");
    println!("|---|---:|---:|");
    for algorithm in Algorithm::ALL {
        let quota = Quota::builder(algorithm, 10, Duration::from_secs(60))
            .build()
            .expect("quota");
        let before = counting_alloc::live_bytes();
        let backend = MemoryBackend::builder().max_keys(2 * KEYS).build();
        let limiter = Limiter::new(backend.clone(), quota);
        for k in &keys {
            let _ = limiter.check_now(k, 1);
        }
        let per_key = (counting_alloc::live_bytes() - before) as f64 / KEYS as f64;
        println!(
            "| tollgate {algorithm} | {per_key:.1} | {:.1} |",
            per_key - key_bytes
        );
        assert_eq!(backend.len(), KEYS);
    }
    let before = counting_alloc::live_bytes();
    let gov: governor::DefaultKeyedRateLimiter<String> = governor::RateLimiter::keyed(
        governor::Quota::per_minute(NonZeroU32::new(10).expect("non-zero")),
    );
    for k in &keys {
        let _ = gov.check_key(k);
    }
    let per_key = (counting_alloc::live_bytes() - before) as f64 / KEYS as f64;
    println!(
        "| governor (keyed, String keys) | {per_key:.1} | {:.1} |",
        per_key - key_bytes
    );
}
