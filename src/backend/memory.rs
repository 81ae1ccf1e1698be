//! State in this process's memory.

use std::fmt;
use std::future::{Future, ready};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use smallvec::SmallVec;

use super::table::{Expiring, Found, Locked, Position, Table};
use super::{Backend, BackendError, CheckRequest, GiveBackRequest, Reserved};
use crate::algorithm::{State, Update};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::Decision;
use crate::metrics::MemoryMetrics;
use crate::quota::{Params, Path};
use crate::quota_set::States;

/// Rate-limit state in this process's memory.
///
/// - **Concurrent**: keys are spread over many shards, each behind its own
///   read-write lock. A key with one GCRA or leaky-bucket quota, one token
///   bucket whose token is a whole number of microseconds (100 a second,
///   not 3 per 10 s), or one fixed window under a million a second, once
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
/// eight bytes, 64-bit target), the key included: about 61 bytes for GCRA,
/// the leaky bucket, such a token bucket and a fixed window under a million
/// a second, whose state is one number kept in a 40-byte entry (state id,
/// the key inline up to 24 bytes, the number), and about 105 bytes for the
/// other fixed-size algorithms, whose 72-byte entry also holds an expiry
/// and a 32-byte state. Entries are in vectors grown by halves, plus a
/// 4-byte position in the index with its control byte and slack. At the
/// bound, with IP keys, that is about 51 and 83 bytes (`cargo bench --bench
/// memory`). A key longer than 24 bytes adds its own
/// allocation, and a sliding log one of eight bytes per logged entry (at
/// most `limit`).
///
/// Clones share the same state.
#[derive(Clone)]
pub struct MemoryBackend<C = SystemClock> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    table: Table<Wide, Word>,
    clock: C,
    metrics: MemoryMetrics,
}

impl<C> Drop for Inner<C> {
    /// Takes this backend's states out of the process-wide gauge.
    fn drop(&mut self) {
        self.metrics.states_changed(-(self.table.len() as isize));
    }
}

/// One quota's state for one key, with the moment it stops mattering: a
/// wide entry, for every state but one number (and for one that became one
/// number when its quota's algorithm changed).
struct Wide {
    expires_at: u64,
    state: State,
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

/// A state that is one number (`State::Word`): a GCRA or leaky-bucket
/// arrival time, the moment a token bucket is full again, or a fixed
/// window's end plus its count (see `algorithm`). A narrow entry, 40 bytes
/// with the key instead of 72. The number is never before the state's
/// expiry, so it serves as the expiry (exactly, but for a window's count
/// of microseconds), and it is updated by compare-and-swap under the
/// shard's read lock.
struct Word(AtomicU64);

impl Expiring for Word {
    fn expires_at(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl Word {
    /// The state it holds, for the algorithms. Inline: returned through
    /// memory, it is read back wider than it was written, and that load
    /// waits (a set's loop; BENCHMARKS.md, "Notes on the hot path").
    #[inline]
    fn state(&self) -> State {
        State::Word(self.0.load(Relaxed))
    }

    /// Applies `update` under the write lock, if the result is still one
    /// number; else hands back the state it makes, to be stored wide.
    fn apply(&mut self, update: Update, p: &Params) -> Option<State> {
        match update {
            Update::Keep => None,
            Update::Set(State::Word(n)) => {
                *self.0.get_mut() = n;
                None
            }
            update => {
                let mut state = Some(self.state());
                update.apply(&mut state, p);
                state
            }
        }
    }

    /// The one compare-and-swap loop: `decide` reads the number stored and
    /// returns its result and the number to store in its place (`None`:
    /// leave it), which is swapped in only if nobody moved the number
    /// meanwhile, else decided again on the newer one, as governor does.
    /// Generic, and inlined into each caller, so each algorithm's decision
    /// inlines into its own copy of the loop.
    #[inline(always)]
    fn update<R>(&self, mut decide: impl FnMut(u64) -> (R, Option<u64>)) -> R {
        let mut n = self.0.load(Relaxed);
        loop {
            let (result, next) = decide(n);
            let Some(next) = next else {
                return result;
            };
            match self.0.compare_exchange_weak(n, next, Relaxed, Relaxed) {
                Ok(_) => return result,
                Err(moved) => n = moved,
            }
        }
    }
}

/// The number a decision on a state of one number stores: such a state
/// only ever keeps or sets it.
#[inline(always)]
fn word_of((decision, update): (Decision, Update)) -> (Decision, Option<u64>) {
    match update {
        Update::Set(State::Word(next)) => (decision, Some(next)),
        _ => (decision, None),
    }
}

type Entries<'a> = Locked<'a, Wide, Word>;

/// Stores the first state of a key's quota, if the update makes one: one
/// number narrow, anything else wide. `replaces`: the quota has a
/// narrow entry that the state no longer fits (its algorithm changed),
/// removed first.
#[allow(clippy::too_many_arguments)]
fn store_new(
    shard: &mut Entries<'_>,
    metrics: &MemoryMetrics,
    id: u64,
    key: &str,
    update: Update,
    p: &Params,
    now: u64,
    replaces: bool,
) {
    if replaces {
        metrics.states_changed(shard.remove(id, key));
    }
    let mut state = None;
    if !update.apply(&mut state, p) {
        return;
    }
    let gained = match state {
        Some(State::Word(n)) => shard.insert_narrow(id, key, Word(AtomicU64::new(n)), now),
        Some(state) => {
            let expires_at = state.expires_at(p);
            shard.insert(id, key, Wide { expires_at, state }, now)
        }
        None => return,
    };
    metrics.states_changed(gained);
}

/// The states of a set's quotas, at the positions found for them, and the
/// updates that make new entries, kept until the decision is over (an
/// insert may sweep or evict, and so move entries): then
/// [`store_new`](Stored::store_new) stores them.
struct Stored<'a, 'b> {
    shard: &'a mut Entries<'b>,
    positions: &'a [Option<Position>],
    /// (quota, the update to store anew, whether it replaces a narrow
    /// entry)
    new: SmallVec<[(usize, Update, bool); 4]>,
    metrics: &'a MemoryMetrics,
    request: &'a CheckRequest<'a>,
    now: u64,
}

impl Stored<'_, '_> {
    /// Stores the new entries, once the decision is made.
    fn store_new(self) {
        // Most checks store nothing new (a refusal, or keys already
        // stored).
        if self.new.is_empty() {
            return;
        }
        let (ids, quotas) = (
            self.request.quotas.state_ids(),
            self.request.quotas.quotas(),
        );
        for (i, update, replaces) in self.new {
            if let (Some(&id), Some(quota)) = (ids.get(i), quotas.get(i)) {
                let key = self.request.key;
                let (p, now) = (&quota.params, self.now);
                store_new(self.shard, self.metrics, id, key, update, p, now, replaces);
            }
        }
    }
}

impl States for Stored<'_, '_> {
    #[inline]
    fn with<R>(&self, i: usize, f: impl FnOnce(Option<&State>) -> R) -> R {
        let at = self.positions.get(i).copied().flatten();
        lend(at.and_then(|at| self.shard.at(at)), f)
    }

    #[inline]
    fn store(&mut self, i: usize, update: Update, p: &Params) {
        // A refusal or a peek: nothing to find (every quota of a refused
        // set but the admitting ones).
        if matches!(update, Update::Keep) {
            return;
        }
        let at = self.positions.get(i).copied().flatten();
        if let Some((update, replaces)) =
            update_found(at.and_then(|at| self.shard.at_mut(at)), update, p)
        {
            self.new.push((i, update, replaces));
        }
    }
}

/// Calls `f` with the state of an entry found: a wide entry's, lent, or a
/// narrow entry's number made into one.
#[inline]
fn lend<R>(found: Option<Found<&Wide, &Word>>, f: impl FnOnce(Option<&State>) -> R) -> R {
    let word;
    // One call of `f`, not one per arm: it inlines a whole decision.
    let state = match found {
        Some(Found::Wide(slot)) => Some(&slot.state),
        Some(Found::Narrow(n)) => {
            word = n.state();
            Some(&word)
        }
        None => None,
    };
    f(state)
}

/// Applies `update` to the entry found for a quota, in place. Returns what
/// must be stored as a new entry instead, if anything, and whether it
/// replaces the narrow entry found (one whose algorithm changed).
#[inline]
fn update_found(
    found: Option<Found<&mut Wide, &mut Word>>,
    update: Update,
    p: &Params,
) -> Option<(Update, bool)> {
    match found {
        Some(Found::Wide(slot)) => {
            slot.apply(update, p);
            None
        }
        Some(Found::Narrow(a)) => a.apply(update, p).map(|state| (Update::Set(state), true)),
        None => Some((update, false)),
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

    /// [`decide`](Self::decide) at `now`.
    #[inline]
    fn decide_at(&self, request: CheckRequest<'_>, now: Timestamp) -> Decision {
        let inner = &*self.inner;
        let key = request.key;
        if let ([id], [quota]) = (request.quotas.state_ids(), request.quotas.quotas()) {
            if quota.kept_as_arrival() {
                let shard = inner.table.read(key);
                if let Some(word) = shard.narrow::<false>(*id, key) {
                    let (q, cost, now) = (request.quotas, request.cost, now.as_micros());
                    let (commit, room) = (request.commit, request.room);
                    return word
                        .update(|tat| word_of(q.evaluate_arrival(tat, cost, now, commit, room)));
                }
                return self.decide_locked(request, now, Some(shard.write()), None);
            }
            if quota.path == Path::Window {
                return self.decide_fixed_window(request, now, *id);
            }
            if quota.path == Path::SlidingWindow {
                return self.decide_sliding_window(request, now, *id, &quota.params);
            }
        }
        self.decide_locked(request, now, None, None)
    }

    /// A one-quota sliding window found stored: an admission updates its
    /// counters in place, and what it reports is computed only if read.
    /// Anything else (a refusal: every request of a flood; a new key) is
    /// left to `decide_locked`, with what the lookup found.
    #[inline(never)]
    fn decide_sliding_window(
        &self,
        request: CheckRequest<'_>,
        now: Timestamp,
        id: u64,
        p: &Params,
    ) -> Decision {
        let mut shard = self.inner.table.lock(request.key);
        let Some(at) = shard.position(id, request.key) else {
            // A new key: looked up once, not again.
            return self.decide_locked(request, now, Some(shard), Some(None));
        };
        if let Some(Found::Wide(slot)) = shard.at_mut(at) {
            if let State::SlidingWindow(counters) = &mut slot.state {
                let (cost, now) = (request.cost, now.as_micros());
                let admitted = request
                    .quotas
                    .admit_sliding_window(Some(counters), cost, now);
                if let Some((decision, after)) = admitted {
                    if request.commit {
                        // In place: the state stays a sliding window's.
                        *counters = after;
                        slot.expires_at = after.expires_at(p.period.get());
                    }
                    return decision;
                }
            }
        }
        self.decide_locked(request, now, Some(shard), Some(Some(at)))
    }

    /// A one-quota fixed window kept as one number: swapped under the read
    /// lock once stored.
    #[inline(never)]
    fn decide_fixed_window(&self, request: CheckRequest<'_>, now: Timestamp, id: u64) -> Decision {
        let shard = self.inner.table.read(request.key);
        if let Some(window) = shard.narrow::<true>(id, request.key) {
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
            let (decision, update) = lend(found.as_ref().map(Found::shared), |state| {
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
    /// A reservation: a committed decision, with its time.
    pub(crate) fn reserve_now(&self, request: CheckRequest<'_>) -> Reserved {
        let now = self.now(&request);
        Reserved::new(self.decide_at(request, now), now)
    }

    /// Gives back a reservation made here, under the shard's write lock
    /// (which also keeps out the compare-and-swap of one-number states).
    /// Returns what is left then (a peek at cost 0).
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
        let left = quotas.give_back_in(&mut stored, reserved.decision(), request.cost, at, now);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limiter, ManualClock, Quota, QuotaSet};
    use std::time::Duration;

    fn kind<C>(backend: &MemoryBackend<C>, id: u64, key: &str) -> Option<&'static str> {
        let shard = backend.inner.table.lock(key);
        match shard.at(shard.position(id, key)?)? {
            Found::Wide(_) => Some("wide"),
            Found::Narrow(_) => Some("narrow"),
        }
    }

    #[test]
    fn states_of_one_number_are_stored_narrow_and_other_states_wide() {
        let gcra = Quota::gcra(5, Duration::from_secs(1)).build().unwrap();
        let window = Quota::sliding_window(5, Duration::from_secs(1))
            .name("window")
            .build()
            .unwrap();
        let set = QuotaSet::new("both", [gcra.clone(), window]).unwrap();
        let backend = MemoryBackend::new();
        let both = Limiter::new(backend.clone(), set.clone());
        let alone = Limiter::new(backend.clone(), gcra);
        for _ in 0..5 {
            assert!(both.check_now("k", 1).unwrap().unwrap().allowed());
            assert!(alone.check_now("k", 1).unwrap().unwrap().allowed());
        }
        assert!(!both.check_now("k", 1).unwrap().unwrap().allowed());
        assert!(!alone.check_now("k", 1).unwrap().unwrap().allowed());
        let ids = set.state_ids();
        assert_eq!(kind(&backend, ids[0], "k"), Some("narrow"));
        assert_eq!(kind(&backend, ids[1], "k"), Some("wide"));
        let alone_id = alone.quotas().state_ids()[0];
        assert_eq!(kind(&backend, alone_id, "k"), Some("narrow"));
        assert_eq!(backend.len(), 3);
        // A token bucket is one number when a token is whole microseconds,
        // and a fixed window under one unit a microsecond.
        let ten = Duration::from_secs(10);
        let cases = [
            (Quota::token_bucket(5, ten), "narrow"),
            (Quota::token_bucket(3, ten), "wide"),
            (Quota::fixed_window(5, ten), "narrow"),
            (Quota::fixed_window(2, Duration::from_micros(2)), "wide"),
        ];
        // A clock that stands still, for the window of two microseconds.
        let clock = ManualClock::new(Timestamp::from_micros(1_760_000_000_000_000));
        let backend = MemoryBackend::builder().clock(clock).build();
        for (q, kept) in cases {
            let q = q.build().unwrap();
            let limiter = Limiter::new(backend.clone(), q.clone());
            for _ in 0..q.limit() {
                assert!(limiter.check_now("k", 1).unwrap().unwrap().allowed());
            }
            assert!(!limiter.check_now("k", 1).unwrap().unwrap().allowed());
            let id = limiter.quotas().state_ids()[0];
            assert_eq!(kind(&backend, id, "k"), Some(kept), "{q:?}");
        }
    }

    #[test]
    fn one_number_found_where_another_state_belongs_moves_wide() {
        // Ids include the algorithm, so only a hash collision puts an
        // arrival time under a sliding window's id: forged here, for a set
        // of one quota and for a set of two.
        let window = Quota::sliding_window(5, Duration::from_secs(1))
            .name("window")
            .build()
            .unwrap();
        let gcra = Quota::gcra(5, Duration::from_secs(1)).build().unwrap();
        let one = QuotaSet::new("one", [window.clone()]).unwrap();
        let two = QuotaSet::new("two", [gcra, window]).unwrap();
        for set in [one, two] {
            let backend = MemoryBackend::new();
            let id = *set.state_ids().last().unwrap();
            let inner = &*backend.inner;
            inner
                .table
                .lock("k")
                .insert_narrow(id, "k", Word(AtomicU64::new(u64::MAX >> 12)), 0);
            let limiter = Limiter::new(backend.clone(), set.clone());
            for _ in 0..5 {
                assert!(limiter.check_now("k", 1).unwrap().unwrap().allowed());
            }
            assert!(!limiter.check_now("k", 1).unwrap().unwrap().allowed());
            assert_eq!(kind(&backend, id, "k"), Some("wide"), "{}", set.name());
            assert_eq!(backend.len(), set.quotas().len());
        }
    }
}
