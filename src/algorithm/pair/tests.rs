use super::{BucketClock, Pair, WindowClock, fixed_window_counted};
use crate::Quota;
use crate::algorithm::{State, fixed_window, sliding_window, token_bucket, word};
use proptest::prelude::*;
use std::time::Duration;

/// A bucket's pair checked as the backend checks it: its clock read from
/// the frame, then the word spent; neither where the frame is not the
/// bucket's or does not count `now`.
fn token_bucket_spent(
    pair: Pair,
    p: &crate::algorithm::Params,
    units: u64,
    now: u64,
    commit: bool,
) -> (Option<token_bucket::Taken>, Option<u64>) {
    match BucketClock::at(pair.frame, p, now) {
        Some(clock) => clock.spent(pair.word, p, units, commit),
        None => (None, None),
    }
}

proptest! {
    /// A bucket checked on its two numbers, as a pair or in one word
    /// where its quota keeps it so (`word.rs`), admits, reports and
    /// stores what the bucket read back and checked in full does, for
    /// buckets at any level, clocks before and after them, any cost;
    /// a word reads back as the bucket and expires when it does.
    #[test]
    fn a_bucket_spent_on_its_numbers_is_the_bucket_checked(
        // Buckets faster and slower than a token a microsecond, and
        // those kept in one word (2 to 31 units a microsecond).
        per_second in prop_oneof![1u64..1_000_000, 2_000_000u64..50_000_000, 2u64..=31],
        burst in 1u64..5_000,
        level in prop_oneof![0u64..10_000, 0u64..10_000_000_000],
        // Small moments, and the epoch's.
        at in prop_oneof![1_000u64..2_000, 1_760_000_000_000_000u64..1_760_000_000_001_000],
        // From a millisecond before `at` to two after.
        offset in 0u64..3_000,
        cost in prop_oneof![Just(1u64), 0u64..40],
    ) {
        let quota = Quota::token_bucket(per_second, Duration::from_secs(1))
            .burst(burst)
            .build()
            .unwrap();
        let p = &quota.params;
        prop_assume!(p.refill > 1);
        let now = at - 1_000 + offset;
        let full = p.capacity * p.unit;
        let bucket = State::TokenBucket(token_bucket::Bucket { level: level.min(full), at });
        let numbers = bucket.to_pair(p).unwrap();
        let stored = State::from_pair(numbers, p).unwrap();
        prop_assert_eq!(numbers.expiry(), stored.expires_at(p));
        let (taken, next) = token_bucket_spent(numbers, p, cost * p.unit, now, true);
        let checked = token_bucket::take(Some(&stored), p, cost, now);
        prop_assert_eq!(taken, Some(checked));
        let after = checked.admits(p).then(|| State::TokenBucket(checked.bucket(p, now)));
        // The bucket after, in the frame the check kept: the same word
        // as the state makes there, read back as that state.
        let in_frame = after.as_ref().map(|a| a.to_word_in(numbers.frame, p).unwrap());
        prop_assert_eq!(next, in_frame);
        if let (Some(word), Some(a)) = (next, after.as_ref()) {
            let read = State::from_pair(Pair { frame: numbers.frame, word }, p).unwrap();
            prop_assert_eq!(read.expires_at(p), a.expires_at(p));
            prop_assert_eq!(
                token_bucket::deficit(Some(&read), p, now),
                token_bucket::deficit(Some(a), p, now)
            );
        }
        // A peek stores nothing.
        prop_assert_eq!(token_bucket_spent(numbers, p, cost * p.unit, now, false).1, None);
        if word::keeps_bucket(p) {
            let in_word = bucket.to_word(p).unwrap();
            prop_assert_eq!(State::from_word(in_word, p), Some(stored.clone()));
            prop_assert_eq!(word::expiry(in_word), stored.expires_at(p));
            let (taken, next) = word::token_bucket_spent(in_word, p, cost * p.unit, now, true);
            prop_assert_eq!(taken, Some(checked));
            prop_assert_eq!(next, after.map(|a| a.to_word(p).unwrap()));
        }
    }

    /// A sliding window's count added in its word, on the clock read
    /// from it, is the admission the counters read back make without
    /// weighing, and is found wherever that admission is: in the frame's
    /// first window and in the later ones its word counts. A clock read
    /// from another word (the first try of a swap that failed) adds the
    /// same where that word stores the same window and previous count, and
    /// nothing elsewhere, and reads the word's counters there alone.
    #[test]
    fn a_sliding_window_added_in_its_word_is_the_admission_checked(
        limit in 1u64..1_000,
        prev in 0u64..1_000,
        curr in 0u64..1_000,
        window in 2u64..5,
        later in 0u64..3,
        now in 0u64..9_000_000,
        cost in 0u64..50,
        seen_later in 0u64..3,
        seen_curr in 0u64..1_000,
        seen_prev_step in 0u64..3,
    ) {
        let quota = Quota::sliding_window(limit, Duration::from_secs(1)).build().unwrap();
        let p = &quota.params;
        // No count passes the capacity.
        let (prev, curr) = (prev % (limit + 1), curr % (limit + 1));
        let framed = sliding_window::Counters { start: window * 1_000_000, prev: 0, curr: 0 };
        let frame = State::SlidingWindow(framed).to_pair(p).unwrap().frame;
        let counters = sliding_window::Counters { start: (window + later) * 1_000_000, prev, curr };
        let state = State::SlidingWindow(counters);
        let word = state.to_word_in(frame, p).unwrap();
        prop_assert_eq!(State::from_pair(Pair { frame, word }, p), Some(state));
        let numbers = Pair { frame, word };
        let added = WindowClock::of(numbers, p, now, cost).and_then(|clock| clock.added(word));
        let in_window = (counters.start..counters.start + 1_000_000).contains(&now);
        let unweighed = in_window && prev + curr + cost <= p.capacity;
        prop_assert_eq!(added.is_some(), unweighed);
        if let Some((next, a)) = added {
            let checked = sliding_window::admit_or_check(Some(&counters), p, cost, now, Some, |_| None);
            prop_assert_eq!(Some(a), checked);
            let after = State::SlidingWindow(a.counters);
            prop_assert_eq!(Some(next), after.to_word_in(frame, p));
            prop_assert_eq!(State::from_pair(Pair { frame, word: next }, p), Some(after));
        }
        let seen = sliding_window::Counters {
            start: (window + seen_later) * 1_000_000,
            curr: seen_curr % (limit + 1),
            // One less, the same, one more: another previous count in the
            // same window (stored by a reset, say) is not the clock's.
            prev: (prev + limit + seen_prev_step) % (limit + 1),
        };
        let seen = Pair { frame, word: State::SlidingWindow(seen).to_word_in(frame, p).unwrap() };
        let on_seen = WindowClock::of(seen, p, now, cost).and_then(|clock| clock.added(word));
        let same = WindowClock::of(seen, p, now, cost).is_some() && seen_later == later && seen_prev_step == 1;
        prop_assert_eq!(on_seen, if same { added } else { None });
        // The full check reads the same counters through that clock.
        let read = WindowClock::of(seen, p, now, cost).and_then(|clock| clock.counters(word));
        prop_assert_eq!(read, same.then_some(counters));
    }

    /// A fixed window counted on its numbers is the window counted on
    /// its state, and stores in its frame what the state after makes
    /// there: the same window or a later one, on a calendar or not.
    #[test]
    fn a_fixed_window_counted_in_its_numbers_is_the_window_counted(
        limit in 2_000_000u64..3_000_000,
        count in 0u64..3_000_000,
        window in 1u64..5,
        now in 0u64..9_000_000,
        cost in 0u64..50,
        daily in any::<bool>(),
    ) {
        use crate::calendar::{Calendar, CalendarPeriod};
        // Days in UTC start on multiples of 86 400 s: the epoch's day
        // is a window; the clock then runs over three days.
        let (quota, start, now) = if daily {
            let days = Calendar::new(CalendarPeriod::Day, "UTC").unwrap();
            (Quota::per_calendar(limit, days), 0, now * 30_000)
        } else {
            (Quota::fixed_window(limit, Duration::from_secs(1)), window * 1_000_000, now)
        };
        let quota = quota.build().unwrap();
        let p = &quota.params;
        let stored = State::FixedWindow(fixed_window::Window { start, count: count.min(limit) });
        let numbers = stored.to_pair(p).unwrap();
        let (counted, next) = fixed_window_counted(numbers, p, cost, now, true);
        let checked = fixed_window::count(Some(&stored), p, cost, now);
        let counted = counted.unwrap();
        prop_assert_eq!(counted.allowed, checked.allowed);
        prop_assert_eq!(counted.window(), checked.window());
        prop_assert_eq!(counted.end, checked.end);
        let after = checked.allowed.then(|| checked.state_after(p, cost));
        let in_frame = after.as_ref().and_then(|a| a.to_word_in(numbers.frame, p));
        prop_assert_eq!(next, in_frame);
        if let Some(word) = next {
            prop_assert_eq!(State::from_pair(Pair { frame: numbers.frame, word }, p), after);
        }
        prop_assert_eq!(fixed_window_counted(numbers, p, cost, now, false).1, None);
    }
}

#[test]
fn another_algorithms_numbers_are_left_to_the_full_check() {
    let bucket = Quota::token_bucket(3_000_000, Duration::from_secs(1))
        .build()
        .unwrap();
    let window = Quota::sliding_window(10, Duration::from_secs(1))
        .build()
        .unwrap();
    let counters = sliding_window::Counters {
        start: 1_000_000,
        prev: 0,
        curr: 0,
    };
    let of_window = State::SlidingWindow(counters)
        .to_pair(&window.params)
        .unwrap();
    let unit = bucket.params.unit;
    assert_eq!(
        token_bucket_spent(of_window, &bucket.params, unit, 1_000_001, true),
        (None, None)
    );
    let of_bucket = State::TokenBucket(token_bucket::Bucket {
        level: 0,
        at: 1_000_000,
    })
    .to_pair(&bucket.params)
    .unwrap();
    assert!(WindowClock::of(of_bucket, &window.params, 1_000_001, 1).is_none());
}
