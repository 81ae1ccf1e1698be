//! State in this process's memory.

use std::fmt;
use std::future::{Future, ready};
use std::sync::Arc;

use entry::{Pair, Wide, Word};

use super::table::Table;
use super::{Backend, BackendError, CheckRequest, GiveBackRequest, Reserved};
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;
use crate::metrics::MemoryMetrics;

mod builder;
mod decide;
mod entry;
mod stored;

pub use builder::MemoryBackendBuilder;

/// Rate-limit state in this process's memory.
///
/// - **Concurrent**: keys are spread over many shards, each behind its own
///   read-write lock. A key with one quota of any algorithm but the sliding
///   log, once stored, is decided under the read lock, so threads on the
///   same key or shard never wait for each other: GCRA, the leaky bucket, a
///   token bucket whose token is a whole number of microseconds (100 a
///   second, not 3 per 10 s) and a fixed window under a million a second
///   keep one number, updated by compare-and-swap; any other token bucket
///   or fixed window, and a sliding window counting under 2^32, keep two:
///   one 64-bit word beside a frame that only the write lock changes, the
///   word updated by compare-and-swap as one number is. A sliding log, a
///   set of several quotas (which keeps its states of two numbers wide,
///   with no frame to decode) and a new key take the write lock for the
///   few hundred nanoseconds they last; a hot key stalls only the keys of
///   its shard.
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
/// 2^32) is kept in a 56-byte entry (the frame's two words and the word,
/// about 83 bytes a sliding window); and about 105 bytes for a sliding
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
    /// give-back is. Returns what is left then (a peek at cost 0).
    pub(crate) fn charge_now(&self, request: CheckRequest<'_>) -> Decision {
        let (quotas, cost) = (request.quotas, request.cost);
        let now = self.now(&request);
        let mut shard = self.inner.table.lock(request.key);
        let at = now.as_micros();
        self.settle_in(&mut shard, &request, now, |s| quotas.charge_in(s, cost, at))
    }

    /// Gives back a reservation made here, under the shard's write lock
    /// (which also keeps out the compare-and-swap of one-number states).
    /// Returns what is left then (a peek at cost 0).
    pub(crate) fn give_back_now(&self, request: GiveBackRequest<'_>) -> Decision {
        let (reserved, quotas) = (request.reserved, request.quotas);
        let check = CheckRequest {
            key: request.key,
            quotas,
            cost: request.cost,
            commit: true,
            room: false,
            started: crate::clock::Stopwatch::start(),
        };
        let now = self.now(&check);
        let mut shard = self.inner.table.lock(request.key);
        let (at, units) = (reserved.at().as_micros(), [request.cost, request.requests]);
        self.settle_in(&mut shard, &check, now, |s| {
            quotas.give_back_spent(s, reserved.decision(), units, at, now.as_micros());
        })
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
    fn check_now(&self, request: CheckRequest<'_>) -> super::Now {
        super::Now::Decided(Ok(self.decide(request)))
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a crate::QuotaSet,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a {
        self.reset_now(key, quotas);
        ready(Ok(()))
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}

#[cfg(test)]
mod tests;
