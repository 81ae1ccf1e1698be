//! A shard's lock: readers in and out by one atomic add each, writers
//! through a standard lock.
//!
//! Every check of a key takes its shard's lock to read, so a key that every
//! core checks makes the lock's word as hot as the key's own entry. The
//! standard read lock reads that word, then swaps in one more reader, and
//! swaps again whenever another reader came or went meanwhile: on a hot
//! shard, several trips of the word between cores per check. Here a reader
//! adds itself and takes itself away, one trip each, and never retries.
//! A writer takes a standard `RwLock<()>` (which orders writers and parks
//! whoever waits), raises the word's writer bit, and waits for the readers
//! already in, whose hold is a lookup and a compare-and-swap; a reader that
//! finds the bit up steps back and waits on the standard lock to read. This
//! speed-up is hand-written synchronisation: it buys a hot key's scaling
//! (see BENCHMARKS.md, "In memory: many cores"), and its test races
//! readers and writers on one shard.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The word's bit for a writer holding the data or waiting for the
/// readers in it; the bits below count those readers.
const WRITER: u32 = 1 << 31;

/// Spins of a writer waiting for the readers in before it yields its
/// thread instead.
const SPINS: u32 = 64;

pub(crate) struct ShardLock<T> {
    /// Readers in by the fast way, and [`WRITER`].
    word: AtomicU32,
    /// Held to write, and to read by a reader that found [`WRITER`] up.
    slow: RwLock<()>,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through the guards, which give shared
// access to readers together and exclusive access to one writer, as
// `std::sync::RwLock` does, with the same bounds.
unsafe impl<T: Send> Send for ShardLock<T> {}
unsafe impl<T: Send + Sync> Sync for ShardLock<T> {}

/// Shared access to the data.
pub(crate) struct ReadGuard<'a, T> {
    lock: &'a ShardLock<T>,
    /// The standard lock's guard of a reader that found a writer; `None`
    /// for a reader counted in the word.
    slow: Option<RwLockReadGuard<'a, ()>>,
}

/// Exclusive access to the data.
pub(crate) struct WriteGuard<'a, T> {
    lock: &'a ShardLock<T>,
    // Dropped after `Drop::drop` lowers the writer bit: the next writer
    // finds the word clear.
    _slow: RwLockWriteGuard<'a, ()>,
}

impl<T> ShardLock<T> {
    pub(crate) fn new(data: T) -> Self {
        ShardLock {
            word: AtomicU32::new(0),
            slow: RwLock::new(()),
            data: UnsafeCell::new(data),
        }
    }

    /// Locks to read. A panic elsewhere while the lock was held leaves
    /// valid data (see `crate::sync`): no poisoning.
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        // Acquire: a writer's changes, released when it lowered the bit,
        // are seen by every reader that finds the bit down.
        if self.word.fetch_add(1, Ordering::Acquire) & WRITER == 0 {
            return ReadGuard {
                lock: self,
                slow: None,
            };
        }
        self.read_slow()
    }

    #[cold]
    #[inline(never)]
    fn read_slow(&self) -> ReadGuard<'_, T> {
        self.word.fetch_sub(1, Ordering::Release);
        let slow = self.slow.read().unwrap_or_else(PoisonError::into_inner);
        ReadGuard {
            lock: self,
            slow: Some(slow),
        }
    }

    /// Locks to write: waits for the writer before it, and for the
    /// readers in.
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        let slow = self.slow.write().unwrap_or_else(PoisonError::into_inner);
        // From here on, readers go the slow way, which `slow` holds shut;
        // those already in leave after their lookup. Acquire: what they
        // read happens before what this writes.
        let mut inside = self.word.fetch_or(WRITER, Ordering::Acquire) & !WRITER;
        let mut spins = 0;
        while inside != 0 {
            if spins < SPINS {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
            inside = self.word.load(Ordering::Acquire) & !WRITER;
        }
        WriteGuard {
            lock: self,
            _slow: slow,
        }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if self.slow.is_none() {
            self.lock.word.fetch_sub(1, Ordering::Release);
        }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.word.fetch_and(!WRITER, Ordering::Release);
    }
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: a reader is in (counted in the word while the writer bit
        // was down, or holding the standard lock to read), so no writer is.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: this writer alone is in (see `DerefMut`).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the standard lock is held to write, so no other writer
        // and no slow reader is in, and the word counted no fast reader
        // once the writer bit was up, and admits none while it is.
        unsafe { &mut *self.lock.data.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::ShardLock;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Readers never see a writer's change half made, and no write is
    /// lost, with readers and writers racing on one lock.
    #[test]
    fn readers_never_see_a_write_half_made_and_no_write_is_lost() {
        let lock = Arc::new(ShardLock::new((0u64, 0u64)));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (lock, stop) = (lock.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let guard = lock.read();
                        let (a, b) = *guard;
                        assert_eq!(a, b, "a write seen half made");
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut guard = lock.write();
                        guard.0 += 1;
                        std::hint::black_box(&mut *guard);
                        guard.1 += 1;
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert_eq!(*lock.read(), (60_000, 60_000));
        assert!(reads > 0);
        // Every guard gave its place back.
        assert_eq!(lock.word.load(Ordering::Relaxed), 0);
    }

    /// A writer waits for the reader already in; a reader that comes while
    /// the writer waits goes the slow way and reads what the writer wrote.
    #[test]
    fn a_writer_waits_for_readers_in_and_later_readers_wait_for_it() {
        let lock = Arc::new(ShardLock::new(0u64));
        let first = lock.read();
        let writer = {
            let lock = lock.clone();
            std::thread::spawn(move || *lock.write() = 1)
        };
        // The writer raises its bit, then waits for `first`.
        while lock.word.load(Ordering::Acquire) & super::WRITER == 0 {
            std::thread::yield_now();
        }
        let later = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                let guard = lock.read();
                assert!(
                    guard.slow.is_some(),
                    "a reader past the bit reads the slow way"
                );
                *guard
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!writer.is_finished(), "the writer waited for the reader in");
        assert_eq!(*first, 0);
        drop(first);
        writer.join().unwrap();
        assert_eq!(later.join().unwrap(), 1, "the later reader saw the write");
        assert_eq!(lock.word.load(Ordering::Relaxed), 0);
    }
}
