//! The memory backend's entries: a state of one number updated by
//! compare-and-swap, any other state under the shard's write lock, and
//! how a state is found, updated in place and stored anew.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::super::table::{Expiring, Found, Locked};
use crate::algorithm::word::{self, expiry as word_expiry};
use crate::algorithm::{Params, State, Update, pair};
use crate::decision::Decision;
use crate::metrics::MemoryMetrics;

/// One quota's state for one key, with the moment it stops mattering: a
/// wide entry, for every state but one number (and for one that became one
/// number when its quota's algorithm changed).
pub(super) struct Wide {
    pub(super) expires_at: u64,
    pub(super) state: State,
}

impl Expiring for Wide {
    fn expires_at(&self) -> u64 {
        self.expires_at
    }
}

impl Wide {
    #[inline(always)]
    fn apply(&mut self, update: Update, p: &Params) {
        if update != Update::Keep {
            update.apply_to(&mut self.state, p);
            self.expires_at = self.state.expires_at(p);
        }
    }
}

/// A state that is one number (`State::Word`: a GCRA or leaky-bucket
/// arrival time, the moment a token bucket is full again, a fixed window's
/// end plus its count) or the moment a token bucket refilling 2 to 31
/// units a microsecond is full, on its own clock, as `State::to_word`
/// makes it (see `algorithm::word`). A word entry, 40 bytes with the key
/// instead of 72. The number says its expiry (exactly, but for a window's
/// count of microseconds), and it is updated by compare-and-swap under the
/// shard's read lock.
pub(super) struct Word(pub(super) AtomicU64);

impl Expiring for Word {
    fn expires_at(&self) -> u64 {
        word_expiry(self.0.load(Relaxed))
    }
}

impl Word {
    /// The state it holds, for a quota of `p`: `None` for numbers no such
    /// quota makes (never stored), which then count as no state. Inline:
    /// returned through memory, it is read back wider than it was written,
    /// and that load waits (a set's loop; guide::performance, "Notes on
    /// the hot path").
    #[inline]
    fn state(&self, p: &Params) -> Option<State> {
        State::from_word(self.0.load(Relaxed), p)
    }

    /// Applies `update` under the write lock, if the result is still one
    /// number ([`apply_to_numbers`]).
    /// Inlined, as [`Pair::apply`] is: a set stores through them on every
    /// check, and the update passed to a call went through memory.
    #[inline]
    fn apply(&mut self, update: Update, p: &Params) -> Option<State> {
        // A set's loop stores its arrival times and windows here on every
        // check: set without matching the state again.
        if let Update::Set(State::Word(n)) = update
            && word::plain(n)
        {
            *self.0.get_mut() = n;
            return None;
        }
        let slot = self.0.get_mut();
        apply_to_numbers(
            slot,
            update,
            p,
            |n| State::from_word(n, p),
            |shape| match shape {
                Shape::Word(n) => Some(n),
                _ => None,
            },
        )
    }

    /// [`update`] of the number.
    #[inline(always)]
    pub(super) fn update<R>(&self, decide: impl FnMut(u64) -> (R, Option<u64>)) -> R {
        update(&self.0, decide)
    }
}

/// The one compare-and-swap loop: `decide` reads the word stored and
/// returns its result and the word to store in its place (`None`: leave
/// it), which is swapped in only if nobody moved the word meanwhile, else
/// decided again on the newer one, as governor does. Inlined into each
/// caller, so each algorithm's decision inlines into its own copy of the
/// loop: a state of one number and a pair's word alike.
#[inline(always)]
pub(super) fn update<R>(word: &AtomicU64, decide: impl FnMut(u64) -> (R, Option<u64>)) -> R {
    update_from(word, word.load(Relaxed), decide)
}

/// [`update`] from `n`, the word as its caller loaded it (to read what
/// every try shares from it before the loop).
#[inline(always)]
pub(super) fn update_from<R>(
    word: &AtomicU64,
    mut n: u64,
    mut decide: impl FnMut(u64) -> (R, Option<u64>),
) -> R {
    loop {
        let (result, next) = decide(n);
        let Some(next) = next else {
            return result;
        };
        match word.compare_exchange_weak(n, next, Relaxed, Relaxed) {
            Ok(_) => return result,
            Err(moved) => n = moved,
        }
    }
}

/// A state of two numbers (a token bucket refilling more than 31 units a
/// microsecond, a fixed window of a million a second or more, a sliding
/// window counting under 2^32), as `State::to_pair` makes them: its frame,
/// changed only under the shard's write lock, and its word, updated by
/// compare-and-swap under the read lock, as a [`Word`] is
/// (`algorithm::pair`). 56 bytes with the key.
pub(super) struct Pair {
    pub(super) frame: pair::Frame,
    pub(super) word: AtomicU64,
}

impl Expiring for Pair {
    fn expires_at(&self) -> u64 {
        self.numbers().expiry()
    }
}

impl Pair {
    /// The entry holding `numbers`.
    fn new(numbers: pair::Pair) -> Pair {
        Pair {
            frame: numbers.frame,
            word: AtomicU64::new(numbers.word),
        }
    }

    /// Its numbers as they are now.
    #[inline(always)]
    pub(super) fn numbers(&self) -> pair::Pair {
        self.with(self.word.load(Relaxed))
    }

    /// `word` in this entry's frame.
    #[inline(always)]
    pub(super) fn with(&self, word: u64) -> pair::Pair {
        pair::Pair {
            frame: self.frame,
            word,
        }
    }

    /// The state it holds, for a quota of `p`: `None` for numbers no such
    /// quota makes (never stored), which then count as no state.
    #[inline]
    pub(super) fn state(&self, p: &Params) -> Option<State> {
        State::from_pair(self.numbers(), p)
    }

    /// Applies `update` under the write lock, if the result is still two
    /// numbers ([`apply_to_numbers`]), in a frame of its own.
    #[inline]
    fn apply(&mut self, update: Update, p: &Params) -> Option<State> {
        let word = *self.word.get_mut();
        let mut numbers = self.with(word);
        let moved = apply_to_numbers(
            &mut numbers,
            update,
            p,
            |n| State::from_pair(n, p),
            |shape| match shape {
                Shape::Pair(n) => Some(n),
                _ => None,
            },
        );
        self.frame = numbers.frame;
        *self.word.get_mut() = numbers.word;
        moved
    }
}

/// The entry a state is stored in, with its numbers: one number in a word
/// entry, two in a pair entry (a state that fits a word is never a pair: a
/// bucket's quota may come to keep it in a word, where its lock-free check
/// looks), anything else as it is in a wide entry.
enum Shape {
    Word(u64),
    Pair(pair::Pair),
    Wide,
}

/// `pairs`: whether two numbers are kept as a pair, else wide.
#[inline(always)]
fn shape(state: &State, p: &Params, pairs: bool) -> Shape {
    if let Some(n) = state.to_word(p) {
        return Shape::Word(n);
    }
    // Kept wide, its numbers need not be made.
    match if pairs { state.to_pair(p) } else { None } {
        Some(n) => Shape::Pair(n),
        None => Shape::Wide,
    }
}

/// Applies `update` to a word's or pair's numbers in place under the write
/// lock, if the state it makes still has that entry's shape (`in_place`
/// gives its numbers); else hands back the state, to be stored anew in its
/// shape. A state set (every update but a log's) is encoded as it is: the
/// numbers it replaces need no decoding, nor the update a match.
#[inline(always)]
fn apply_to_numbers<N: Copy>(
    numbers: &mut N,
    update: Update,
    p: &Params,
    decode: impl FnOnce(N) -> Option<State>,
    in_place: impl FnOnce(Shape) -> Option<N>,
) -> Option<State> {
    let state = match update {
        Update::Keep => return None,
        Update::Set(state) => state,
        update => {
            let mut state = decode(*numbers);
            update.apply(&mut state, p);
            state?
        }
    };
    match in_place(shape(&state, p, true)) {
        Some(n) => {
            *numbers = n;
            None
        }
        None => Some(state),
    }
}

/// The number a decision on a state of one number stores: such a state
/// only ever keeps or sets it.
#[inline(always)]
pub(super) fn word_of((decision, update): (Decision, Update)) -> (Decision, Option<u64>) {
    match update {
        Update::Set(State::Word(next)) => (decision, Some(next)),
        _ => (decision, None),
    }
}

pub(super) type Entries<'a> = Locked<'a, Wide, Word, Pair>;

/// Stores the first state of a key's quota, if the update makes one: one
/// number a word, two numbers a pair where `pairs` (a quota alone, whose
/// check swaps the pair's word without the lock), anything else wide. A
/// set of several quotas passes `pairs: false`: it decides under the
/// write lock, where a wide state is read and written as it is, while a
/// pair is decoded and encoded again on every check (~50 instructions a
/// two-number quota). `replaces`: the quota has a word or pair entry that
/// the state no longer fits (its algorithm changed, or a count grew),
/// removed first.
#[allow(clippy::too_many_arguments)]
pub(super) fn store_new(
    shard: &mut Entries<'_>,
    metrics: &MemoryMetrics,
    id: u64,
    key: &str,
    update: Update,
    p: &Params,
    now: u64,
    replaces: bool,
    pairs: bool,
) {
    if replaces {
        metrics.states_changed(shard.remove(id, key));
    }
    let mut state = None;
    if !update.apply(&mut state, p) {
        return;
    }
    let Some(state) = state else {
        return;
    };
    let gained = match shape(&state, p, pairs) {
        Shape::Word(n) => shard.insert_word(id, key, Word(AtomicU64::new(n)), now),
        Shape::Pair(n) => shard.insert_pair(id, key, Pair::new(n), now),
        Shape::Wide => {
            let expires_at = state.expires_at(p);
            shard.insert(id, key, Wide { expires_at, state }, now)
        }
    };
    metrics.states_changed(gained);
}

/// Calls `f` with the state of an entry found: a wide entry's, lent, or
/// a word or pair entry's numbers made into one.
#[inline]
pub(super) fn lend<R>(
    found: Option<Found<&Wide, &Word, &Pair>>,
    p: &Params,
    f: impl FnOnce(Option<&State>) -> R,
) -> R {
    // A word's or pair's numbers made a state, held here while lent.
    let decoded;
    // One call of `f`, not one per arm: it inlines a whole decision.
    let state = match found {
        Some(Found::Wide(slot)) => Some(&slot.state),
        Some(Found::Word(n)) => {
            decoded = n.state(p);
            decoded.as_ref()
        }
        Some(Found::Pair(pair)) => {
            decoded = pair.state(p);
            decoded.as_ref()
        }
        None => None,
    };
    f(state)
}

/// Applies `update` to the entry found for a quota, in place. Returns what
/// must be stored as a new entry instead, if anything, and whether it
/// replaces the word entry found (one whose algorithm changed).
#[inline]
pub(super) fn update_found(
    found: Option<Found<&mut Wide, &mut Word, &mut Pair>>,
    update: Update,
    p: &Params,
) -> Option<(Update, bool)> {
    match found {
        Some(Found::Wide(slot)) => {
            slot.apply(update, p);
            None
        }
        Some(Found::Word(a)) => a.apply(update, p).map(|state| (Update::Set(state), true)),
        Some(Found::Pair(a)) => a.apply(update, p).map(|state| (Update::Set(state), true)),
        None => Some((update, false)),
    }
}
