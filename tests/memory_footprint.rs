//! Bytes per key of `MemoryBackend`, counted by a wrapping allocator. The
//! figures are printed (run with `--nocapture`) and quoted in the docs; the
//! assertion only guards against a regression well past them.

use std::alloc::{GlobalAlloc, Layout, System};
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
        let before = LIVE.load(Ordering::Relaxed);
        let backend = MemoryBackend::new();
        let limiter = Limiter::new(backend.clone(), quota);
        rt.block_on(async {
            for k in &keys {
                limiter.check(k, 1).await.unwrap();
            }
        });
        let used = LIVE.load(Ordering::Relaxed) - before;
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
