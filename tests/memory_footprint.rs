//! Bytes per key of `MemoryBackend`, counted by a wrapping allocator. The
//! figures are printed (run with `--nocapture`) and quoted in the docs; the
//! assertion only guards against a regression well past them.

use std::time::Duration;

use tollgate::{Algorithm, Limiter, MemoryBackend, Quota};

// Its own test binary, alone, on purpose: the counting allocator is the
// `#[global_allocator]` of the whole binary, so tests running beside it on
// other threads would add their bytes to the count.
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

const KEYS: usize = 100_000;

#[test]
fn bytes_per_key() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // The keys are made up front so only the backend's bytes are counted.
    let keys: Vec<String> = (0..KEYS).map(|i| format!("{i:08}")).collect();
    for algorithm in Algorithm::ALL {
        let quota = Quota::builder(algorithm, 10, Duration::from_secs(60))
            .build()
            .unwrap();
        let before = counting_alloc::live_bytes();
        let backend = MemoryBackend::new();
        let limiter = Limiter::new(backend.clone(), quota);
        rt.block_on(async {
            for k in &keys {
                limiter.check(k, 1).await.unwrap();
            }
        });
        let used = counting_alloc::live_bytes() - before;
        let per_key = used as f64 / KEYS as f64;
        println!("{algorithm:>15}: {per_key:6.1} bytes per key (8-byte keys, {KEYS} keys)");
        assert_eq!(backend.len(), KEYS);
        let bound = if algorithm == Algorithm::SlidingLog {
            200.0
        } else {
            120.0
        };
        assert!(per_key < bound, "{algorithm}: {per_key} bytes per key");
        drop(limiter);
        drop(backend);
    }
}
