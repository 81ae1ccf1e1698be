//! The one-quota states of two numbers (a token bucket, a fixed or a
//! sliding window) found stored: their word swapped in its frame under the
//! read lock (`algorithm::pair`), or the one number a token bucket may be
//! kept as (`algorithm::word`). The shorter the loop, the fewer
//! swaps fail on a key that many threads check at once, so each loop holds
//! only what its common case needs, and what it reports is computed once
//! the swap holds.
//! Anything else (a new key, a state that no longer fits two numbers or
//! its frame) takes the write lock, which stores it in a frame of its own.

use std::sync::atomic::Ordering::Relaxed;

use super::super::entry::{Pair, update, update_from};
use super::super::{CheckRequest, MemoryBackend};
use crate::algorithm::{Params, State, Update, pair, sliding_window, word};
use crate::clock::{Clock, Timestamp};
use crate::decision::Decision;
use crate::quota::Path;
use crate::quota_set::QuotaSet;

impl<C: Clock> MemoryBackend<C> {
    /// A one-quota sliding window found stored. Far from the limit, in the
    /// stored window, the loop adds the cost to the count and nothing else,
    /// and yields only the admission; another window, a count to weigh, a
    /// refusal or a clock behind the window leave it, on the same numbers,
    /// to [`sliding_window_checked`].
    #[inline]
    pub(super) fn decide_sliding_window(
        &self,
        request: CheckRequest<'_>,
        now: Timestamp,
        id: u64,
    ) -> Decision {
        let shard = self.inner.table.read(request.key);
        if let Some(pair) = shard.pair(id, request.key) {
            let q = request.quotas;
            let p = &q.quotas()[0].params;
            let (cost, now, commit) = (request.cost, now.as_micros(), request.commit);
            // The loop yields an admission, or leaves a decision here.
            let mut decided = None;
            // Read from the first word, for every try (see `WindowClock`).
            let first = pair.word.load(Relaxed);
            let clock = pair::WindowClock::of(pair.with(first), p, now, cost);
            let admitted = update_from(&pair.word, first, |word| {
                if let Some(clock) = &clock
                    && let Some((next, a)) = clock.added(word)
                {
                    return (Some(a), commit.then_some(next));
                }
                let read = clock.and_then(|clock| clock.counters(word));
                sliding_window_checked(pair.with(word), read, q, cost, now, commit, &mut decided)
            });
            if let Some(admitted) = admitted {
                return q.sliding_window_admitted(admitted);
            }
            if let Some(decision) = decided {
                return decision;
            }
        }
        self.decide_locked(request, now, Some(shard.write()), None)
    }

    /// A one-quota token bucket found stored, in a word (`in_word`,
    /// `Path::BucketWord`) or a pair (`Path::Bucket`): checked on its
    /// numbers as they are.
    #[inline]
    pub(super) fn decide_bucket(
        &self,
        request: CheckRequest<'_>,
        now: Timestamp,
        id: u64,
        in_word: bool,
    ) -> Decision {
        let shard = self.inner.table.read(request.key);
        let q = request.quotas;
        let p = &q.quotas()[0].params;
        let (at, commit) = (now.as_micros(), request.commit);
        let units = request.cost * p.unit;
        let taken = if in_word {
            shard
                .word(id, request.key)
                .and_then(|n| n.update(|n| word::token_bucket_spent(n, p, units, at, commit)))
        } else {
            shard.pair(id, request.key).and_then(|pair| {
                let clock = pair::BucketClock::at(pair.frame, p, at)?;
                update(&pair.word, |n| clock.spent(n, p, units, commit))
            })
        };
        if let Some(taken) = taken {
            return q.bucket_decision(&taken);
        }
        self.decide_locked(request, now, Some(shard.write()), None)
    }

    /// Any other one-quota state of two numbers found stored (a fixed
    /// window of a million a second or more, an elastic quota's).
    #[inline(never)]
    pub(super) fn decide_pair(
        &self,
        request: CheckRequest<'_>,
        now: Timestamp,
        id: u64,
    ) -> Decision {
        let shard = self.inner.table.read(request.key);
        if let Some(pair) = shard.pair(id, request.key) {
            let q = request.quotas;
            let quota = &q.quotas()[0];
            let (p, cost, now) = (&quota.params, request.cost, now.as_micros());
            let (commit, room) = (request.commit, request.room);
            if quota.path == Path::WindowPair {
                let counted = update(&pair.word, |word| {
                    pair::fixed_window_counted(pair.with(word), p, cost, now, commit)
                });
                if let Some(counted) = counted {
                    return q.window_decision(&counted, cost);
                }
            } else if let Some(decision) = swap_pair(pair, p, |state| {
                to_store(q.evaluate_one(Some(state), cost, now, commit, room))
            }) {
                return decision;
            }
        }
        self.decide_locked(request, now, Some(shard.write()), None)
    }
}

/// The compare-and-swap loop of a state of two numbers: `check` answers on
/// the state stored and gives the state to store, if any (`None`: a state
/// no pair holds, for the write lock); `None` also when the stored numbers
/// or the state to store do not fit two numbers.
#[inline(always)]
fn swap_pair<T>(
    pair: &Pair,
    p: &Params,
    mut check: impl FnMut(&State) -> Option<(T, Option<State>)>,
) -> Option<T> {
    update(&pair.word, |word| {
        let state = State::from_pair(pair.with(word), p);
        checked_in(state, pair.frame, p, &mut check)
    })
}

/// One try of a pair's loop: the `state` its word was read back into,
/// checked, and the state to store made a word of its `frame` again.
#[inline(always)]
fn checked_in<T>(
    state: Option<State>,
    frame: pair::Frame,
    p: &Params,
    check: impl FnOnce(&State) -> Option<(T, Option<State>)>,
) -> (Option<T>, Option<u64>) {
    let Some((answer, next)) = state.and_then(|s| check(&s)) else {
        return (None, None);
    };
    match next.map(|next| next.to_word_in(frame, p)) {
        None => (Some(answer), None),
        Some(Some(next)) => (Some(answer), Some(next)),
        Some(None) => (None, None),
    }
}

/// What a full check's `update` stores through [`swap_pair`].
#[inline(always)]
fn to_store((decision, update): (Decision, Update)) -> Option<(Decision, Option<State>)> {
    match update {
        Update::Keep => Some((decision, None)),
        Update::Set(state) => Some((decision, Some(state))),
        Update::Log { .. } => None,
    }
}

/// One try of a sliding window's loop that the count added in place
/// (`pair::WindowClock::added`) does not decide: the stored `numbers`
/// read back (as the counters `read` through the loop's clock where it
/// holds their window, with no decoding), admitted or checked from one
/// estimate, and the numbers to store. A decision other than an admission is left in `decided`, so that
/// the loop around the common case carries only an admission (carrying a
/// whole decision cost the common case ~20 instructions); `decided` is
/// left `None` for numbers that no sliding window of the quota makes, or
/// counters that no longer fit two numbers: the write lock's. Out of line,
/// so that the loop stays short.
#[inline(never)]
fn sliding_window_checked(
    numbers: pair::Pair,
    read: Option<sliding_window::Counters>,
    q: &QuotaSet,
    cost: u64,
    now: u64,
    commit: bool,
    decided: &mut Option<Decision>,
) -> (Option<sliding_window::Admitted>, Option<u64>) {
    let p = &q.quotas()[0].params;
    let state = match read {
        Some(c) => Some(State::SlidingWindow(c)),
        None => State::from_pair(numbers, p),
    };
    let (checked, next) = checked_in(state, numbers.frame, p, |state| {
        // Another algorithm's state counts as none, as in `check`.
        let counters = match state {
            State::SlidingWindow(c) => Some(c),
            _ => None,
        };
        sliding_window::admit_or_check(
            counters,
            p,
            cost,
            now,
            |a| Some((Ok(a), commit.then_some(State::SlidingWindow(a.counters)))),
            |outcome| {
                to_store(q.evaluate_outcome(outcome, commit))
                    .map(|(decision, next)| (Err(decision), next))
            },
        )
    });
    match checked {
        Some(Ok(admitted)) => {
            *decided = None;
            (Some(admitted), next)
        }
        Some(Err(decision)) => {
            *decided = Some(decision);
            (None, next)
        }
        None => {
            *decided = None;
            (None, None)
        }
    }
}
