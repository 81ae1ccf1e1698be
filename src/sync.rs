//! Locks that outlive a panic, and each thread's index.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Locks `m`. A poisoned lock means a panic elsewhere while it was held; the
/// data inside is still valid rate-limit state (every update is a single
/// assignment), so carry on with it rather than fail every later request.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// This thread's index: the lowest index no live thread holds, taken as
/// the thread first asks and given back as it ends, so that `n` threads
/// each have their own index modulo `n` (a stripe of batches), and the
/// indices in use stay below the most threads alive at once (a shard
/// lock's reader lines). [`GONE`] for a thread that asks while its
/// thread-locals are being torn down.
#[inline]
pub(crate) fn thread_index() -> usize {
    let index = INDEX.get();
    if index != UNSET {
        return index;
    }
    take_index()
}

/// The index of a thread whose index was given back, or could not be
/// taken, as its thread-locals are torn down.
pub(crate) const GONE: usize = usize::MAX - 1;
const UNSET: usize = usize::MAX;

/// One more than the highest index ever taken: the most threads that held
/// an index at once, so far.
#[inline]
pub(crate) fn index_bound() -> usize {
    BOUND.load(Ordering::SeqCst)
}

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(UNSET) };
    static HELD: Held = const { Held };
}

/// Indices given back, and the next never taken.
static INDICES: Mutex<(BTreeSet<usize>, usize)> = Mutex::new((BTreeSet::new(), 0));
static BOUND: AtomicUsize = AtomicUsize::new(0);

#[cold]
fn take_index() -> usize {
    // Registers the destructor that gives the index back; a thread being
    // torn down can register none, and takes no index.
    if HELD.try_with(|_| ()).is_err() {
        INDEX.set(GONE);
        return GONE;
    }
    let mut indices = lock(&INDICES);
    let index = match indices.0.pop_first() {
        Some(index) => index,
        None => {
            indices.1 += 1;
            // SeqCst, with `index_bound`: a shard lock's writer that reads
            // the bound looks at the line of every reader it must wait for.
            BOUND.store(indices.1, Ordering::SeqCst);
            indices.1 - 1
        }
    };
    INDEX.set(index);
    index
}

/// Gives the thread's index back when the thread ends.
struct Held;

/// Gives this thread's index back now, as its end does.
#[cfg(test)]
pub(crate) fn give_index_back() {
    drop(Held);
}

impl Drop for Held {
    fn drop(&mut self) {
        let index = INDEX.replace(GONE);
        if index < GONE {
            lock(&INDICES).0.insert(index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{GONE, give_index_back, index_bound, thread_index};

    /// Threads that end give their index back: threads one after another
    /// do not raise the bound by one each.
    #[test]
    fn an_ended_threads_index_is_taken_again() {
        let before = index_bound();
        for _ in 0..200 {
            std::thread::spawn(thread_index).join().unwrap();
        }
        // Other tests' threads alive meanwhile may raise it, by far less.
        assert!(
            index_bound() < before + 200,
            "{before} -> {}",
            index_bound()
        );
    }

    /// A thread that asks once its index was given back (a thread-local
    /// torn down after the one that gives it back) gets `GONE`, and keeps
    /// it.
    #[test]
    fn a_thread_asking_after_its_index_was_given_back_gets_gone() {
        std::thread::spawn(|| {
            assert!(thread_index() < GONE);
            give_index_back();
            assert_eq!(thread_index(), GONE);
            assert_eq!(thread_index(), GONE);
        })
        .join()
        .unwrap();
    }
}
