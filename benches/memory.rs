//! Bytes per key at a million keys, for each algorithm of `MemoryBackend`
//! and for governor's keyed limiter, counted by a wrapping allocator.
//!
//! `cargo bench --bench memory`

use std::alloc::{GlobalAlloc, Layout, System};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use tollgate::{Algorithm, Limiter, MemoryBackend, Quota};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
        let before = LIVE.load(Ordering::Relaxed);
        let backend = MemoryBackend::builder().max_keys(2 * KEYS).build();
        let limiter = Limiter::new(backend.clone(), quota);
        for k in &keys {
            let _ = limiter.check_now(k, 1);
        }
        let per_key = (LIVE.load(Ordering::Relaxed) - before) as f64 / KEYS as f64;
        println!(
            "| tollgate {algorithm} | {per_key:.1} | {:.1} |",
            per_key - key_bytes
        );
        assert_eq!(backend.len(), KEYS);
    }
    let before = LIVE.load(Ordering::Relaxed);
    let gov: governor::DefaultKeyedRateLimiter<String> = governor::RateLimiter::keyed(
        governor::Quota::per_minute(NonZeroU32::new(10).expect("non-zero")),
    );
    for k in &keys {
        let _ = gov.check_key(k);
    }
    let per_key = (LIVE.load(Ordering::Relaxed) - before) as f64 / KEYS as f64;
    println!(
        "| governor (keyed, String keys) | {per_key:.1} | {:.1} |",
        per_key - key_bytes
    );
}
