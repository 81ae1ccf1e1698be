//! One check decided: the path its quota was given when built, each
//! found entry swapped without a lock where its state allows, and
//! everything else under the shard's write lock.

use smallvec::SmallVec;

use super::entry::{Entries, Pair, Stored, lend, store_new, update, update_found, word_of};
use super::{CheckRequest, MemoryBackend};
use crate::algorithm::{Params, State, Update, fixed_window, pair, sliding_window, token_bucket};
use crate::backend::table::{Found, Position};
use crate::clock::{Clock, Timestamp};
use crate::decision::Decision;
use crate::quota::{Path, Quota};
use crate::quota_set::{QuotaSet, arrival_decision, arrive};

impl<C: Clock> MemoryBackend<C> {
    /// The hot path, inlined into the caller so the decision is built where
    /// it is returned: a stored arrival time decided under the read lock.
    /// The other one-quota sets with a lock-free or in-place path (a fixed
    /// window kept as one number, a sliding window) take it out of line, so
    /// that this stays small enough to inline; everything else is
    /// [`decide_locked`](Self::decide_locked).
    #[inline]
    pub(super) fn decide(&self, request: CheckRequest<'_>) -> Decision {
        let now = self.now(&request);
        self.decide_at(request, now)
    }

    /// The time of `request`: on the system clock, the limiter's own
    /// reading of the counter.
    #[inline]
    pub(super) fn now(&self, request: &CheckRequest<'_>) -> Timestamp {
        self.inner.clock.now_given(request.started.started_at())
    }

    /// [`decide`](Self::decide) at `now`: a set of one quota takes the
    /// path its quota was given when built, anything else the write lock.
    #[inline]
    pub(super) fn decide_at(&self, request: CheckRequest<'_>, now: Timestamp) -> Decision {
        if let ([id], [quota]) = (request.quotas.state_ids(), request.quotas.quotas()) {
            // The hot path alone here, every other one out of line: a
            // `match` of them all became a jump table, its loads and an
            // indirect jump on every check.
            if quota.path == Path::Arrival {
                return self.decide_arrival(request, now, *id, quota);
            }
        }
        self.decide_other(request, now)
    }

    /// [`decide_at`](Self::decide_at) for anything but a one-quota arrival
    /// time.
    #[inline(never)]
    fn decide_other(&self, request: CheckRequest<'_>, now: Timestamp) -> Decision {
        if let ([id], [quota]) = (request.quotas.state_ids(), request.quotas.quotas()) {
            match quota.path {
                Path::Window => return self.decide_fixed_window(request, now, *id),
                Path::SlidingWindow | Path::Bucket | Path::WindowPair | Path::Pair => {
                    return self.decide_pair(request, now, *id);
                }
                Path::Arrival | Path::Locked => {}
            }
        }
        self.decide_locked(request, now, None, None)
    }

    /// A one-quota arrival time found stored: swapped under the read lock.
    /// Unless the quota is elastic, the loop holds only the arithmetic of
    /// [`gcra::arrive`](crate::algorithm::gcra::arrive), and the decision
    /// is built once the swap holds.
    #[inline]
    fn decide_arrival(
        &self,
        request: CheckRequest<'_>,
        now: Timestamp,
        id: u64,
        quota: &Quota,
    ) -> Decision {
        let shard = self.inner.table.read(request.key);
        let Some(word) = shard.word::<true>(id, request.key) else {
            return self.decide_locked(request, now, Some(shard.write()), None);
        };
        let (cost, now, commit) = (request.cost, now.as_micros(), request.commit);
        if quota.params.elastic_margin == 0 {
            let checked = word.update(|tat| {
                let a = arrive(quota, tat, cost, now);
                (a, (a.allowed && commit).then_some(a.next))
            });
            return arrival_decision(quota, &checked);
        }
        let (q, state, room) = (request.quotas, State::Word, request.room);
        word.update(|tat| word_of(q.evaluate_one(Some(&state(tat)), cost, now, commit, room)))
    }

    /// A one-quota state of two numbers (a token bucket, a fixed or a
    /// sliding window) found stored: swapped by a 128-bit compare-and-swap
    /// under the read lock. The shorter the loop, the fewer swaps fail on
    /// a key that many threads check at once, so a token bucket is checked
    /// on its numbers as they are (`token_bucket::Spend`), and a sliding
    /// window far from its limit adds the cost to its count and nothing
    /// else; what either reports is computed once the swap holds.
    /// Anything else (a new key, a state that no longer fits two numbers)
    /// takes the write lock.
    #[inline]
    fn decide_pair(&self, request: CheckRequest<'_>, now: Timestamp, id: u64) -> Decision {
        let shard = self.inner.table.read(request.key);
        if let Some(pair) = shard.pair(id, request.key) {
            let q = request.quotas;
            let quota = &q.quotas()[0];
            let (p, cost, now) = (&quota.params, request.cost, now.as_micros());
            let (commit, room) = (request.commit, request.room);
            // Each path returns its decision where it is made: gathered
            // into one `Option` first, the decision was copied once more
            // (~20 instructions a check).
            match quota.path {
                Path::SlidingWindow => match update(&pair.0, |numbers| {
                    // Far from the limit, in the stored window: the cost
                    // added to the count, and nothing else in the loop.
                    if let Some((next, a)) = pair::sliding_window_added(numbers, p, cost, now) {
                        return (Some(Ok(a)), commit.then_some(next));
                    }
                    // Another window, a count to weigh, a refusal or a
                    // clock behind the window: read back and checked.
                    sliding_window_checked(numbers, q, cost, now, commit)
                }) {
                    Some(Ok(admitted)) => return q.sliding_window_admitted(admitted),
                    Some(Err(decision)) => return decision,
                    None => {}
                },
                Path::WindowPair => {
                    let counted = swap_pair(pair, p, |state| {
                        let counted = fixed_window::count(Some(state), p, cost, now);
                        let store = commit && counted.allowed;
                        Some((counted, store.then(|| counted.state_after(p, cost))))
                    });
                    if let Some(counted) = counted {
                        return q.window_decision(&counted, cost);
                    }
                }
                Path::Bucket => {
                    let spend = token_bucket::Spend::new(p, cost);
                    let taken = update(&pair.0, |numbers| {
                        match pair::token_bucket_spent(numbers, p, &spend, now) {
                            Some((taken, next)) => (Some(taken), next.filter(|_| commit)),
                            None => (None, None),
                        }
                    });
                    if let Some(taken) = taken {
                        return q.bucket_decision(&taken, now);
                    }
                }
                _ => {
                    if let Some(decision) = swap_pair(pair, p, |state| {
                        to_store(q.evaluate_one(Some(state), cost, now, commit, room))
                    }) {
                        return decision;
                    }
                }
            }
        }
        self.decide_locked(request, now, Some(shard.write()), None)
    }

    /// A one-quota fixed window kept as one number: swapped under the read
    /// lock once stored.
    #[inline]
    fn decide_fixed_window(&self, request: CheckRequest<'_>, now: Timestamp, id: u64) -> Decision {
        let shard = self.inner.table.read(request.key);
        if let Some(window) = shard.word::<true>(id, request.key) {
            let (q, cost, now) = (request.quotas, request.cost, now.as_micros());
            let (commit, p) = (request.commit, &q.quotas()[0].params);
            let counted = window.update(|n| {
                let counted = fixed_window::count(Some(&State::Word(n)), p, cost, now);
                let next = (counted.allowed && commit).then(|| counted.word_after(p, cost));
                (counted, next)
            });
            return q.window_decision(&counted, cost);
        }
        self.decide_locked(request, now, Some(shard.write()), None)
    }

    /// Decides under the shard's write lock (taken here unless given): a
    /// new key, a set of several quotas, or an algorithm whose state is
    /// more than one number. `found`: for a one-quota set whose caller
    /// looked its entry up under this lock already, where it is, if
    /// anywhere.
    #[inline(never)]
    pub(super) fn decide_locked(
        &self,
        request: CheckRequest<'_>,
        now: Timestamp,
        shard: Option<Entries<'_>>,
        found: Option<Option<Position>>,
    ) -> Decision {
        let inner = &*self.inner;
        let key = request.key;
        let now_micros = now.as_micros();
        let mut shard = shard.unwrap_or_else(|| inner.table.lock(key));
        let ids = request.quotas.state_ids();
        let quotas = request.quotas.quotas();
        // One quota, the common case: one lookup, and the state updated in
        // place.
        if let ([id], [quota]) = (ids, quotas) {
            let p = &quota.params;
            let at = found.unwrap_or_else(|| shard.position(*id, key));
            let found = at.and_then(|at| shard.at_mut(at));
            let found_state = found.as_ref().map(Found::shared);
            let (decision, update) = lend(found_state, p, |state| {
                let q = request.quotas;
                q.evaluate_one(
                    state,
                    request.cost,
                    now_micros,
                    request.commit,
                    request.room,
                )
            });
            if let Some((update, replaces)) = update_found(found, update, p) {
                let metrics = &inner.metrics;
                store_new(
                    &mut shard, metrics, *id, key, update, p, now_micros, replaces,
                );
            }
            return decision;
        }
        let (cost, commit, room) = (request.cost, request.commit, request.room);
        self.in_set(&mut shard, &request, now_micros, |s| {
            request.quotas.evaluate(s, cost, now, commit, room)
        })
    }

    /// Runs `f` on the states `request`'s set keeps for its key, under
    /// `shard`: each quota's entry found once, updated in place where it
    /// exists, and the new ones stored once `f` returns.
    #[inline]
    pub(super) fn in_set<R>(
        &self,
        shard: &mut Entries<'_>,
        request: &CheckRequest<'_>,
        now: u64,
        f: impl FnOnce(&mut Stored<'_, '_>) -> R,
    ) -> R {
        let positions = positions(shard, request);
        let mut stored = self.stored(shard, &positions, request, now);
        let result = f(&mut stored);
        stored.store_new();
        result
    }

    /// [`in_set`](Self::in_set) for a settle (`f` gives back or charges),
    /// then what is left: a peek at cost 0 under the same lock, which
    /// finds again the entries `f` had to store anew.
    pub(super) fn settle_in(
        &self,
        shard: &mut Entries<'_>,
        request: &CheckRequest<'_>,
        now: Timestamp,
        f: impl FnOnce(&mut Stored<'_, '_>),
    ) -> Decision {
        let mut positions = positions(shard, request);
        let mut stored = self.stored(shard, &positions, request, now.as_micros());
        f(&mut stored);
        if !stored.new.is_empty() {
            stored.store_new();
            positions = self::positions(shard, request);
            stored = self.stored(shard, &positions, request, now.as_micros());
        }
        request.quotas.evaluate(&mut stored, 0, now, false, false)
    }

    #[inline(always)]
    fn stored<'a, 'b>(
        &'a self,
        shard: &'a mut Entries<'b>,
        positions: &'a [Option<Position>],
        request: &'a CheckRequest<'a>,
        now: u64,
    ) -> Stored<'a, 'b> {
        Stored {
            shard,
            positions,
            new: SmallVec::new(),
            metrics: &self.inner.metrics,
            request,
            now,
        }
    }
}

/// Where each quota of `request`'s set keeps its entry for the key, if
/// anywhere.
#[inline(always)]
fn positions(shard: &Entries<'_>, request: &CheckRequest<'_>) -> SmallVec<[Option<Position>; 4]> {
    let mut positions = SmallVec::new();
    for &id in request.quotas.state_ids() {
        positions.push(shard.position_in_set(id, request.key));
    }
    positions
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
/// store. Out of line, so that the loop around the common case stays
/// short.
#[inline(never)]
fn sliding_window_checked(
    numbers: u128,
    q: &QuotaSet,
    cost: u64,
    now: u64,
    commit: bool,
) -> (
    Option<Result<sliding_window::Admitted, Decision>>,
    Option<u128>,
) {
    let p = &q.quotas()[0].params;
    checked_pair(numbers, p, |state| {
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
    })
}
