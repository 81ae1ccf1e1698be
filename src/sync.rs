//! Locks that outlive a panic, and each thread's index.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Locks `m`. A poisoned lock means a panic elsewhere while it was held; the
/// data inside is still valid rate-limit state (every update is a single
/// assignment), so carry on with it rather than fail every later request.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// This thread's index: threads take the next one as they first ask, so
/// that up to `n` threads each have their own index modulo `n` (a stripe
/// of batches, a shard lock's reader line).
#[inline]
pub(crate) fn thread_index() -> usize {
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    let index = INDEX.get();
    if index != usize::MAX {
        return index;
    }
    // SeqCst, with `threads_indexed`: a shard lock's writer that counts
    // the threads indexed counts every reader whose line it must look at.
    let index = NEXT.fetch_add(1, Ordering::SeqCst);
    INDEX.set(index);
    index
}

/// How many threads have taken an index so far.
#[inline]
pub(crate) fn threads_indexed() -> usize {
    NEXT.load(Ordering::SeqCst)
}

static NEXT: AtomicUsize = AtomicUsize::new(0);
