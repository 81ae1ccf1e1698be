//! One check decided: the path its quota was given when built, each
//! found entry swapped without a lock where its state allows, and
//! everything else under the shard's write lock.

use smallvec::SmallVec;

mod two_numbers;

use super::entry::{Entries, lend, store_new, update_found, word_of};
use super::stored::Stored;
use super::{CheckRequest, MemoryBackend};
use crate::algorithm::{State, fixed_window};
use crate::backend::table::{Found, Position};
use crate::clock::{Clock, Timestamp};
use crate::decision::Decision;
use crate::quota::{Path, Quota};
use crate::quota_set::{arrival_decision, arrive};

impl<C: Clock> MemoryBackend<C> {
    /// One check, inlined into the caller so the decision is built where
    /// it is returned: see [`decide_at`](Self::decide_at).
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
    /// The hot path (an arrival time) is tested alone, first: in one
    /// `match` with the others it became a jump table, its loads and an
    /// indirect jump on every check. The other common paths (a fixed
    /// window, a sliding window, a token bucket's two numbers) are inlined
    /// here too: out of line, each paid a call and a prologue of its own
    /// (27-37 instructions a check), where inlined they cost the hot path
    /// at most ~4 (GCRA 324-325 before, 326-329 after, counted side by
    /// side). The rare ones are out of line.
    #[inline]
    pub(super) fn decide_at(&self, request: CheckRequest<'_>, now: Timestamp) -> Decision {
        if let ([id], [quota]) = (request.quotas.state_ids(), request.quotas.quotas()) {
            if quota.path == Path::Arrival {
                return self.decide_arrival(request, now, *id, quota);
            }
            match quota.path {
                Path::SlidingWindow => return self.decide_sliding_window(request, now, *id),
                Path::Bucket | Path::BucketWord => {
                    let in_word = quota.path == Path::BucketWord;
                    return self.decide_bucket(request, now, *id, in_word);
                }
                Path::Window => return self.decide_fixed_window(request, now, *id),
                Path::WindowPair | Path::Pair => return self.decide_pair(request, now, *id),
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
        let Some(word) = shard.word(id, request.key) else {
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

    /// A one-quota fixed window kept as one number: swapped under the read
    /// lock once stored.
    #[inline]
    fn decide_fixed_window(&self, request: CheckRequest<'_>, now: Timestamp, id: u64) -> Decision {
        let shard = self.inner.table.read(request.key);
        if let Some(window) = shard.word(id, request.key) {
            let (q, cost, now) = (request.quotas, request.cost, now.as_micros());
            let (commit, p) = (request.commit, &q.quotas()[0].params);
            let end = fixed_window::end_at(p, now);
            let counted = window.update(|n| {
                let counted = fixed_window::count_word(n, end, p, cost, now);
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
                    &mut shard, metrics, *id, key, update, p, now_micros, replaces, true,
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
