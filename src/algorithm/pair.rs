//! A state of two numbers, swapped together by a backend (a 128-bit
//! compare-and-swap): the token bucket whose token is not whole
//! microseconds and that `word.rs` does not keep in one number (refilling
//! more than 31 units a microsecond), the fixed window of a million a
//! second or more, the sliding window. Each algorithm owns its numbers' meaning; this file
//! owns where they sit, and the checks a backend makes on them as they are.

use super::{Params, State, fixed_window, sliding_window, token_bucket};

/// A state of two numbers, swapped together by a backend (a 128-bit
/// compare-and-swap): the low 64 bits are the state's expiry, with the
/// algorithm's tag in the top byte, the high 64 bits the algorithm's second
/// number. Each algorithm owns its codec (`to_pair`, `from_pair`).
pub(crate) type Pair = u128;

/// The tags of a [`Pair`]'s top byte.
const PAIR_TOKEN_BUCKET: u64 = 1;
const PAIR_FIXED_WINDOW: u64 = 2;
const PAIR_SLIDING_WINDOW: u64 = 3;
/// The expiry's bits below the tag.
const PAIR_EXPIRY: u64 = (1 << 56) - 1;

/// A pair of `tag`, `expiry` and `second`; `None` when the expiry does not
/// fit below the tag.
#[inline]
fn pair(tag: u64, expiry: u64, second: u64) -> Option<Pair> {
    (expiry <= PAIR_EXPIRY).then(|| u128::from(tag << 56 | expiry) | u128::from(second) << 64)
}

/// A pair's expiry (the moment after which it means no state).
#[inline]
pub(crate) fn pair_expiry(pair: Pair) -> u64 {
    pair as u64 & PAIR_EXPIRY
}

impl State {
    /// The state as two numbers swapped together, if it is one of the
    /// states kept so and fits.
    #[inline]
    pub(crate) fn to_pair(&self, p: &Params) -> Option<Pair> {
        match self {
            State::TokenBucket(b) => {
                let (expiry, second) = b.to_pair(p)?;
                pair(PAIR_TOKEN_BUCKET, expiry, second)
            }
            State::FixedWindow(w) => pair(
                PAIR_FIXED_WINDOW,
                w.start.checked_add(p.period.get())?,
                w.count,
            ),
            State::SlidingWindow(c) => {
                let (expiry, second) = c.to_pair(p)?;
                pair(PAIR_SLIDING_WINDOW, expiry, second)
            }
            State::Word(_) | State::SlidingLog(_) => None,
        }
    }

    /// The state a [`Pair`] holds, for a quota of `p`; `None` for numbers
    /// that no state of `p` makes.
    #[inline]
    pub(crate) fn from_pair(pair: Pair, p: &Params) -> Option<State> {
        let (first, second) = (pair as u64, (pair >> 64) as u64);
        let expiry = first & PAIR_EXPIRY;
        Some(match first >> 56 {
            PAIR_TOKEN_BUCKET => {
                State::TokenBucket(token_bucket::Bucket::from_pair(expiry, second, p)?)
            }
            PAIR_FIXED_WINDOW => State::FixedWindow(fixed_window::Window {
                start: expiry.checked_sub(p.period.get())?,
                count: second,
            }),
            PAIR_SLIDING_WINDOW => {
                State::SlidingWindow(sliding_window::Counters::from_pair(expiry, second, p)?)
            }
            _ => return None,
        })
    }
}

/// A token bucket's pair checked by `spend` at `now`
/// ([`token_bucket::Spend::take`]), with the pair to store when it admits;
/// `None` for numbers that are not such a bucket's, or an admitted bucket
/// that no pair holds.
#[inline]
pub(crate) fn token_bucket_spent(
    pair: Pair,
    p: &Params,
    spend: &token_bucket::Spend,
    now: u64,
) -> Option<(token_bucket::Taken, Option<Pair>)> {
    let (first, r) = (pair as u64, (pair >> 64) as u64);
    if first >> 56 != PAIR_TOKEN_BUCKET {
        return None;
    }
    let (taken, next) = spend.take(p, (first & PAIR_EXPIRY, r), now)?;
    match next {
        Some((full_at, r)) => Some((taken, Some(self::pair(PAIR_TOKEN_BUCKET, full_at, r)?))),
        None => Some((taken, None)),
    }
}

/// A sliding window's pair with `cost` added to its current count, and the
/// admission it is, when `now` is in the stored window and `cost` fits
/// beside both counts whole ([`sliding_window::admitted_unweighed`], what
/// [`sliding_window::admit_or_check`] admits without weighing) and the count
/// still fits its 32 bits: the pair plus the cost, nothing re-encoded.
/// `None` otherwise (another window, a count near the limit), for the full
/// check.
#[inline]
pub(crate) fn sliding_window_added(
    pair: Pair,
    p: &Params,
    cost: u64,
    now: u64,
) -> Option<(Pair, sliding_window::Admitted)> {
    let (first, counts) = (pair as u64, (pair >> 64) as u64);
    if first >> 56 != PAIR_SLIDING_WINDOW {
        return None;
    }
    let c = sliding_window::Counters::from_pair(first & PAIR_EXPIRY, counts, p)?;
    if now >= c.start.saturating_add(p.period.get()) {
        return None;
    }
    let a = sliding_window::admitted_unweighed(&c, p, cost, now)?;
    (a.counters.curr <= u64::from(u32::MAX)).then(|| (pair + (u128::from(cost) << 64), a))
}

#[cfg(test)]
mod tests {
    use super::{sliding_window_added, token_bucket_spent};
    use crate::Quota;
    use crate::algorithm::{State, sliding_window, token_bucket, word};
    use proptest::prelude::*;
    use std::time::Duration;

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
            let spend = token_bucket::Spend::new(p, cost);
            let (taken, next) = token_bucket_spent(numbers, p, &spend, now).unwrap();
            let checked = token_bucket::take(Some(&stored), p, cost, now);
            prop_assert_eq!(taken, checked);
            let after = checked.admits(p).then(|| State::TokenBucket(checked.bucket(p, now)));
            prop_assert_eq!(next, after.as_ref().map(|a| a.to_pair(p).unwrap()));
            if word::keeps_bucket(p) {
                let in_word = bucket.to_word(p).unwrap();
                prop_assert_eq!(State::from_word(in_word, p), Some(stored.clone()));
                prop_assert_eq!(word::expiry(in_word), stored.expires_at(p));
                let (taken, next) = word::token_bucket_spent(in_word, p, cost * p.unit, now, true);
                prop_assert_eq!(taken, Some(checked));
                prop_assert_eq!(next, after.map(|a| a.to_word(p).unwrap()));
            }
        }

        /// A sliding window's count added in its numbers is the admission
        /// the counters read back make without weighing, and is found
        /// wherever that admission is.
        #[test]
        fn a_sliding_window_added_in_its_numbers_is_the_admission_checked(
            limit in 1u64..1_000,
            prev in 0u64..1_000,
            curr in 0u64..1_000,
            window in 1u64..5,
            now in 0u64..7_000_000,
            cost in 0u64..50,
        ) {
            let quota = Quota::sliding_window(limit, Duration::from_secs(1)).build().unwrap();
            let p = &quota.params;
            let counters = sliding_window::Counters { start: window * 1_000_000, prev, curr };
            let numbers = State::SlidingWindow(counters).to_pair(p).unwrap();
            let added = sliding_window_added(numbers, p, cost, now);
            let in_window = (counters.start..counters.start + 1_000_000).contains(&now);
            let unweighed = in_window && prev + curr + cost <= p.capacity;
            prop_assert_eq!(added.is_some(), unweighed);
            if let Some((next, a)) = added {
                let checked = sliding_window::admit_or_check(Some(&counters), p, cost, now, Some, |_| None);
                prop_assert_eq!(Some(a), checked);
                prop_assert_eq!(Some(next), State::SlidingWindow(a.counters).to_pair(p));
            }
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
        let spend = token_bucket::Spend::new(&bucket.params, 1);
        assert_eq!(
            token_bucket_spent(of_window, &bucket.params, &spend, 1_000_001),
            None
        );
        let of_bucket = State::TokenBucket(token_bucket::Bucket {
            level: 0,
            at: 1_000_000,
        })
        .to_pair(&bucket.params)
        .unwrap();
        assert_eq!(
            sliding_window_added(of_bucket, &window.params, 1, 1_000_001),
            None
        );
    }
}
