//! Which entry each state is kept in.

use std::sync::atomic::AtomicU64;

use super::entry::{Pair, Word};
use super::*;
use crate::Timestamp;
use crate::backend::table::Found;
use crate::{Limiter, ManualClock, Quota, QuotaSet};
use std::time::Duration;

fn kind<C>(backend: &MemoryBackend<C>, id: u64, key: &str) -> Option<&'static str> {
    let shard = backend.inner.table.lock(key);
    match shard.at(shard.position(id, key)?)? {
        Found::Wide(_) => Some("wide"),
        Found::Word(_) => Some("word"),
        Found::Pair(_) => Some("pair"),
    }
}

/// A request for `cost` of `quotas` on `key`, without room, started now.
fn request<'a>(key: &'a str, quotas: &'a QuotaSet, cost: u64, commit: bool) -> CheckRequest<'a> {
    CheckRequest {
        key,
        quotas,
        cost,
        commit,
        room: false,
        started: crate::clock::Stopwatch::start(),
    }
}

/// A sliding window of 5 a second: alone in a set, and in a set beside
/// GCRA (its state the set's last).
fn window_alone_and_beside_gcra() -> [QuotaSet; 2] {
    let window = Quota::sliding_window(5, Duration::from_secs(1))
        .name("window")
        .build()
        .unwrap();
    let gcra = Quota::gcra(5, Duration::from_secs(1)).build().unwrap();
    [
        QuotaSet::new("one", [window.clone()]).unwrap(),
        QuotaSet::new("two", [gcra, window]).unwrap(),
    ]
}

/// A quota alone keeps two numbers as a pair, swapped without the lock; a
/// set of several decides under the lock and keeps them wide, as they are.
#[test]
fn states_of_one_number_are_stored_word_and_of_two_numbers_as_pairs_when_alone() {
    let gcra = Quota::gcra(5, Duration::from_secs(1)).build().unwrap();
    let window = Quota::sliding_window(5, Duration::from_secs(1))
        .name("window")
        .build()
        .unwrap();
    let set = QuotaSet::new("both", [gcra.clone(), window]).unwrap();
    let backend = MemoryBackend::new();
    let both = Limiter::new(backend.clone(), set.clone());
    let alone = Limiter::new(backend.clone(), gcra);
    for _ in 0..5 {
        assert!(both.check_now("k", 1).unwrap().unwrap().allowed());
        assert!(alone.check_now("k", 1).unwrap().unwrap().allowed());
    }
    assert!(!both.check_now("k", 1).unwrap().unwrap().allowed());
    assert!(!alone.check_now("k", 1).unwrap().unwrap().allowed());
    let ids = set.state_ids();
    assert_eq!(kind(&backend, ids[0], "k"), Some("word"));
    assert_eq!(kind(&backend, ids[1], "k"), Some("wide"));
    let alone_id = alone.quotas().state_ids()[0];
    assert_eq!(kind(&backend, alone_id, "k"), Some("word"));
    assert_eq!(backend.len(), 3);
    // A token bucket is one number when a token is whole microseconds or
    // it refills 2 to 31 units a microsecond (3 or 31 per 10 s), else a
    // pair (33 per 10 s); a fixed window is one number under one unit a
    // microsecond, else two.
    let ten = Duration::from_secs(10);
    let cases = [
        (Quota::token_bucket(5, ten), "word"),
        (Quota::token_bucket(3, ten), "word"),
        (Quota::token_bucket(31, ten), "word"),
        (Quota::token_bucket(33, ten), "pair"),
        (Quota::fixed_window(5, ten), "word"),
        (Quota::fixed_window(2, Duration::from_micros(2)), "pair"),
        (Quota::sliding_window(5, ten), "pair"),
    ];
    // A clock that stands still, for the window of two microseconds.
    let clock = ManualClock::new(Timestamp::from_micros(1_760_000_000_000_000));
    let backend = MemoryBackend::builder().clock(clock).build();
    for (q, kept) in cases {
        let q = q.build().unwrap();
        let limiter = Limiter::new(backend.clone(), q.clone());
        for _ in 0..q.limit() {
            assert!(limiter.check_now("k", 1).unwrap().unwrap().allowed());
        }
        assert!(!limiter.check_now("k", 1).unwrap().unwrap().allowed());
        let id = limiter.quotas().state_ids()[0];
        assert_eq!(kind(&backend, id, "k"), Some(kept), "{q:?}");
    }
}

#[test]
fn one_number_found_where_another_state_belongs_moves_to_its_kind() {
    // Ids include the algorithm, so only a hash collision puts an
    // arrival time under a sliding window's id: forged here, for a set
    // of one quota and for a set of two.
    for set in window_alone_and_beside_gcra() {
        let backend = MemoryBackend::new();
        let id = *set.state_ids().last().unwrap();
        let inner = &*backend.inner;
        inner
            .table
            .lock("k")
            .insert_word(id, "k", Word(AtomicU64::new(u64::MAX >> 12)), 0);
        let limiter = Limiter::new(backend.clone(), set.clone());
        for _ in 0..5 {
            assert!(limiter.check_now("k", 1).unwrap().unwrap().allowed());
        }
        assert!(!limiter.check_now("k", 1).unwrap().unwrap().allowed());
        let kept = if set.quotas().len() == 1 {
            "pair"
        } else {
            "wide"
        };
        assert_eq!(kind(&backend, id, "k"), Some(kept), "{}", set.name());
        assert_eq!(backend.len(), set.quotas().len());
    }
}

#[test]
fn a_bucket_found_as_a_pair_where_its_quota_keeps_a_word_moves_to_a_word() {
    // A quota made elastic keeps its bucket as a pair; made plain again,
    // the pair is read, decided under the lock once, and stored as the
    // word that the lock-free check reads (forged here).
    let quota = Quota::token_bucket(3, Duration::from_secs(10))
        .build()
        .unwrap();
    let p = quota.params;
    let backend = MemoryBackend::new();
    let limiter = Limiter::new(backend.clone(), quota);
    let id = limiter.quotas().state_ids()[0];
    let now = crate::clock::Clock::now(&crate::clock::SystemClock).as_micros();
    // Two of the three tokens spent.
    let full = p.capacity * p.unit;
    let bucket = crate::algorithm::State::TokenBucket(crate::algorithm::token_bucket::Bucket {
        level: full - 2 * p.unit,
        at: now,
    });
    let numbers = bucket.to_pair(&p).unwrap();
    let pair = Pair {
        frame: numbers.frame,
        word: std::sync::atomic::AtomicU64::new(numbers.word),
    };
    backend.inner.table.lock("k").insert_pair(id, "k", pair, 0);
    assert!(limiter.check_now("k", 1).unwrap().unwrap().allowed());
    assert_eq!(kind(&backend, id, "k"), Some("word"));
    assert!(!limiter.check_now("k", 1).unwrap().unwrap().allowed());
    assert_eq!(backend.len(), 1);
}

#[test]
fn a_peek_at_a_bucket_kept_in_a_word_spends_nothing() {
    // 3 per 10 s: its word is stored by the first check, and the peeks
    // after are decided on it without the lock.
    let quota = Quota::token_bucket(3, Duration::from_secs(10))
        .build()
        .unwrap();
    let backend = MemoryBackend::new();
    let limiter = Limiter::new(backend.clone(), quota);
    assert!(limiter.check_now("k", 1).unwrap().unwrap().allowed());
    let id = limiter.quotas().state_ids()[0];
    assert_eq!(kind(&backend, id, "k"), Some("word"));
    let peek = |cost| match backend.check_now(request("k", limiter.quotas(), cost, false)) {
        crate::backend::Now::Decided(Ok(decision)) => decision.allowed(),
        _ => panic!("the memory backend decides at once"),
    };
    for _ in 0..5 {
        assert!(peek(2));
    }
    assert!(limiter.check_now("k", 2).unwrap().unwrap().allowed());
    assert!(!peek(1));
}

/// A charge on a key with no state stores it as a check would: a quota
/// alone keeps its window as a pair (its next checks swap it without the
/// lock), a set of several keeps it wide.
#[test]
fn a_charge_stores_a_new_state_in_the_entry_a_check_would() {
    let [alone, set] = window_alone_and_beside_gcra();
    for (quotas, kept) in [(alone, "pair"), (set, "wide")] {
        let backend = MemoryBackend::new();
        let charge = request("k", &quotas, 2, true);
        assert_eq!(backend.charge_now(charge).remaining(), 3);
        let id = *quotas.state_ids().last().unwrap();
        assert_eq!(kind(&backend, id, "k"), Some(kept), "{}", quotas.name());
        let limiter = Limiter::new(backend.clone(), quotas.clone());
        for _ in 0..3 {
            assert!(limiter.check_now("k", 1).unwrap().unwrap().allowed());
        }
        assert!(!limiter.check_now("k", 1).unwrap().unwrap().allowed());
        assert_eq!(kind(&backend, id, "k"), Some(kept), "{}", quotas.name());
    }
}

/// A charge that must store its state anew (a key with none, or a window
/// kept as one number that its count no longer fits) is stored, and the
/// decision it returns sees it.
#[test]
fn a_charge_stores_what_it_cannot_update_in_place() {
    let clock = ManualClock::new(Timestamp::from_secs(1_000));
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    // 999 a millisecond: the window is one number while its count stays
    // under the period's 1 000 microseconds.
    let window = Quota::fixed_window(999, Duration::from_millis(1))
        .build()
        .unwrap();
    let gcra = Quota::gcra(10, Duration::from_secs(1)).build().unwrap();
    for quota in [window, gcra] {
        let limiter = Limiter::new(backend.clone(), quota);
        let charge =
            |key: &str, cost| backend.charge_now(request(key, limiter.quotas(), cost, true));
        // A key with no state yet.
        let left = charge("fresh", 5);
        assert_eq!(left.remaining(), limiter.quotas().quotas()[0].limit() - 5);
        let next = limiter.check_now("fresh", 0).unwrap().unwrap();
        assert_eq!(next.remaining(), left.remaining(), "{:?}", limiter.quotas());
        // Past what the stored form holds.
        assert!(limiter.check_now("big", 1).unwrap().unwrap().allowed());
        let left = charge("big", 5_000);
        assert_eq!(left.remaining(), 0, "{:?}", limiter.quotas());
        let next = limiter.check_now("big", 1).unwrap().unwrap();
        assert!(!next.allowed(), "{:?}", limiter.quotas());
    }
}

/// A pair whose moment moves past what its frame's word counts (a sliding
/// window whose 31-bit counts leave three windows, or 32-bit ones none; a
/// bucket of 999 999 a second, 213 days) is stored again in a frame of its
/// own, under the lock, and decides each check as the algorithm on its
/// plain state does.
#[test]
fn a_pair_past_its_frame_moves_to_a_new_one_and_decides_the_same() {
    use crate::algorithm::testing::Sim;
    let day = 86_400 * 1_000_000;
    let cases = [
        (
            Quota::sliding_window((1 << 31) - 1, Duration::from_secs(1)),
            1 << 28,
            1_300_000,
        ),
        // Counts of 32 bits: a frame holds one window.
        (
            Quota::sliding_window(u64::from(u32::MAX), Duration::from_secs(1)),
            1 << 29,
            1_300_000,
        ),
        (
            Quota::token_bucket(999_999, Duration::from_secs(1)).burst(50),
            7,
            150 * day,
        ),
    ];
    for (q, cost, gap) in cases {
        let quota = q.build().unwrap();
        let clock = ManualClock::new(Timestamp::from_micros(1_760_000_000_000_000));
        let backend = MemoryBackend::builder().clock(clock.clone()).build();
        let limiter = Limiter::new(backend.clone(), quota.clone());
        let id = limiter.quotas().state_ids()[0];
        let mut sim = Sim::new(quota.clone());
        let frame = || {
            let shard = backend.inner.table.lock("k");
            match shard.at(shard.position(id, "k")?)? {
                Found::Pair(pair) => Some(pair.frame),
                _ => None,
            }
        };
        let (mut frames, mut admitted) = (Vec::new(), 0);
        for round in 0..8 {
            for i in 0..4u64 {
                let now = clock.now().as_micros();
                let decision = limiter.check_now("k", cost * (i + 1)).unwrap().unwrap();
                let expected = sim.at(now, cost * (i + 1));
                assert_eq!(
                    decision.allowed(),
                    expected.allowed,
                    "{quota:?} {round} {i}"
                );
                let left = if expected.allowed {
                    &expected.admit
                } else {
                    &expected.refuse
                };
                assert_eq!(
                    decision.remaining(),
                    left.remaining,
                    "{quota:?} {round} {i}"
                );
                admitted += usize::from(expected.allowed);
            }
            frames.push(frame().expect("kept as a pair"));
            clock.advance(Duration::from_micros(gap));
        }
        frames.dedup();
        assert!(frames.len() > 1, "{quota:?} never left its first frame");
        // Admissions and refusals both compared.
        assert!(
            admitted > 0 && admitted < 32,
            "{quota:?} admitted {admitted}"
        );
    }
}
