//! State in this process's memory.

use std::any::TypeId;
use std::fmt;
use std::future::{Future, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use smallvec::SmallVec;

use super::table::{Expiring, Locked, Table};
use super::{Backend, BackendError, CheckRequest};
use crate::algorithm::{State, Update};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::Decision;
use crate::metrics::MemoryMetrics;
use crate::quota::{Algorithm, Params};

/// Rate-limit state in this process's memory.
///
/// - **Concurrent**: keys are spread over many shards, each behind its own
///   read-write lock. A key with one GCRA or leaky-bucket quota, once
///   stored, is decided under the read lock: its one number is updated by
///   compare-and-swap, so threads on the same key or shard never wait for
///   each other. Other decisions take the write lock for the few hundred
///   nanoseconds they last; a hot key stalls only the keys of its shard. All
///   quotas of one key live in one shard, so a multi-quota decision is
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
/// eight bytes, 64-bit target): about 105 bytes for every fixed-size
/// algorithm, the key included. That is a 72-byte entry (state id, the key
/// inline up to 24 bytes, expiry, a 32-byte state) in a vector grown by
/// halves, plus a 4-byte position in the index with its control byte and
/// slack. At the bound, with IP keys, it is about 83 bytes
/// (`cargo bench --bench memory`). A key longer than 24 bytes adds its own
/// allocation, and a sliding log one of eight bytes per logged entry (at
/// most `limit`).
///
/// Clones share the same state.
#[derive(Clone)]
pub struct MemoryBackend<C = SystemClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    table: Table<Slot>,
    clock: C,
    metrics: MemoryMetrics,
}

impl<C> Drop for Inner<C> {
    /// Takes this backend's states out of the process-wide gauge.
    fn drop(&mut self) {
        self.metrics.states_changed(-(self.table.len() as isize));
    }
}

/// One quota's state for one key, with the moment it stops mattering.
///
/// GCRA and the leaky bucket keep one number, the theoretical arrival time,
/// which is also their expiry: for them `expires_at` is the state, updated
/// by compare-and-swap under the shard's read lock, and the copy in `state`
/// is brought up to date only under the write lock, before it is read.
struct Slot {
    expires_at: AtomicU64,
    state: State,
}

impl Expiring for Slot {
    fn expires_at(&self) -> u64 {
        self.expires_at.load(Relaxed)
    }
}

impl Slot {
    fn new(state: State, p: &Params) -> Self {
        Slot {
            expires_at: AtomicU64::new(state.expires_at(p)),
            state,
        }
    }

    /// The state, as the write lock's holder sees it.
    #[inline]
    fn current(&mut self) -> &State {
        if let State::Tat(tat) = &mut self.state {
            *tat = *self.expires_at.get_mut();
        }
        &self.state
    }

    #[inline(always)]
    fn update(&mut self, update: Update, p: &Params) {
        if update != Update::Keep {
            update.apply_to(&mut self.state, p);
            *self.expires_at.get_mut() = self.state.expires_at(p);
        }
    }

    /// Decides a one-quota request on a theoretical arrival time without
    /// the write lock: the time is read, the quota decided on it, and the
    /// new time swapped in only if nobody moved it meanwhile (else decided
    /// again on the newer time), as governor does.
    #[inline]
    fn decide_arrival(&self, request: &CheckRequest<'_>, now: u64) -> Decision {
        let mut tat = self.expires_at.load(Relaxed);
        loop {
            let (decision, update) = request.quotas.evaluate_arrival(
                tat,
                request.cost,
                now,
                request.commit,
                request.room,
            );
            // GCRA and the leaky bucket only ever keep or set the time.
            let Update::Set(State::Tat(next)) = update else {
                return decision;
            };
            match self
                .expires_at
                .compare_exchange_weak(tat, next, Relaxed, Relaxed)
            {
                Ok(_) => return decision,
                Err(moved) => tat = moved,
            }
        }
    }
}

/// Stores the first state of a key's quota, if the update makes one.
fn store_new(
    shard: &mut Locked<'_, Slot>,
    metrics: &MemoryMetrics,
    id: u64,
    key: &str,
    update: Update,
    p: &Params,
    now: u64,
) {
    let mut state = None;
    if update.apply(&mut state, p) {
        if let Some(state) = state {
            metrics.states_changed(shard.insert(id, key, Slot::new(state, p), now));
        }
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
    /// Everything else is [`decide_locked`](Self::decide_locked).
    #[inline]
    fn decide(&self, request: CheckRequest<'_>) -> Decision {
        let inner = &*self.inner;
        // On the system clock, the limiter's own reading of the counter.
        let now = if TypeId::of::<C>() == TypeId::of::<SystemClock>() {
            request.started.started_at()
        } else {
            inner.clock.now()
        };
        let key = request.key;
        if let ([id], [quota]) = (request.quotas.state_ids(), request.quotas.quotas()) {
            if matches!(quota.algorithm(), Algorithm::Gcra | Algorithm::LeakyBucket) {
                let shard = inner.table.read(key);
                if let Some(slot) = shard.get(*id, key) {
                    return slot.decide_arrival(&request, now.as_micros());
                }
                return self.decide_locked(request, now, Some(shard.write()));
            }
        }
        self.decide_locked(request, now, None)
    }

    /// Decides under the shard's write lock (taken here unless given): a
    /// new key, a set of several quotas, or an algorithm whose state is
    /// more than one number.
    #[inline(never)]
    fn decide_locked(
        &self,
        request: CheckRequest<'_>,
        now: Timestamp,
        shard: Option<Locked<'_, Slot>>,
    ) -> Decision {
        let inner = &*self.inner;
        let key = request.key;
        let mut shard = shard.unwrap_or_else(|| inner.table.lock(key));
        let ids = request.quotas.state_ids();
        let quotas = request.quotas.quotas();
        // One quota, the common case: one lookup, and the state updated in
        // place.
        if let ([id], [quota]) = (ids, quotas) {
            let mut slot = shard.get_mut(*id, key);
            let state = slot.as_deref_mut().map(Slot::current);
            let (decision, update) = request.quotas.evaluate_one(
                state,
                request.cost,
                now.as_micros(),
                request.commit,
                request.room,
            );
            match slot {
                Some(slot) => slot.update(update, &quota.params),
                None => store_new(
                    &mut shard,
                    &inner.metrics,
                    *id,
                    key,
                    update,
                    &quota.params,
                    now.as_micros(),
                ),
            }
            return decision;
        }
        // Each quota's entry found once: updated in place where it exists,
        // and only then the new ones stored, since an insert may sweep or
        // evict and so move entries.
        let mut positions = SmallVec::<[Option<usize>; 4]>::new();
        for &id in ids {
            let at = shard.position(id, key);
            if let Some(slot) = at.and_then(|at| shard.at_mut(at)) {
                slot.current();
            }
            positions.push(at);
        }
        let (decision, updates) = request.quotas.evaluate(
            |i| positions[i].and_then(|at| shard.at(at)).map(|s| &s.state),
            request.cost,
            now,
            request.commit,
            request.room,
        );
        let mut new = SmallVec::<[(u64, Update, &Params); 4]>::new();
        for (((update, &id), quota), at) in updates.into_iter().zip(ids).zip(quotas).zip(&positions)
        {
            match at.and_then(|at| shard.at_mut(at)) {
                Some(slot) => slot.update(update, &quota.params),
                None => new.push((id, update, &quota.params)),
            }
        }
        for (id, update, params) in new {
            store_new(
                &mut shard,
                &inner.metrics,
                id,
                key,
                update,
                params,
                now.as_micros(),
            );
        }
        decision
    }
}

impl<C: Clock> Backend for MemoryBackend<C> {
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

    fn decides_now(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}
