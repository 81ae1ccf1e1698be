//! A state kept in one number, swapped alone by a backend (a 64-bit
//! compare-and-swap): a [`State::Word`] as it is (an arrival time, a fixed
//! window's end plus its count), or a token bucket whose token is not a
//! whole number of microseconds, when it refills few units a microsecond.
//!
//! Such a bucket is kept as GCRA on a finer clock: the moment it is full
//! again, counted in `1/refill` microseconds (a unit's refill), so that
//! `full_at * refill - r` for its two numbers ([`Bucket::to_pair`]). Its
//! check is then an arrival time's, on `now * refill`, and so as short.
//! A bucket refilling faster keeps the same moment counted from an origin
//! in a frame beside it (`pair.rs`), an entry 16 bytes larger.
//!
//! The top five bits of a word say which: 0 for a state kept as it is
//! (every such state is below 2^54), else the bucket's `refill` (2 to 31),
//! which is enough to read its expiry back from the word alone
//! ([`expiry`]). The moment then has 59 bits, every microsecond to the year
//! 2540 at 31 units a microsecond; past that, the bucket is two numbers
//! again.

use super::token_bucket::{Bucket, Taken};
use super::{Params, State};

/// Where a word's tag starts.
const TAG: u32 = 59;
/// The bits below the tag.
const MOMENT: u64 = (1 << TAG) - 1;
/// The most units a bucket kept in a word refills a microsecond.
const MOST_REFILL: u64 = (1 << (64 - TAG)) - 1;

/// Whether a token bucket of `p` is kept in one word: refilling 2 to 31
/// units a microsecond (3 a second, 7 a minute: most fractional rates),
/// and not elastic (an elastic bucket is decided in full on its pair,
/// `Path::Pair`).
#[inline]
pub(crate) fn keeps_bucket(p: &Params) -> bool {
    p.elastic_margin == 0 && fits_tag(p.refill)
}

/// Whether a bucket refilling `refill` units a microsecond can be kept in
/// a word: its refill is the word's tag.
#[inline]
fn fits_tag(refill: u64) -> bool {
    (2..=MOST_REFILL).contains(&refill)
}

/// Whether `n`, a [`State::Word`], is kept as the number it is.
#[inline]
pub(crate) fn plain(n: u64) -> bool {
    n >> TAG == 0
}

/// The moment after which the state a word holds means no state at all.
/// A bucket's takes a division: only a sweep asks.
#[inline]
pub(crate) fn expiry(word: u64) -> u64 {
    match word >> TAG {
        0 => word,
        refill => (word & MOMENT).div_ceil(refill),
    }
}

/// The moment a bucket refilling `refill` units a microsecond (at most
/// [`MOST_REFILL`]) keeps in `word` (in `1/refill` microseconds), if the
/// word is such a bucket's: the word less its tag, if the tag is `refill`.
#[inline]
fn moment(word: u64, refill: u64) -> Option<u64> {
    debug_assert!(refill <= MOST_REFILL);
    let moment = word ^ refill << TAG;
    (moment <= MOMENT).then_some(moment)
}

impl State {
    /// The state as one number, if it is one of the states kept so and
    /// fits.
    #[inline]
    pub(crate) fn to_word(&self, p: &Params) -> Option<u64> {
        match self {
            State::Word(n) => plain(*n).then_some(*n),
            State::TokenBucket(b) if keeps_bucket(p) => {
                let (full_at, r) = b.to_pair(p)?;
                let moment = full_at.checked_mul(p.refill)? - r;
                (moment <= MOMENT).then_some(p.refill << TAG | moment)
            }
            _ => None,
        }
    }

    /// The state a word holds, for a quota of `p`; `None` for numbers that
    /// no state of `p` makes. A bucket is read back whether or not its quota
    /// keeps it in a word now (a quota made elastic since reads it, then
    /// stores it as a pair).
    #[inline]
    pub(crate) fn from_word(word: u64, p: &Params) -> Option<State> {
        if plain(word) {
            return Some(State::Word(word));
        }
        if !fits_tag(p.refill) {
            return None;
        }
        let moment = moment(word, p.refill)?;
        let full_at = expiry(word);
        Bucket::from_pair(full_at, full_at * p.refill - moment, p).map(State::TokenBucket)
    }
}

/// A token bucket kept in a word, checked for `units` (`cost * unit`) at
/// `now`: the check in plain numbers, and the word to store when it admits
/// and `commit`s; neither for a word that is not such a bucket's, nor for
/// an admitted bucket that no word holds. GCRA's arithmetic, on the
/// bucket's clock.
#[inline]
pub(crate) fn token_bucket_spent(
    word: u64,
    p: &Params,
    units: u64,
    now: u64,
    commit: bool,
) -> (Option<Taken>, Option<u64>) {
    let (Some(now), Some(moment)) = (now.checked_mul(p.refill), moment(word, p.refill)) else {
        return (None, None);
    };
    let start = moment.max(now);
    let taken = Taken::of(start - now, units);
    let next = start + units;
    match (taken.admits(p), next <= MOMENT) {
        (false, _) => (Some(taken), None),
        (true, true) => (Some(taken), commit.then_some(word & !MOMENT | next)),
        (true, false) => (None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::{expiry, keeps_bucket, token_bucket_spent};
    use crate::Quota;
    use crate::algorithm::{State, token_bucket};
    use std::time::Duration;

    fn bucket(per_second: u64) -> Quota {
        Quota::token_bucket(per_second, Duration::from_secs(1))
            .build()
            .unwrap()
    }

    #[test]
    fn buckets_refilling_two_to_31_units_a_microsecond_are_kept_in_a_word() {
        // 3 a second refills 3 units a microsecond, a token 10^6 units;
        // 31 a second 31, 32 a second 1 (a token is 31 250 microseconds).
        for (per_second, kept) in [(3, true), (31, true), (33, false), (32, false)] {
            assert_eq!(
                keeps_bucket(&bucket(per_second).params),
                kept,
                "{per_second}"
            );
        }
        assert!(!keeps_bucket(&bucket(999_999).params));
    }

    // A bucket in a word is checked against its pair and in full by
    // `pair.rs`' property test, `a_bucket_spent_on_its_numbers_is_the_bucket_checked`.

    #[test]
    fn other_words_are_kept_as_they_are_or_refused() {
        let three = bucket(3);
        let p = &three.params;
        // An arrival time is its own number and expiry.
        let tat = State::Word(1_760_000_000_000_000);
        assert_eq!(tat.to_word(p), Some(1_760_000_000_000_000));
        assert_eq!(expiry(1_760_000_000_000_000), 1_760_000_000_000_000);
        assert_eq!(State::from_word(1_760_000_000_000_000, p), Some(tat));
        // Another refill's bucket is not this one's.
        let seven = bucket(7);
        let theirs = State::TokenBucket(token_bucket::Bucket { level: 0, at: 5 })
            .to_word(&seven.params)
            .unwrap();
        // Seven tokens at seven a second: full a second later.
        assert_eq!(expiry(theirs), 1_000_005);
        assert_eq!(State::from_word(theirs, p), None);
        assert_eq!(token_bucket_spent(theirs, p, p.unit, 6, true), (None, None));
        // A moment past 59 bits is not kept in a word, nor a clock past
        // what the bucket's clock counts.
        let far = State::TokenBucket(token_bucket::Bucket {
            level: 0,
            at: 1 << 58,
        });
        assert_eq!(far.to_word(p), None);
        let word = State::TokenBucket(token_bucket::Bucket { level: 0, at: 5 })
            .to_word(p)
            .unwrap();
        assert_eq!(
            token_bucket_spent(word, p, p.unit, u64::MAX / 2, true),
            (None, None)
        );
        // A peek stores nothing.
        assert!(matches!(
            token_bucket_spent(word, p, p.unit, 6, false),
            (Some(_), None)
        ));
    }
}
