//! A shard's lock: a reader marks a line of its own, writers go through
//! a standard lock.
//!
//! Every check of a key takes its shard's lock to read, so a key that every
//! core checks would make a shared reader count as hot as the key's own
//! entry: two trips of that word between cores per check. Here a reader
//! writes the lock's address into its thread's line (one per thread index
//! below [`LINES`], each on a cache line of its own, shared by every lock),
//! reads the lock's word to see that no writer is in, and clears its line
//! when done: it writes no line that another core writes. A reader without
//! a line, or whose line is taken (a second lock held), counts itself in
//! the word instead.
//!
//! A writer takes a standard `RwLock<()>` (which orders writers and parks
//! whoever waits), raises the word's writer bit, and waits for the readers
//! already in: those counted in the word, and those whose line holds this
//! lock. It looks at the lines below the thread index bound (threads give
//! their index back as they end, so the bound is the most threads alive at
//! once). A reader that finds the bit up steps back, waits on the standard
//! lock, then counts itself in the word. The line's swap, the bound, the
//! word's bit and the writer's look at the lines are sequentially
//! consistent, so either the reader sees the bit or the writer sees the
//! line.
//!
//! Looking at every thread's line costs a writer a cache miss for each
//! thread that read since, which a shard written as often as it is read
//! (a quota set's checks write) pays on every write. So a writer also
//! raises [`COUNTED`], which it lowers not: while it is up, readers count
//! themselves in the word, as a standard lock's do, and the next writer,
//! finding it up, knows that no line holds the lock and looks at none.
//! Every [`REBIAS`]th read a thread makes counted lowers it again, so a
//! shard read far more often than written goes back to the lines within a
//! few hundred reads, and one written often pays one look at the lines
//! per that many reads.
//!
//! This speed-up is hand-written synchronisation: it buys a hot key's
//! scaling (see BENCHMARKS.md, "In memory: many cores"), and its tests race
//! readers and writers on one shard, through lines and through the word.

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockWriteGuard};

use crate::sync::{index_bound, thread_index};

/// The word's bit for a writer holding the data or waiting for the
/// readers in it.
const WRITER: u32 = 1 << 31;
/// The word's bit that sends readers to count themselves in the word (see
/// the module's docs): no line holds the lock while it is up.
const COUNTED: u32 = 1 << 30;
/// The bits below count the readers counted in the word.
const READERS: u32 = COUNTED - 1;

/// Reads a thread makes counted between two that lower [`COUNTED`].
const REBIAS: u8 = u8::MAX;

/// Reader lines, one per thread index below this: threads of higher
/// indices count themselves in the word.
const LINES: usize = 32;

/// Spins of a writer waiting for the readers in before it yields its
/// thread instead.
const SPINS: u32 = 64;

/// Keeps what it holds on cache lines of its own.
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

/// Each line holds the address of the lock its thread reads now, or 0.
static LINES_READING: [Padded<AtomicUsize>; LINES] = [const { Padded(AtomicUsize::new(0)) }; LINES];

thread_local! {
    /// Reads this thread made counted since it last lowered [`COUNTED`].
    static COUNTED_READS: Cell<u8> = const { Cell::new(0) };
}

pub(crate) struct ShardLock<T> {
    /// Readers counted here, [`COUNTED`] and [`WRITER`].
    word: AtomicU32,
    /// Held to write, and to read by a reader waiting for a writer.
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
    /// The line that holds the lock's address, or `None` for a reader
    /// counted in the word.
    line: Option<&'static AtomicUsize>,
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

    /// What a line holds while its thread reads this lock.
    #[inline]
    fn address(&self) -> usize {
        std::ptr::from_ref(self).addr()
    }

    /// Locks to read. A panic elsewhere while the lock was held leaves
    /// valid data (see `crate::sync`): no poisoning.
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let index = thread_index();
        if index < LINES {
            let line = &LINES_READING[index].0;
            if line
                .compare_exchange(0, self.address(), Ordering::SeqCst, Ordering::Relaxed)
                .is_err()
            {
                return self.read_counted();
            }
            // SeqCst: see the module's docs. A writer's changes, released
            // when it lowered the bit, are seen by a reader that finds it
            // down.
            let word = self.word.load(Ordering::SeqCst);
            if word & (WRITER | COUNTED) == 0 {
                return ReadGuard {
                    lock: self,
                    line: Some(line),
                };
            }
            line.store(0, Ordering::Release);
            if word & WRITER != 0 {
                return self.read_slow();
            }
        }
        self.read_counted()
    }

    /// A reader without a line of its own, whose line is taken, or sent
    /// to the word by [`COUNTED`]: counted in the word. Every [`REBIAS`]th
    /// lowers [`COUNTED`], in the lock it reads.
    #[inline(never)]
    fn read_counted(&self) -> ReadGuard<'_, T> {
        let word = self.word.fetch_add(1, Ordering::SeqCst);
        if word & WRITER != 0 {
            self.word.fetch_sub(1, Ordering::Release);
            return self.read_slow();
        }
        if word & COUNTED != 0 {
            let reads = COUNTED_READS.get() + 1;
            if reads == REBIAS {
                COUNTED_READS.set(0);
                // No writer is in while this reader is: the next one finds
                // the bit down and looks at the lines.
                self.word.fetch_and(!COUNTED, Ordering::Relaxed);
            } else {
                COUNTED_READS.set(reads);
            }
        }
        ReadGuard {
            lock: self,
            line: None,
        }
    }

    /// A reader that found a writer in: waits for it on the standard lock,
    /// then counts itself in the word. No writer's bit is up while the
    /// standard lock is held to read, and the writer that comes next
    /// waits for the readers counted.
    #[cold]
    #[inline(never)]
    fn read_slow(&self) -> ReadGuard<'_, T> {
        let _wait = self.slow.read().unwrap_or_else(PoisonError::into_inner);
        self.word.fetch_add(1, Ordering::SeqCst);
        ReadGuard {
            lock: self,
            line: None,
        }
    }

    /// Locks to write: waits for the writer before it, and for the
    /// readers in.
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        let slow = self.slow.write().unwrap_or_else(PoisonError::into_inner);
        // From here on, readers go the slow way, which `slow` holds shut;
        // those already in leave after their lookup. SeqCst: see the
        // module's docs; what the readers in read happens before what this
        // writes, through their release of the word or of their line.
        let was = self.word.fetch_or(WRITER | COUNTED, Ordering::SeqCst);
        wait_while(|| self.word.load(Ordering::SeqCst) & READERS != 0);
        if was & COUNTED == 0 {
            let me = self.address();
            for line in &LINES_READING[..index_bound().min(LINES)] {
                wait_while(|| line.0.load(Ordering::SeqCst) == me);
            }
        }
        WriteGuard {
            lock: self,
            _slow: slow,
        }
    }
}

/// Spins, then yields, while `busy`.
#[inline]
fn wait_while(busy: impl Fn() -> bool) {
    let mut spins = 0;
    while busy() {
        if spins < SPINS {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        match self.line {
            Some(line) => line.store(0, Ordering::Release),
            None => {
                self.lock.word.fetch_sub(1, Ordering::Release);
            }
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
        // SAFETY: a reader is in (its line held this lock, or it was
        // counted in the word, while the writer bit was down), so no
        // writer is.
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
        // is in; once the writer bit was up, the word counted no reader
        // and no line held this lock, and neither admits a reader while it
        // is up.
        unsafe { &mut *self.lock.data.get() }
    }
}

#[cfg(test)]
mod tests;
