//! The shard lock raced: readers through lines and through the word,
//! writers, and the way between the two.

use super::{COUNTED, LINES, LINES_READING, REBIAS, ShardLock};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Readers never see a writer's change half made, and no write is
/// lost, with readers and writers racing on one lock. There are more
/// readers than lines, so some have none, and every other read is made
/// holding another lock, whose line it takes: those reads are counted
/// in the word. Both ways in race the writers.
#[test]
fn readers_never_see_a_write_half_made_and_no_write_is_lost() {
    let lock = Arc::new(ShardLock::new((0u64, 0u64)));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..LINES + 4)
        .map(|_| {
            let (lock, stop) = (lock.clone(), stop.clone());
            std::thread::spawn(move || {
                let other = ShardLock::new(());
                let mut reads = [0u64; 2];
                while !stop.load(Ordering::Relaxed) {
                    let nested = (reads[0] + reads[1]) % 2 == 1;
                    let _held = nested.then(|| other.read());
                    let guard = lock.read();
                    let (a, b) = *guard;
                    assert_eq!(a, b, "a write seen half made");
                    reads[usize::from(guard.line.is_none())] += 1;
                    drop(guard);
                    // Out of the lock: more threads than cores here, and
                    // a reader preempted inside holds the writers up.
                    std::thread::yield_now();
                }
                reads
            })
        })
        .collect();
    let writers: Vec<_> = (0..3)
        .map(|_| {
            let lock = lock.clone();
            std::thread::spawn(move || {
                for _ in 0..5_000 {
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
    let reads = readers
        .into_iter()
        .map(|r| r.join().unwrap())
        .fold([0, 0], |a, r| [a[0] + r[0], a[1] + r[1]]);
    assert_eq!(*lock.read(), (15_000, 15_000));
    assert!(reads[0] > 0, "no read went through a line");
    assert!(reads[1] > 0, "no read was counted in the word");
    // Every guard gave its place back.
    assert_eq!(lock.word.load(Ordering::Relaxed) & !COUNTED, 0);
    let me = lock.address();
    assert!(
        LINES_READING
            .iter()
            .all(|l| l.0.load(Ordering::Relaxed) != me)
    );
}

/// A thread whose index is gone (asking while torn down) reads
/// counted in the word, and a writer waits for it.
#[test]
fn a_thread_without_an_index_reads_counted_in_the_word() {
    // On a thread of its own: the test harness's goes on to other tests.
    std::thread::spawn(|| {
        let lock = Arc::new(ShardLock::new(0u64));
        crate::sync::give_index_back();
        let guard = lock.read();
        assert!(guard.line.is_none());
        assert_eq!(lock.word.load(Ordering::Relaxed), 1);
        let writer = {
            let lock = lock.clone();
            std::thread::spawn(move || *lock.write() = 1)
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!writer.is_finished(), "the writer went in");
        assert_eq!(*guard, 0);
        drop(guard);
        writer.join().unwrap();
        assert_eq!(*lock.read(), 1);
    })
    .join()
    .unwrap();
}

/// A thread reads a second lock while holding one, counted in the
/// word as its line is taken, and a writer of either waits for it.
#[test]
fn a_second_lock_read_is_counted_and_writers_wait_for_both_readers() {
    let (one, two) = (
        Arc::new(ShardLock::new(0u64)),
        Arc::new(ShardLock::new(0u64)),
    );
    let (first, second) = (one.read(), two.read());
    // The line is this thread's unless another thread has the same
    // index (more threads than lines) and reads now.
    assert!(
        first.line.is_none() || second.line.is_none(),
        "one line held two locks"
    );
    let writers: Vec<_> = [&one, &two]
        .into_iter()
        .map(|lock| {
            let lock = lock.clone();
            std::thread::spawn(move || *lock.write() = 1)
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(writers.iter().all(|w| !w.is_finished()), "a writer went in");
    assert_eq!((*first, *second), (0, 0));
    drop((first, second));
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!((*one.read(), *two.read()), (1, 1));
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
                guard.line.is_none(),
                "a reader past the bit is counted, having waited"
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
    assert_eq!(lock.word.load(Ordering::Relaxed), COUNTED);
}

/// A write sends readers to the word; the [`REBIAS`]th read a thread
/// makes there sends them back to their lines, and the next writer
/// waits for a reader in through its line.
#[test]
fn a_write_sends_readers_to_the_word_until_enough_reads_pass() {
    // On a thread of its own: its count of reads starts at zero.
    std::thread::spawn(|| {
        let lock = Arc::new(ShardLock::new(0u64));
        *lock.write() = 1;
        for read in 1..=REBIAS {
            let guard = lock.read();
            assert!(guard.line.is_none(), "read {read} went through a line");
            let counted = lock.word.load(Ordering::Relaxed) & COUNTED != 0;
            assert_eq!(counted, read < REBIAS, "after read {read}");
        }
        let guard = lock.read();
        assert_eq!(
            guard.line.is_some(),
            crate::sync::thread_index() < LINES,
            "back to its line"
        );
        let writer = {
            let lock = lock.clone();
            std::thread::spawn(move || *lock.write() = 2)
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!writer.is_finished(), "the writer went in");
        assert_eq!(*guard, 1);
        drop(guard);
        writer.join().unwrap();
        assert_eq!(*lock.read(), 2);
        assert_ne!(lock.word.load(Ordering::Relaxed) & COUNTED, 0);
    })
    .join()
    .unwrap();
}

/// Writes keep sending readers to the word, and counted reads keep
/// sending them back to their lines: reads through lines between
/// writes see whole writes, and no write is lost.
#[test]
fn readers_go_back_to_their_lines_between_writes() {
    use std::sync::atomic::AtomicU64;
    use std::time::{Duration, Instant};
    let lock = Arc::new(ShardLock::new((0u64, 0u64)));
    let stop = Arc::new(AtomicBool::new(false));
    // Reads through a line that saw some writes made and more to come.
    let between_writes = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (lock, stop) = (lock.clone(), stop.clone());
            let between_writes = between_writes.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let guard = lock.read();
                    let (a, b) = *guard;
                    assert_eq!(a, b, "a write seen half made");
                    if guard.line.is_some() && a > 0 {
                        between_writes.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(guard);
                    // More threads than cores here: the writer's turn.
                    std::thread::yield_now();
                }
            })
        })
        .collect();
    let started = Instant::now();
    let mut writes = 0;
    // At least 200 writes, and on until a reader went back to its line
    // (a few hundred reads after one), for at most 20 s on a busy machine.
    while writes < 200
        || between_writes.load(Ordering::Relaxed) == 0
            && started.elapsed() < Duration::from_secs(20)
    {
        let mut guard = lock.write();
        guard.0 += 1;
        std::hint::black_box(&mut *guard);
        guard.1 += 1;
        drop(guard);
        writes += 1;
        // Room between writes for a few hundred reads.
        let wrote = Instant::now();
        while wrote.elapsed() < Duration::from_micros(50) {
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert_eq!(*lock.read(), (writes, writes));
    assert!(
        between_writes.load(Ordering::Relaxed) > 0,
        "readers never went back to their lines"
    );
}
