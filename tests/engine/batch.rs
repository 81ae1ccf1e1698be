//! `BatchBackend`: a hot key's units taken a batch at a time by stripes of
//! threads, within the documented bound (`stripes x (batch - 1)` units).

use std::sync::{Arc, Barrier};
use std::time::Duration;

use tollgate::backend::BatchBackend;
use tollgate::{Limiter, ManualClock, MemoryBackend, Quota, QuotaSet, Timestamp};

type Batched<C> = Limiter<BatchBackend<MemoryBackend<C>>>;

/// `checks` checks on `key` from each of `threads` threads started
/// together; the admitted count.
fn race<C: tollgate::Clock>(
    limiter: &Arc<Batched<C>>,
    threads: usize,
    checks: usize,
    key: &'static str,
) -> u64 {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (limiter, barrier) = (Arc::clone(limiter), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let mut admitted = 0;
                for _ in 0..checks {
                    let decision = limiter.check_now(key, 1).expect("decides now");
                    admitted += u64::from(decision.expect("no error").allowed());
                }
                admitted
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

/// One window of an hour: whatever the interleaving, the stripes together
/// admit no more than the limit, and once every stripe has run dry, no
/// fewer than the limit less what stripes may park.
#[test]
fn threads_on_one_hot_key_never_admit_more_than_the_limit_in_a_window() {
    for (threads, stripes) in [(8, 8), (8, 3), (2, 2)] {
        let quota = Quota::fixed_window(10_000, Duration::from_secs(3_600))
            .build()
            .unwrap();
        let backend = BatchBackend::builder(MemoryBackend::new())
            .stripes(stripes)
            .max_batch(64)
            .lifetime(Duration::from_secs(3_600))
            .build();
        let limiter = Arc::new(Limiter::new(backend, quota));
        let admitted = race(&limiter, threads, 20_000 / threads, "global");
        assert!(admitted <= 10_000, "{threads} threads: {admitted} admitted");
        let parked = stripes as u64 * 63;
        assert!(
            admitted >= 10_000 - parked,
            "{threads} threads on {stripes} stripes: {admitted} admitted"
        );
    }
}

/// A fixed window's units taken late in one window spill into the next:
/// at most `stripes x (batch - 1)` more than the limit, as documented.
#[tokio::test]
async fn a_new_window_admits_at_most_the_parked_units_beyond_its_limit() {
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_040));
    let inner = MemoryBackend::builder().clock(clock.clone()).build();
    let backend = BatchBackend::builder(inner)
        .stripes(4)
        .max_batch(8)
        .lifetime(Duration::from_secs(3_600))
        .build();
    let quota = Quota::fixed_window(1_000, Duration::from_secs(60))
        .build()
        .unwrap();
    let limiter = Arc::new(Limiter::new(backend, quota));
    // Batches of 1, 4, 8, 8, ...: however the threads share the stripes,
    // 120 checks leave some units taken but not spent.
    let first = race(&limiter, 4, 30, "nat");
    assert_eq!(first, 120, "far from the limit: all admitted");
    let taken = 1_000 - limiter.peek("nat", 0).await.unwrap().remaining();
    let parked = taken - first;
    assert!(parked > 0 && parked <= 4 * 7, "{parked} parked");
    clock.advance(Duration::from_secs(60));
    let second = race(&limiter, 4, 400, "nat");
    assert!(
        second <= 1_000 + parked,
        "{second} admitted in the second window, {parked} parked from the first"
    );
}

/// What the inner backend has left for `k` (a peek goes to it).
async fn remaining(limiter: &Batched<tollgate::SystemClock>) -> u64 {
    limiter.peek("k", 0).await.unwrap().remaining()
}

/// Parked units go back to the inner backend when flushed, and when a
/// lapsed batch is next touched, so the other stripes can spend them.
#[tokio::test]
async fn parked_units_are_given_back_when_flushed_and_when_lapsed() {
    let quota = Quota::fixed_window(100, Duration::from_secs(3_600))
        .build()
        .unwrap();
    let set = QuotaSet::single(quota);
    let backend = BatchBackend::builder(MemoryBackend::new())
        .stripes(1)
        .max_batch(16)
        .lifetime(Duration::from_millis(200))
        .build();
    let limiter = Limiter::new(backend, set.clone());
    // A batch of 1, then one of 4: 2 checks spend 5 units, 3 parked.
    for _ in 0..2 {
        assert!(limiter.check("k", 1).await.unwrap().allowed());
    }
    assert_eq!(
        remaining(&limiter).await,
        95,
        "parked units are spent inside"
    );
    assert_eq!(limiter.backend().flush(limiter.quotas()).await, 3);
    assert_eq!(remaining(&limiter).await, 98, "flushed: given back");

    // Again, then let the batch lapse: the next check gives it back.
    for _ in 0..3 {
        assert!(limiter.check("k", 1).await.unwrap().allowed());
    }
    let before = remaining(&limiter).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(limiter.check("k", 1).await.unwrap().allowed());
    assert_eq!(before, 100 - 2 - 5, "2 spent, then 3 spent and 2 parked");
    assert_eq!(
        remaining(&limiter).await,
        100 - 6,
        "the lapsed batch's 2 units came back"
    );
    assert_eq!(limiter.backend().flush(limiter.quotas()).await, 0);
}

/// Sets the batches cannot keep within the bound go to the inner backend
/// one request at a time: nothing parked, the inner state exact.
#[tokio::test]
async fn sliding_logs_and_peeks_are_not_batched() {
    let set = QuotaSet::single(
        Quota::sliding_log(50, Duration::from_secs(60))
            .build()
            .unwrap(),
    );
    let backend = BatchBackend::builder(MemoryBackend::new())
        .stripes(1)
        .build();
    let limiter = Limiter::new(backend, set.clone());
    for i in 1..=10 {
        let d = limiter.check("log", 1).await.unwrap();
        assert_eq!(d.remaining(), 50 - i);
    }
    assert_eq!(limiter.peek("log", 0).await.unwrap().remaining(), 40);
    assert_eq!(limiter.backend().flush(&set).await, 0);
}

/// A reset through batches means a fresh key: the inner backend forgets
/// the key, and the stripes drop its parked units rather than give them
/// back to the fresh key later. Resetting one quota of the set drops the
/// set's batch too (its units were taken from every quota: those of the
/// others stay spent, never admitted twice). Another key's batch stays.
#[tokio::test]
async fn a_reset_forgets_the_key_inside_and_the_units_parked_for_it() {
    let hour = Quota::fixed_window(100, Duration::from_secs(3_600))
        .name("hour")
        .build()
        .unwrap();
    let day = Quota::fixed_window(1_000, Duration::from_secs(86_400))
        .name("day")
        .build()
        .unwrap();
    let set = QuotaSet::new("two", [hour, day]).unwrap();
    let backend = BatchBackend::builder(MemoryBackend::new())
        .stripes(1)
        .max_batch(16)
        .lifetime(Duration::from_secs(3_600))
        .build();
    let limiter = Limiter::new(backend, set.clone());
    let left =
        |d: tollgate::Decision| -> Vec<u64> { d.quotas().iter().map(|q| q.remaining()).collect() };
    // A batch of 1, then one of 4: 2 checks take 5 units, 3 parked; the
    // other key the same.
    for key in ["k", "other"] {
        for _ in 0..2 {
            assert!(limiter.check(key, 1).await.unwrap().allowed());
        }
    }
    assert_eq!(left(limiter.peek("k", 0).await.unwrap()), [95, 995]);

    limiter.reset("k").await.expect("a batched backend resets");
    assert_eq!(left(limiter.peek("k", 0).await.unwrap()), [100, 1_000]);
    assert!(limiter.check("k", 1).await.unwrap().allowed());
    assert_eq!(
        left(limiter.peek("k", 0).await.unwrap()),
        [99, 999],
        "a fresh batch of one, nothing parked from before"
    );

    // Again, then the hour alone.
    assert!(limiter.check("k", 1).await.unwrap().allowed());
    assert_eq!(left(limiter.peek("k", 0).await.unwrap()), [95, 995]);
    assert!(limiter.reset_quota("k", "hour").await.unwrap());
    assert_eq!(left(limiter.peek("k", 0).await.unwrap()), [100, 995]);
    // Only the other key's 3 parked units remain to give back.
    assert_eq!(limiter.backend().flush(&set).await, 3);
    assert_eq!(left(limiter.peek("other", 0).await.unwrap()), [98, 998]);
}
