//! State in this process's memory.

use std::fmt;
use std::future::{Future, ready};
use std::sync::Arc;

use smallvec::SmallVec;

use entry::{
    Entries, Pair, Stored, Wide, Word, lend, pair_of, store_new, update, update_found, word_of,
};

use super::table::{Found, Position, Table};
use super::{Backend, BackendError, CheckRequest, GiveBackRequest, Reserved};
use crate::algorithm::State;
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::Decision;
use crate::metrics::MemoryMetrics;
use crate::quota::{Path, Quota};
use crate::quota_set::{arrival_decision, arrive};

mod entry;

/// Rate-limit state in this process's memory.
///
/// - **Concurrent**: keys are spread over many shards, each behind its own
///   read-write lock. A key with one quota of any algorithm but the sliding
///   log, once stored, is decided under the read lock, so threads on the
///   same key or shard never wait for each other: GCRA, the leaky bucket, a
///   token bucket whose token is a whole number of microseconds (100 a
///   second, not 3 per 10 s) and a fixed window under a million a second
///   keep one number, updated by compare-and-swap; any other token bucket
///   or fixed window, and a sliding window counting under 2^32, keep two,
///   updated by a 128-bit compare-and-swap. A sliding log, a set of several
///   quotas and a new key take the write lock for the few hundred
///   nanoseconds they last; a hot key stalls only the keys of its shard.
///   All quotas of one key live in one shard, so a multi-quota decision is
///   atomic.
/// - **Bounded**: at most [`max_keys`](MemoryBackendBuilder::max_keys) states
///   (one per key and quota; 1 000 000 by default). State that has expired
///   (it would mean the same as no state) is swept out as new keys arrive, at
///   most once a second per shard. When a shard is full of live state, one
///   entry is evicted, which forgets a key's history and lets it start
///   afresh, so eviction is careful whom it forgives: each quota has a budget
///   (a flood of new keys under one quota evicts that quota's own states once
///   it holds its share of the shard, never another quota's below its share:
///   a flood on one route cannot reset the login limit), and the victim is
///   the state closest to expiry, so closest to the fresh state it becomes,
///   among entries sampled at random positions.
/// - **No background task**: the sweeping happens on the insert path.
///
/// Memory per state, measured by `tests/memory_footprint.rs` (100 000 keys of
/// eight bytes, 64-bit target), the key included: about 61 bytes for GCRA,
/// the leaky bucket, such a token bucket and a fixed window under a million
/// a second, whose state is one number kept in a 40-byte entry (state id,
/// the key inline up to 24 bytes, the number); a state of two numbers (any
/// other token bucket or fixed window, a sliding window counting under
/// 2^32) is kept in a 48-byte entry; and about 105 bytes for a sliding
/// window counting more, whose 72-byte entry also holds an expiry and a
/// 32-byte state. Entries are in vectors grown by halves, plus a 4-byte
/// position in the index with its control byte and slack. At the bound,
/// with IP keys, that is about 51 and 83 bytes for the 40- and 72-byte
/// entries (`cargo bench --bench memory`). A key longer than 24 bytes adds its own
/// allocation, and a sliding log one of eight bytes per logged entry (at
/// most `limit`).
///
/// Clones share the same state.
#[derive(Clone)]
pub struct MemoryBackend<C = SystemClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    table: Table<Wide, Word, Pair>,
    clock: C,
    metrics: MemoryMetrics,
}

impl<C> Drop for Inner<C> {
    /// Takes this backend's states out of the process-wide gauge.
    fn drop(&mut self) {
        self.metrics.states_changed(-(self.table.len() as isize));
    }
}

impl<C> fmt::Debug for MemoryBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("shards", &self.inner.table.shard_count())
            .field("max_keys", &self.inner.table.capacity())
            .finish_non_exhaustive()
    }
}

impl MemoryBackend {
    /// A backend on the system clock with the default bounds.
    pub fn new() -> Self {
        MemoryBackend::builder().build()
    }

    /// A builder for the bounds and the clock.
    pub fn builder() -> MemoryBackendBuilder<SystemClock> {
        MemoryBackendBuilder {
            max_keys: 1_000_000,
            shards: None,
            clock: SystemClock,
        }
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

/// Builds a [`MemoryBackend`].
#[derive(Debug, Clone)]
#[must_use = "call .build() to get the backend"]
pub struct MemoryBackendBuilder<C> {
    max_keys: usize,
    shards: Option<usize>,
    clock: C,
}

impl<C: Clock> MemoryBackendBuilder<C> {
    /// The most states kept at once (one per key and quota), exactly: with
    /// fewer than the shard count, there are fewer shards.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The number of shards (rounded up to a power of two); by default 16 per
    /// available core, at least 64.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The clock (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<D: Clock>(self, clock: D) -> MemoryBackendBuilder<D> {
        MemoryBackendBuilder {
            max_keys: self.max_keys,
            shards: self.shards,
            clock,
        }
    }

    /// Builds the backend.
    pub fn build(self) -> MemoryBackend<C> {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let shards = self.shards.unwrap_or((cores * 16).max(64));
        MemoryBackend {
            inner: Arc::new(Inner {
                table: Table::new(self.max_keys, shards),
                clock: self.clock,
                metrics: MemoryMetrics::new(),
            }),
        }
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// How many states are stored now, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.inner.table.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most states kept at once.
    pub fn capacity(&self) -> usize {
        self.inner.table.capacity()
    }

    /// The hot path, inlined into the caller so the decision is built where
    /// it is returned: a stored arrival time decided under the read lock.
    /// The other one-quota sets with a lock-free or in-place path (a fixed
    /// window kept as one number, a sliding window) take it out of line, so
    /// that this stays small enough to inline; everything else is
    /// [`decide_locked`](Self::decide_locked).
    #[inline]
    fn decide(&self, request: CheckRequest<'_>) -> Decision {
        let now = self.now(&request);
        self.decide_at(request, now)
    }

    /// The time of `request`: on the system clock, the limiter's own
    /// reading of the counter.
    #[inline]
    fn now(&self, request: &CheckRequest<'_>) -> Timestamp {
        self.inner.clock.now_given(request.started.started_at())
    }

    /// [`decide`](Self::decide) at `now`: a set of one quota takes the
    /// path its quota was given when built, anything else the write lock.
    #[inline]
    fn decide_at(&self, request: CheckRequest<'_>, now: Timestamp) -> Decision {
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
                Path::SlidingWindow | Path::Pair => return self.decide_pair(request, now, *id),
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
        let Some(word) = shard.narrow::<true>(id, request.key) else {
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
    /// under the read lock. A sliding window's admission leaves what it
    /// reports to be computed only if read. Anything else (a new key, a
    /// state that no longer fits two numbers) takes the write lock.
    #[inline]
    fn decide_pair(&self, request: CheckRequest<'_>, now: Timestamp, id: u64) -> Decision {
        let shard = self.inner.table.read(request.key);
        if let Some(pair) = shard.pair(id, request.key) {
            let q = request.quotas;
            let quota = &q.quotas()[0];
            let (p, cost, now) = (&quota.params, request.cost, now.as_micros());
            let (commit, room) = (request.commit, request.room);
            let fast = quota.path == Path::SlidingWindow;
            let decided = update(&pair.0, |numbers| {
                let Some(state) = State::from_pair(numbers, p) else {
                    return (None, None);
                };
                if let (true, State::SlidingWindow(c)) = (fast, &state) {
                    if let Some((decision, after)) = q.admit_sliding_window(Some(c), cost, now) {
                        if !commit {
                            return (Some(decision), None);
                        }
                        let next = State::SlidingWindow(after).to_pair(p);
                        return (next.map(|_| decision), next);
                    }
                }
                let (decision, update) = q.evaluate_one(Some(&state), cost, now, commit, room);
                match pair_of(update, p) {
                    Ok(next) => (Some(decision), next),
                    Err(()) => (None, None),
                }
            });
            if let Some(decision) = decided {
                return decision;
            }
        }
        self.decide_locked(request, now, Some(shard.write()), None)
    }

    /// A one-quota fixed window kept as one number: swapped under the read
    /// lock once stored.
    #[inline]
    fn decide_fixed_window(&self, request: CheckRequest<'_>, now: Timestamp, id: u64) -> Decision {
        let shard = self.inner.table.read(request.key);
        if let Some(window) = shard.narrow::<false>(id, request.key) {
            let (q, cost, now) = (request.quotas, request.cost, now.as_micros());
            let commit = request.commit;
            return window.update(|n| word_of(q.evaluate_window(n, cost, now, commit)));
        }
        self.decide_locked(request, now, Some(shard.write()), None)
    }

    /// Decides under the shard's write lock (taken here unless given): a
    /// new key, a set of several quotas, or an algorithm whose state is
    /// more than one number. `found`: for a one-quota set whose caller
    /// looked its entry up under this lock already, where it is, if
    /// anywhere.
    #[inline(never)]
    fn decide_locked(
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
        // Each quota's entry found once: updated in place where it exists,
        // and only then the new ones stored.
        let mut positions = SmallVec::<[Option<Position>; 4]>::new();
        for &id in ids {
            positions.push(shard.position_in_set(id, key));
        }
        let mut stored = Stored {
            shard: &mut shard,
            positions: &positions,
            new: SmallVec::new(),
            metrics: &inner.metrics,
            request: &request,
            now: now_micros,
        };
        let decision =
            request
                .quotas
                .evaluate(&mut stored, request.cost, now, request.commit, request.room);
        stored.store_new();
        decision
    }
}

impl<C: Clock> MemoryBackend<C> {
    /// Removes `key`'s state of every quota of `quotas` under the shard's
    /// write lock (all of a key's quotas share one shard), so no decision
    /// sees some quotas reset and others not. A key without state is left
    /// as it is: no state already means a full quota.
    pub(crate) fn reset_now(&self, key: &str, quotas: &crate::QuotaSet) {
        let inner = &*self.inner;
        let mut shard = inner.table.lock(key);
        let removed: isize = quotas
            .state_ids()
            .iter()
            .map(|&id| shard.remove(id, key))
            .sum();
        drop(shard);
        inner.metrics.states_changed(removed);
    }

    /// A reservation: a committed decision, with its time.
    pub(crate) fn reserve_now(&self, request: CheckRequest<'_>) -> Reserved {
        let now = self.now(&request);
        Reserved::new(self.decide_at(request, now), now)
    }

    /// Gives back a reservation made here, under the shard's write lock
    /// (which also keeps out the compare-and-swap of one-number states).
    /// Returns what is left then (a peek at cost 0).
    /// [`Backend::charge`] without waiting: under the key's lock, as a
    /// give-back is.
    pub(crate) fn charge_now(&self, request: CheckRequest<'_>) -> Decision {
        let inner = &*self.inner;
        let (key, quotas) = (request.key, request.quotas);
        let now = self.now(&request).as_micros();
        let mut shard = inner.table.lock(key);
        let mut positions = SmallVec::<[Option<Position>; 4]>::new();
        for &id in quotas.state_ids() {
            positions.push(shard.position_in_set(id, key));
        }
        let mut stored = Stored {
            shard: &mut shard,
            positions: &positions,
            new: SmallVec::new(),
            metrics: &inner.metrics,
            request: &request,
            now,
        };
        quotas.charge_in(&mut stored, request.cost, now)
    }

    pub(crate) fn give_back_now(&self, request: GiveBackRequest<'_>) -> Decision {
        let reserved = request.reserved;
        let inner = &*self.inner;
        let (key, quotas) = (request.key, request.quotas);
        let check = CheckRequest {
            key,
            quotas,
            cost: request.cost,
            commit: true,
            room: false,
            started: crate::clock::Stopwatch::start(),
        };
        let now = self.now(&check).as_micros();
        let mut shard = inner.table.lock(key);
        let mut positions = SmallVec::<[Option<Position>; 4]>::new();
        for &id in quotas.state_ids() {
            positions.push(shard.position_in_set(id, key));
        }
        let mut stored = Stored {
            shard: &mut shard,
            positions: &positions,
            new: SmallVec::new(),
            metrics: &inner.metrics,
            request: &check,
            now,
        };
        let at = reserved.at().as_micros();
        let units = [request.cost, request.requests];
        let left = quotas.give_back_in(&mut stored, reserved.decision(), units, at, now);
        stored.store_new();
        left
    }
}

impl<C: Clock> Backend for MemoryBackend<C> {
    fn reserve<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Reserved, BackendError>> + Send + 'a {
        ready(Ok(self.reserve_now(request)))
    }

    fn give_back<'a>(
        &'a self,
        request: GiveBackRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        ready(Ok(self.give_back_now(request)))
    }

    fn charge<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        ready(Ok(self.charge_now(request)))
    }

    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        ready(Ok(self.decide(request)))
    }

    #[inline]
    fn check_now(&self, request: CheckRequest<'_>) -> Option<Result<Decision, BackendError>> {
        Some(Ok(self.decide(request)))
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a crate::QuotaSet,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a {
        self.reset_now(key, quotas);
        ready(Ok(()))
    }

    fn decides_now(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests;
