use super::testing::{S, Sim};
use super::*;
use crate::quota::Quota;
use std::time::Duration;

/// Each algorithm's give-back on a timeline: what a reservation spent
/// comes back while it still counts, not after its window rolled over
/// or its quota was full again, and never past a fresh key's quota.
#[test]
fn a_give_back_returns_what_still_counts_and_never_more() {
    use super::Algorithm;
    let t0 = 1_000 * 60 * S;
    for a in Algorithm::ALL {
        let quota = Quota::builder(a, 4, Duration::from_secs(60))
            .build()
            .unwrap();
        let p = quota.params;
        let mut sim = Sim::new(quota);
        let left = |sim: &Sim, now| {
            check(a, sim.state.as_ref(), &p, 0, now, false)
                .refuse
                .remaining
        };
        let give = |sim: &mut Sim, cost, at, until, now| {
            let spent = Spent { cost, at, until };
            let update = give_back(a, sim.state.as_ref(), &p, spent, now);
            update.apply(&mut sim.state, &p);
        };
        // Given back at once: as if never spent.
        let fresh = left(&sim, t0);
        let step = sim.at(t0, 3);
        assert!(step.allowed, "{a}");
        give(&mut sim, 3, t0, t0 + step.admit.reset, t0);
        assert_eq!(left(&sim, t0), fresh, "{a}");
        // Given back twice: never more than a fresh key's.
        let step = sim.at(t0, 1);
        give(&mut sim, 1, t0, t0 + step.admit.reset, t0);
        give(&mut sim, 1, t0, t0 + step.admit.reset, t0);
        assert_eq!(left(&sim, t0), fresh, "{a}: twice");
        // Spent near a window's end, given back after it rolled over
        // (or the bucket was full again): nothing changes.
        let late = t0 + 59 * S;
        let step = sim.at(late, 2);
        let after = t0 + 121 * S;
        let before = sim.state.clone();
        give(&mut sim, 2, late, late + step.admit.reset, after);
        assert_eq!(left(&sim, after), fresh, "{a}: all back anyway");
        if matches!(a, Algorithm::FixedWindow | Algorithm::SlidingLog) {
            assert_eq!(
                sim.state, before,
                "{a}: a rolled-over window keeps its state"
            );
        }
    }
}

/// A state kept as two numbers decides, read back, exactly as the
/// state did, at every moment (a clock behind it included); numbers
/// no state makes are refused, never a panic.
#[test]
fn two_numbers_decide_as_the_state_they_hold() {
    let t0 = 1_000 * 60 * S;
    let quotas = [
        Quota::token_bucket(3, Duration::from_secs(10)).burst(5),
        Quota::fixed_window(2_000_000, Duration::from_secs(1)),
        Quota::sliding_window(7, Duration::from_secs(60)),
    ];
    for q in quotas {
        let quota = q.build().unwrap();
        let (a, p) = (quota.algorithm(), quota.params);
        let mut sim = Sim::new(quota);
        for (i, cost) in [1, 2, 1, 3, 1, 1, 2].into_iter().enumerate() {
            sim.at(t0 + i as u64 * 1_234_567, cost);
            let state = sim.state.clone().unwrap();
            let numbers = state.to_pair(&p).expect("fits two numbers");
            let read = State::from_pair(numbers, &p).unwrap();
            assert_eq!(read.expires_at(&p), state.expires_at(&p), "{a}");
            assert_eq!(numbers.expiry(), state.expires_at(&p), "{a}");
            for now in [t0, t0 + i as u64 * 1_234_567 + 1, t0 + 9 * S, t0 + 200 * S] {
                for cost in [0, 1, 4] {
                    let was = check(a, Some(&state), &p, cost, now, false);
                    let is = check(a, Some(&read), &p, cost, now, false);
                    assert_eq!(was.allowed, is.allowed, "{a} {now} {cost}");
                    assert_eq!(was.wait, is.wait, "{a} {now} {cost}");
                    assert_eq!(was.refuse.remaining, is.refuse.remaining, "{a}");
                    assert_eq!(was.refuse.reset, is.refuse.reset, "{a}");
                }
            }
        }
        // Any word in the state's frame reads back without a panic.
        let frame = sim.state.as_ref().unwrap().to_pair(&p).unwrap().frame;
        for word in [0, u64::MAX, 1 << 56, 3 << 62, u64::MAX >> 1] {
            let garbage = pair::Pair { frame, word };
            let _ = (State::from_pair(garbage, &p), garbage.expiry());
        }
    }
    // Counts of more than 32 bits do not fit two numbers: such a window
    // stays wide.
    let p = Quota::sliding_window(1 << 40, Duration::from_secs(1))
        .build()
        .unwrap()
        .params;
    let big = sliding_window::Counters {
        start: t0,
        prev: 0,
        curr: 1 << 32,
    };
    assert_eq!(State::SlidingWindow(big).to_pair(&p), None);
}

/// A pair's frame holds the states that follow from its own while their
/// moment stays within what the word counts from its origin, on its
/// steps; any other is refused, to be stored in a frame of its own.
#[test]
fn a_pair_holds_what_its_frame_counts_and_nothing_else() {
    let t0 = 1_000 * 60 * S;
    let window = Quota::sliding_window(1_000, Duration::from_secs(60))
        .build()
        .unwrap()
        .params;
    let at =
        |start, prev, curr| State::SlidingWindow(sliding_window::Counters { start, prev, curr });
    let first = at(t0, 0, 5).to_pair(&window).unwrap();
    // A later window, as many windows on as the word counts: held.
    let later = at(t0 + 60 * S * 1_000, 5, 7);
    let word = later.to_word_in(first.frame, &window).unwrap();
    let read = State::from_pair(
        pair::Pair {
            frame: first.frame,
            word,
        },
        &window,
    );
    assert_eq!(read, Some(later.clone()));
    // An earlier window, one off its steps, one past what the word counts,
    // a count past the capacity: refused.
    assert_eq!(at(t0 - 60 * S, 0, 1).to_word_in(first.frame, &window), None);
    assert_eq!(at(t0 + 1, 0, 1).to_word_in(first.frame, &window), None);
    let wide = Quota::sliding_window((1 << 31) - 1, Duration::from_secs(60))
        .build()
        .unwrap()
        .params;
    // Counts of 31 bits each leave the window two bits: three windows on.
    let own = at(t0, 0, 5).to_pair(&wide).unwrap();
    assert!(
        at(t0 + 3 * 60 * S, 5, 7)
            .to_word_in(own.frame, &wide)
            .is_some()
    );
    assert_eq!(at(t0 + 4 * 60 * S, 0, 1).to_word_in(own.frame, &wide), None);
    // Counts of 32 bits each leave the word to them: the frame holds its
    // own window alone.
    let widest = Quota::sliding_window(u64::from(u32::MAX), Duration::from_secs(60))
        .build()
        .unwrap()
        .params;
    let own = at(t0, 0, 5).to_pair(&widest).unwrap();
    let full = at(t0, u64::from(u32::MAX), u64::from(u32::MAX));
    let word = full.to_word_in(own.frame, &widest).unwrap();
    let read = State::from_pair(
        pair::Pair {
            frame: own.frame,
            word,
        },
        &widest,
    );
    assert_eq!(read, Some(full));
    assert_eq!(at(t0 + 60 * S, 5, 7).to_word_in(own.frame, &widest), None);
    assert_eq!(at(t0, 0, 1_024).to_word_in(first.frame, &window), None);
    // Another quota's layout (a capacity of other bits), or another
    // algorithm's numbers: refused, though the numbers would fit.
    let other = Quota::sliding_window(5_000, Duration::from_secs(60))
        .build()
        .unwrap()
        .params;
    assert_eq!(at(t0, 0, 1).to_word_in(first.frame, &other), None);
    let bucket = Quota::token_bucket(999_999, Duration::from_secs(1))
        .build()
        .unwrap()
        .params;
    let full = State::TokenBucket(token_bucket::Bucket {
        level: bucket.capacity * bucket.unit,
        at: t0 + 120 * S,
    });
    assert_eq!(full.to_word_in(first.frame, &bucket), None);
    // A bucket's word counts ticks of its refill from the origin: any later
    // moment is held, to 2^64 ticks (at 999 999 a microsecond, 213 days).
    let own = full.to_pair(&bucket).unwrap();
    let week = State::TokenBucket(token_bucket::Bucket {
        level: 0,
        at: t0 + 120 * S + 7 * 86_400 * S,
    });
    let word = week.to_word_in(own.frame, &bucket).unwrap();
    assert_eq!(
        pair::Pair {
            frame: own.frame,
            word
        }
        .expiry(),
        week.expires_at(&bucket)
    );
    let year = State::TokenBucket(token_bucket::Bucket {
        level: 0,
        at: t0 + 365 * 86_400 * S,
    });
    assert_eq!(year.to_word_in(own.frame, &bucket), None);
}
