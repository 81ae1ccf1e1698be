//! State in this process's memory.

use std::fmt;
use std::future::{Future, ready};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::HashTable;

use super::{Backend, BackendError, CheckRequest};
use crate::algorithm::{State, Update};
use crate::clock::{Clock, SystemClock};
use crate::decision::Decision;

/// How often, at most, a shard is swept for expired state (microseconds).
const PURGE_EVERY: u64 = 1_000_000;
/// How many entries a full shard looks at to choose one to evict.
const EVICTION_SAMPLE: usize = 16;

/// Rate-limit state in this process's memory.
///
/// - **Concurrent**: keys are spread over many shards, each behind its own
///   lock, held only for the few hundred nanoseconds of a decision; a hot key
///   stalls only the keys of its shard. All quotas of one key live in one
///   shard, so a multi-quota decision is atomic.
/// - **Bounded**: at most [`max_keys`](MemoryBackendBuilder::max_keys) states
///   (one per key and quota; 1 000 000 by default). State that has expired
///   (it would mean the same as no state) is swept out as new keys arrive, at
///   most once a second per shard; when a shard is full of live state, the
///   entry closest to expiry among a sample is evicted, which at worst forgets
///   a key's history and lets it start afresh.
/// - **No background task**: the sweeping happens on the insert path.
///
/// Memory per state, measured by `tests/memory_footprint.rs` (100 000 keys of
/// eight bytes, 64-bit target): about 93 bytes for every fixed-size algorithm,
/// the eight key bytes included. That is a 64-byte entry (key pointer, state
/// id, expiry, a 32-byte state) plus the hash table's control byte and growth
/// slack. A sliding log adds its own allocation of eight bytes per logged entry
/// (at most `limit`): 157 bytes per key at one entry.
///
/// Clones share the same state.
#[derive(Clone)]
pub struct MemoryBackend<C = SystemClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    shards: Box<[Padded<Mutex<Shard>>]>,
    hasher: foldhash::fast::RandomState,
    per_shard: usize,
    clock: C,
}

/// Keeps each shard's lock on its own cache line.
#[repr(align(128))]
struct Padded<T>(T);

struct Shard {
    table: HashTable<Entry>,
    next_purge: u64,
}

struct Entry {
    /// Which quota's state (see [`QuotaSet::state_ids`](crate::QuotaSet::state_ids)).
    id: u64,
    expires_at: u64,
    key: Box<str>,
    state: State,
}

impl<C> fmt::Debug for MemoryBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("shards", &self.inner.shards.len())
            .field(
                "max_keys",
                &(self.inner.per_shard * self.inner.shards.len()),
            )
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
    /// The most states kept at once (one per key and quota), at least one per
    /// shard.
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
        let shards = self
            .shards
            .unwrap_or((cores * 16).max(64))
            .next_power_of_two();
        let per_shard = self.max_keys.div_ceil(shards).max(1);
        let shards = (0..shards)
            .map(|_| {
                Padded(Mutex::new(Shard {
                    table: HashTable::new(),
                    next_purge: 0,
                }))
            })
            .collect();
        MemoryBackend {
            inner: Arc::new(Inner {
                shards,
                hasher: foldhash::fast::RandomState::default(),
                per_shard,
                clock: self.clock,
            }),
        }
    }
}

/// The table hash of one quota's state for one key.
fn entry_hash(key_hash: u64, id: u64) -> u64 {
    (key_hash ^ id).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl<C: Clock> MemoryBackend<C> {
    /// How many states are stored now, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| lock(&s.0).table.len())
            .sum()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most states kept at once.
    pub fn capacity(&self) -> usize {
        self.inner.per_shard * self.inner.shards.len()
    }

    fn decide(&self, request: CheckRequest<'_>) -> Decision {
        let inner = &*self.inner;
        let now = inner.clock.now();
        let key = request.key;
        let key_hash = inner.hasher.hash_one(key);
        let shard_index = (key_hash >> 40) as usize & (inner.shards.len() - 1);
        let mut shard = lock(&inner.shards[shard_index].0);
        let shard = &mut *shard;
        let ids = request.quotas.state_ids();
        let quotas = request.quotas.quotas();
        let matches = |id: u64| move |e: &Entry| e.id == id && &*e.key == key;
        // One quota, the common case: one lookup, and the state updated in
        // place.
        if let ([id], [quota]) = (ids, quotas) {
            let hash = entry_hash(key_hash, *id);
            let entry = shard.table.find_mut(hash, matches(*id));
            let (decision, mut updates) = request.quotas.evaluate(
                |_| entry.as_deref().map(|e| &e.state),
                request.cost,
                now,
                request.commit,
            );
            let update = updates.pop().unwrap_or(Update::Keep);
            match entry {
                Some(entry) => entry.update(update, &quota.params),
                None => shard.insert(
                    inner,
                    key,
                    key_hash,
                    *id,
                    update,
                    &quota.params,
                    now.as_micros(),
                ),
            }
            return decision;
        }
        let table = &shard.table;
        let (decision, updates) = request.quotas.evaluate(
            |i| {
                let id = ids[i];
                table
                    .find(entry_hash(key_hash, id), matches(id))
                    .map(|e| &e.state)
            },
            request.cost,
            now,
            request.commit,
        );
        for ((update, &id), quota) in updates.into_iter().zip(ids).zip(quotas) {
            let hash = entry_hash(key_hash, id);
            match shard.table.find_mut(hash, matches(id)) {
                Some(entry) => entry.update(update, &quota.params),
                None => shard.insert(
                    inner,
                    key,
                    key_hash,
                    id,
                    update,
                    &quota.params,
                    now.as_micros(),
                ),
            }
        }
        decision
    }
}

impl Entry {
    /// Its place in the table, worked out again (the hash is not stored).
    fn hash(&self, hasher: &foldhash::fast::RandomState) -> u64 {
        entry_hash(hasher.hash_one(&*self.key), self.id)
    }

    fn update(&mut self, update: Update, p: &crate::quota::Params) {
        if update != Update::Keep {
            update.apply_to(&mut self.state, p);
            self.expires_at = self.state.expires_at(p);
        }
    }
}

impl Shard {
    /// Stores the first state of a key's quota, making room if needed.
    #[allow(clippy::too_many_arguments)]
    fn insert<C>(
        &mut self,
        inner: &Inner<C>,
        key: &str,
        key_hash: u64,
        id: u64,
        update: Update,
        p: &crate::quota::Params,
        now: u64,
    ) {
        let mut slot = None;
        if !update.apply(&mut slot, p) {
            return;
        }
        let Some(state) = slot else { return };
        self.make_room(inner.per_shard, now, &inner.hasher);
        let entry = Entry {
            id,
            expires_at: state.expires_at(p),
            key: key.into(),
            state,
        };
        let hasher = &inner.hasher;
        self.table
            .insert_unique(entry_hash(key_hash, id), entry, |e| e.hash(hasher));
    }

    /// Sweeps expired state when it is time to, and evicts one entry if the
    /// shard is still full.
    fn make_room(&mut self, per_shard: usize, now: u64, hasher: &foldhash::fast::RandomState) {
        if now >= self.next_purge {
            self.table.retain(|e| e.expires_at > now);
            self.next_purge = now.saturating_add(PURGE_EVERY);
        }
        if self.table.len() < per_shard {
            return;
        }
        // The entry closest to expiry among a sample; found again by its
        // hash, and told apart by the address of its key, without a scan.
        let victim = self
            .table
            .iter()
            .take(EVICTION_SAMPLE)
            .min_by_key(|e| e.expires_at)
            .map(|e| (e.hash(hasher), e.id, e.key.as_ptr()));
        if let Some((hash, id, key)) = victim {
            if let Ok(entry) = self
                .table
                .find_entry(hash, |e| e.id == id && e.key.as_ptr() == key)
            {
                entry.remove();
            }
        }
    }
}

/// A poisoned shard lock means a panic elsewhere while holding it; the state
/// inside is still a valid rate-limit state, so carry on with it rather than
/// fail every later request.
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<C: Clock> Backend for MemoryBackend<C> {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        ready(Ok(self.decide(request)))
    }

    fn check_now(&self, request: CheckRequest<'_>) -> Option<Result<Decision, BackendError>> {
        Some(Ok(self.decide(request)))
    }

    fn decides_now(&self) -> bool {
        true
    }
}
