//! The one-quota states of two numbers (a token bucket, a fixed or a
//! sliding window) found stored: swapped by a 128-bit compare-and-swap
//! under the read lock, or by a 64-bit one where they are kept in one (a
//! token bucket's, `algorithm::word`). The shorter the loop, the fewer
//! swaps fail on a key that many threads check at once, so each loop holds
//! only what its common case needs, and what it reports is computed once
//! the swap holds.
//! Anything else (a new key, a state that no longer fits two numbers) takes
//! the write lock.

use super::super::entry::{Pair, update};
use super::super::{CheckRequest, MemoryBackend};
use crate::algorithm::{
    Params, State, Update, fixed_window, pair, sliding_window, token_bucket, word,
};
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
            let admitted = update(&pair.0, |numbers| {
                if let Some((next, a)) = pair::sliding_window_added(numbers, p, cost, now) {
                    return (Some(a), commit.then_some(next));
                }
                sliding_window_checked(numbers, q, cost, now, commit, &mut decided)
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
        let taken = if in_word {
            let units = request.cost * p.unit;
            shard
                .word(id, request.key)
                .and_then(|n| n.update(|n| word::token_bucket_spent(n, p, units, at, commit)))
        } else {
            let spend = token_bucket::Spend::new(p, request.cost);
            shard.pair(id, request.key).and_then(|numbers| {
                update(&numbers.0, |n| {
                    spent(pair::token_bucket_spent(n, p, &spend, at), commit)
                })
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
                let counted = swap_pair(pair, p, |state| {
                    let counted = fixed_window::count(Some(state), p, cost, now);
                    let store = commit && counted.allowed;
                    Some((counted, store.then(|| counted.state_after(p, cost))))
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

/// One try of the pair-shaped bucket's loop, from its check on the stored
/// numbers: the check, and the numbers to store if it admits and commits.
/// `None` for numbers that are not the bucket's, for the write lock. (The
/// word's check takes `commit` and answers so itself; the pair's given that
/// shape too made the paths inlined beside it in `decide_at` 6-10
/// instructions longer each, the sliding window 385 -> 395.)
#[inline(always)]
fn spent<V>(
    checked: Option<(token_bucket::Taken, Option<V>)>,
    commit: bool,
) -> (Option<token_bucket::Taken>, Option<V>) {
    match checked {
        Some((taken, next)) => (Some(taken), next.filter(|_| commit)),
        None => (None, None),
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
    update(&pair.0, |numbers| {
        checked_pair(numbers, p, |state| check(state))
    })
}

/// One try of [`swap_pair`]'s loop: the stored `numbers` read back into
/// their state, checked, and the state to store made numbers again.
#[inline(always)]
fn checked_pair<T>(
    numbers: u128,
    p: &Params,
    check: impl FnOnce(&State) -> Option<(T, Option<State>)>,
) -> (Option<T>, Option<u128>) {
    let Some((answer, next)) = State::from_pair(numbers, p).and_then(|s| check(&s)) else {
        return (None, None);
    };
    match next.map(|next| next.to_pair(p)) {
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
/// (`pair::sliding_window_added`) does not decide: the stored `numbers`
/// read back, admitted or checked from one estimate, and the numbers to
/// store. A decision other than an admission is left in `decided`, so that
/// the loop around the common case carries only an admission (carrying a
/// whole decision cost the common case ~20 instructions); `decided` is
/// left `None` for numbers that no sliding window of the quota makes, or
/// counters that no longer fit two numbers: the write lock's. Out of line,
/// so that the loop stays short.
#[inline(never)]
fn sliding_window_checked(
    numbers: u128,
    q: &QuotaSet,
    cost: u64,
    now: u64,
    commit: bool,
    decided: &mut Option<Decision>,
) -> (Option<sliding_window::Admitted>, Option<u128>) {
    let p = &q.quotas()[0].params;
    let (checked, next) = checked_pair(numbers, p, |state| {
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
