//! A sharded, bounded map of `(id, key) -> value` that forgets what has
//! expired and, when full, evicts fairly: what the memory backend keeps its
//! states in, and the Redis backend its denials.
//!
//! Values come in three kinds, each in its own vector per shard: wide ones
//! (`V`), narrow ones (`N`, a state of one number in the memory backend)
//! and pairs (`P`, a state of two numbers swapped together), so that the
//! common one-word value does not take the space of the widest. Entries are found through one index of positions per shard,
//! so that a victim can be sampled at random positions (a hash table's own
//! order would always offer the same first entries, which a flood fills).
//!
//! Eviction has a budget per id (a quota's state id, or a quota set's): a
//! flood of new keys under one id evicts that id's own entries once it holds
//! its share of the shard, never another id's below its share, so a flood on
//! one rule cannot reset another rule's limits. Among the candidates, the one
//! that expires first goes: its loss forgives least, as it was closest to the
//! fresh state that forgetting it gives.

use std::hash::BuildHasher;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use compact_str::CompactString;
use hashbrown::{HashMap, HashTable};

use crate::sync::{read, write};

/// How often, at most, a shard is swept for expired entries (microseconds).
const PURGE_EVERY: u64 = 1_000_000;
/// Random positions looked at to choose a victim; more when few of them
/// hold the id to evict from.
const SAMPLE: usize = 16;
const MAX_SAMPLE: usize = 256;
/// The bits of a position that say the entry is narrow, or a pair; the
/// rest is its place in its vector.
const NARROW: u32 = 1 << 31;
const PAIR: u32 = 1 << 30;
const KIND: u32 = NARROW | PAIR;

/// A value that stops mattering at a known moment.
pub(crate) trait Expiring {
    /// Microseconds after which the entry means the same as no entry.
    fn expires_at(&self) -> u64;
}

pub(crate) struct Table<V, N = V, P = N> {
    shards: Box<[Padded<ShardLock<V, N, P>>]>,
    hasher: foldhash::fast::RandomState,
    capacity: usize,
}

type ShardLock<V, N, P> = RwLock<Shard<V, N, P>>;

/// Keeps each shard's lock on its own cache line.
#[repr(align(128))]
struct Padded<T>(T);

pub(crate) struct Shard<V, N, P> {
    /// The most entries this shard keeps, of both kinds.
    bound: usize,
    entries: Entries<V, N, P>,
    /// [`Position`]s in `entries`, by the entry's hash.
    index: HashTable<u32>,
    /// Entries per id, for the eviction budget.
    counts: HashMap<u64, u32, foldhash::fast::RandomState>,
    next_purge: u64,
    /// xorshift state for sampling; seeded at random, so a client cannot
    /// predict which positions are looked at.
    rng: u64,
}

/// Where an insert puts an entry: its kind's vector.
type Column<V, N, P, T> = fn(&mut Entries<V, N, P>) -> &mut Vec<Entry<T>>;

/// A shard's entries, wide, narrow and pairs.
struct Entries<V, N, P> {
    wide: Vec<Entry<V>>,
    narrow: Vec<Entry<N>>,
    pair: Vec<Entry<P>>,
}

struct Entry<V> {
    id: u64,
    /// Inline up to 24 bytes (an IP key, most API keys): no allocation, and
    /// no second cache miss to compare it.
    key: CompactString,
    value: V,
}

/// Where an entry is in its shard: its vector ([`NARROW`] set or not) and
/// its place there. Valid until the next insert or removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position(u32);

/// A value found in the table, of any kind.
pub(crate) enum Found<W, N, P = N> {
    Wide(W),
    Narrow(N),
    Pair(P),
}

impl<W, N, P> Found<&mut W, &mut N, &mut P> {
    /// The same entry, to read.
    pub(crate) fn shared(&self) -> Found<&W, &N, &P> {
        match self {
            Found::Wide(w) => Found::Wide(w),
            Found::Narrow(n) => Found::Narrow(n),
            Found::Pair(p) => Found::Pair(p),
        }
    }
}

/// One key's shard, locked to write: all of a key's ids live in the same
/// shard, so a decision over several of them is atomic.
pub(crate) struct Locked<'a, V, N = V, P = N> {
    shard: RwLockWriteGuard<'a, Shard<V, N, P>>,
    hasher: &'a foldhash::fast::RandomState,
    key_hash: u64,
}

/// One key's shard, locked to read: other readers of the shard go on at the
/// same time, so a value that updates itself atomically (a compare-and-swap)
/// is decided on without excluding anyone.
pub(crate) struct Read<'a, V, N, P> {
    shard: RwLockReadGuard<'a, Shard<V, N, P>>,
    table: &'a Table<V, N, P>,
    index: usize,
    key_hash: u64,
}

/// The hash of `key`: `hash_one`'s, written out so that it inlines into
/// every check (`hash_one` is not `#[inline]`, and was left a call).
#[inline(always)]
fn key_hash(hasher: &foldhash::fast::RandomState, key: &str) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = hasher.build_hasher();
    key.hash(&mut h);
    h.finish()
}

/// Where `(id, key)` lives in its shard's index.
fn entry_hash(key_hash: u64, id: u64) -> u64 {
    (key_hash ^ id).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl<V> Entry<V> {
    #[inline]
    fn is(&self, id: u64, key: &str) -> bool {
        self.id == id && same_key(self.key.as_bytes(), key.as_bytes())
    }
}

impl<V: Expiring, N: Expiring, P: Expiring> Table<V, N, P> {
    /// A table of at most `capacity` entries (at least one) over `shards`
    /// shards (rounded up to a power of two, and down to at most
    /// `capacity`). The bound is exact: the shards' own bounds add up to it
    /// (each at most 2^31 - 1, which positions can address).
    pub(crate) fn new(capacity: usize, shards: usize) -> Self {
        let capacity = capacity.max(1);
        let most = 1 << capacity.ilog2();
        let shards = shards.max(1).next_power_of_two().min(most);
        let hasher = foldhash::fast::RandomState::default();
        let shards = (0..shards)
            .map(|i| {
                Padded(RwLock::new(Shard {
                    bound: (capacity / shards + usize::from(i < capacity % shards))
                        .min(PAIR as usize - 1),
                    entries: Entries {
                        wide: Vec::new(),
                        narrow: Vec::new(),
                        pair: Vec::new(),
                    },
                    index: HashTable::new(),
                    counts: HashMap::with_hasher(hasher.clone()),
                    next_purge: 0,
                    rng: hasher.hash_one(i) | 1,
                }))
            })
            .collect();
        Table {
            shards,
            hasher,
            capacity,
        }
    }

    /// The most entries kept at once.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Entries stored now, expired ones not yet swept included.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| read(&s.0).entries.len()).sum()
    }

    /// The hash of `key` and the index of its shard.
    #[inline]
    fn place(&self, key: &str) -> (u64, usize) {
        let key_hash = key_hash(&self.hasher, key);
        (
            key_hash,
            (key_hash >> 40) as usize & (self.shards.len() - 1),
        )
    }

    /// Locks the shard of `key` to write.
    #[inline]
    pub(crate) fn lock(&self, key: &str) -> Locked<'_, V, N, P> {
        let (key_hash, index) = self.place(key);
        self.lock_at(index, key_hash)
    }

    #[inline]
    fn lock_at(&self, index: usize, key_hash: u64) -> Locked<'_, V, N, P> {
        Locked {
            shard: write(&self.shards[index].0),
            hasher: &self.hasher,
            key_hash,
        }
    }

    /// Locks the shard of `key` to read.
    #[inline]
    pub(crate) fn read(&self, key: &str) -> Read<'_, V, N, P> {
        let (key_hash, index) = self.place(key);
        Read {
            shard: read(&self.shards[index].0),
            table: self,
            index,
            key_hash,
        }
    }
}

impl<'a, V: Expiring, N: Expiring, P: Expiring> Read<'a, V, N, P> {
    /// The narrow entry of `(id, key)`, if there is one.
    ///
    /// Each hot path that reads one number calls its own instance.
    /// `NARROW_ONLY`: the search compares narrow entries alone, passing
    /// over a wide one of the same quota and key (there is never both),
    /// and by their id alone, the key compared once an entry is found
    /// (another key of the same id whose hash collides with this one is
    /// then searched for again, in full): the index calls its comparison
    /// through a `dyn FnMut`, which LLVM inlines only when it is small.
    /// Which is shorter was measured per path (guide::performance, "Notes
    /// on the hot path").
    #[inline]
    pub(crate) fn narrow<const NARROW_ONLY: bool>(&self, id: u64, key: &str) -> Option<&N> {
        let shard = &*self.shard;
        let entries = &shard.entries;
        let hash = entry_hash(self.key_hash, id);
        if NARROW_ONLY {
            let at = shard.index.find(hash, |&at| entries.narrow_id(at) == Some(id))?;
            let entry = entries.narrow.get(Position(*at).narrow()?)?;
            if same_key(entry.key.as_bytes(), key.as_bytes()) {
                return Some(&entry.value);
            }
            return self.narrow_colliding(hash, id, key);
        }
        let at = shard.index.find(hash, |&at| entries.is(at, id, key))?;
        Some(&entries.narrow.get(Position(*at).narrow()?)?.value)
    }

    /// [`narrow`](Self::narrow)'s search in full, for a key whose hash
    /// collides with another's of the same id.
    #[cold]
    #[inline(never)]
    fn narrow_colliding(&self, hash: u64, id: u64, key: &str) -> Option<&N> {
        let entries = &self.shard.entries;
        let at = self.shard.index.find(hash, |&at| entries.is_narrow(at, id, key))?;
        Some(&entries.narrow.get(Position(*at).narrow()?)?.value)
    }

    /// The pair entry of `(id, key)`, if there is one.
    #[inline]
    pub(crate) fn pair(&self, id: u64, key: &str) -> Option<&P> {
        let shard = &*self.shard;
        let entries = &shard.entries;
        let at = shard
            .index
            .find(entry_hash(self.key_hash, id), |&at| entries.is(at, id, key))?;
        Some(&entries.pair.get(Position(*at).pair()?)?.value)
    }

    /// The same shard locked to write instead (another writer may come
    /// between): for a key whose entry must be made.
    pub(crate) fn write(self) -> Locked<'a, V, N, P> {
        let Read {
            shard,
            table,
            index,
            key_hash,
        } = self;
        drop(shard);
        table.lock_at(index, key_hash)
    }
}

impl<V: Expiring, N: Expiring, P: Expiring> Locked<'_, V, N, P> {
    /// Where `(id, key)`'s entry is, for [`at`](Self::at) and
    /// [`at_mut`](Self::at_mut).
    #[inline]
    pub(crate) fn position(&self, id: u64, key: &str) -> Option<Position> {
        self.shard
            .find::<ANY_CALLER>(entry_hash(self.key_hash, id), id, key)
    }

    /// [`position`](Self::position) for the quotas of a set, in a loop: a
    /// search of its own (see [`Shard::find`]).
    #[inline]
    pub(crate) fn position_in_set(&self, id: u64, key: &str) -> Option<Position> {
        self.shard
            .find::<SET_LOOP>(entry_hash(self.key_hash, id), id, key)
    }

    /// The entry at a position found since the last insert or removal.
    pub(crate) fn at(&self, at: Position) -> Option<Found<&V, &N, &P>> {
        let entries = &self.shard.entries;
        let i = at.place();
        Some(match at.0 & KIND {
            NARROW => Found::Narrow(&entries.narrow.get(i)?.value),
            PAIR => Found::Pair(&entries.pair.get(i)?.value),
            _ => Found::Wide(&entries.wide.get(i)?.value),
        })
    }

    /// The entry at a position found since the last insert or removal.
    #[inline]
    pub(crate) fn at_mut(&mut self, at: Position) -> Option<Found<&mut V, &mut N, &mut P>> {
        let entries = &mut self.shard.entries;
        let i = at.place();
        Some(match at.0 & KIND {
            NARROW => Found::Narrow(&mut entries.narrow.get_mut(i)?.value),
            PAIR => Found::Pair(&mut entries.pair.get_mut(i)?.value),
            _ => Found::Wide(&mut entries.wide.get_mut(i)?.value),
        })
    }

    /// The wide entry of `(id, key)`, if there is one.
    #[cfg(test)]
    pub(crate) fn get(&self, id: u64, key: &str) -> Option<&V> {
        match self.at(self.position(id, key)?)? {
            Found::Wide(v) => Some(v),
            Found::Narrow(_) | Found::Pair(_) => None,
        }
    }

    /// The wide entry of `(id, key)`, if there is one.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // the Redis cache's
    #[inline]
    pub(crate) fn get_mut(&mut self, id: u64, key: &str) -> Option<&mut V> {
        match self.at_mut(self.position(id, key)?)? {
            Found::Wide(v) => Some(v),
            Found::Narrow(_) | Found::Pair(_) => None,
        }
    }

    /// Removes `(id, key)`'s entry, of either kind, if there is one.
    /// Returns how many entries the table gained (0 or -1).
    pub(crate) fn remove(&mut self, id: u64, key: &str) -> isize {
        match self.position(id, key) {
            Some(at) => {
                self.shard.remove_at(at, self.hasher);
                -1
            }
            None => 0,
        }
    }

    /// Stores a new wide entry (the caller found none for `(id, key)`),
    /// first sweeping expired entries when it is time to and evicting one if
    /// the shard is still full. Returns how many entries the table gained (1
    /// less those swept or evicted), so a size can be kept without a scan.
    pub(crate) fn insert(&mut self, id: u64, key: &str, value: V, now: u64) -> isize {
        self.insert_in(id, key, value, now, |e| &mut e.wide, 0)
    }

    /// [`insert`](Self::insert), for a narrow entry.
    pub(crate) fn insert_narrow(&mut self, id: u64, key: &str, value: N, now: u64) -> isize {
        self.insert_in(id, key, value, now, |e| &mut e.narrow, NARROW)
    }

    /// [`insert`](Self::insert), for a pair entry.
    pub(crate) fn insert_pair(&mut self, id: u64, key: &str, value: P, now: u64) -> isize {
        self.insert_in(id, key, value, now, |e| &mut e.pair, PAIR)
    }

    fn insert_in<T>(
        &mut self,
        id: u64,
        key: &str,
        value: T,
        now: u64,
        column: Column<V, N, P, T>,
        kind: u32,
    ) -> isize {
        let shard = &mut *self.shard;
        let hasher = self.hasher;
        let before = shard.entries.len();
        if now >= shard.next_purge {
            shard.purge(now, hasher);
            shard.next_purge = now.saturating_add(PURGE_EVERY);
        }
        if shard.entries.len() >= shard.bound {
            shard.evict_for(id, hasher);
        }
        let room = shard.bound.saturating_sub(shard.entries.len()).max(1);
        let column = column(&mut shard.entries);
        if column.len() == column.capacity() {
            // Grow by half, never past the bound: doubling would leave up to
            // half the vector unused for good.
            let more = (column.len() / 2).max(4).min(room);
            column.reserve_exact(more);
        }
        let at = kind | column.len() as u32;
        column.push(Entry {
            id,
            key: CompactString::new(key),
            value,
        });
        let entries = &shard.entries;
        shard
            .index
            .insert_unique(entry_hash(self.key_hash, id), at, |&at| {
                entries.hash(at, hasher)
            });
        *shard.counts.entry(id).or_default() += 1;
        shard.entries.len() as isize - before as isize
    }
}

impl Position {
    /// The place in the narrow vector, if the entry is narrow.
    #[inline]
    fn narrow(self) -> Option<usize> {
        (self.0 & KIND == NARROW).then_some((self.0 & !KIND) as usize)
    }

    /// The place in the pair vector, if the entry is a pair.
    #[inline]
    fn pair(self) -> Option<usize> {
        (self.0 & KIND == PAIR).then_some((self.0 & !KIND) as usize)
    }

    /// The place in its vector.
    #[inline]
    fn place(self) -> usize {
        (self.0 & !KIND) as usize
    }
}

impl<V: Expiring, N: Expiring, P: Expiring> Entries<V, N, P> {
    fn len(&self) -> usize {
        self.wide.len() + self.narrow.len() + self.pair.len()
    }

    /// The position of the `i`th entry, wide ones counted first, then
    /// narrow ones.
    fn nth(&self, i: usize) -> Position {
        match i.checked_sub(self.wide.len()) {
            None => Position(i as u32),
            Some(n) => match n.checked_sub(self.narrow.len()) {
                None => Position(NARROW | n as u32),
                Some(n) => Position(PAIR | n as u32),
            },
        }
    }

    /// Whether the entry at `at` is `(id, key)`'s.
    #[inline]
    fn is(&self, at: u32, id: u64, key: &str) -> bool {
        let i = Position(at).place();
        match at & KIND {
            NARROW => self.narrow.get(i).is_some_and(|e| e.is(id, key)),
            PAIR => self.pair.get(i).is_some_and(|e| e.is(id, key)),
            _ => self.wide.get(i).is_some_and(|e| e.is(id, key)),
        }
    }

    /// The id of the entry at `at`, if it is narrow.
    #[inline]
    fn narrow_id(&self, at: u32) -> Option<u64> {
        Some(self.narrow.get(Position(at).narrow()?)?.id)
    }

    /// Whether the entry at `at` is narrow and `(id, key)`'s.
    #[inline]
    fn is_narrow(&self, at: u32, id: u64, key: &str) -> bool {
        Position(at)
            .narrow()
            .is_some_and(|i| self.narrow.get(i).is_some_and(|e| e.is(id, key)))
    }

    /// The id, key and expiry of the entry at `at`.
    fn meta(&self, at: Position) -> Option<(u64, &str, u64)> {
        fn of<T: Expiring>(e: &Entry<T>) -> (u64, &str, u64) {
            (e.id, &e.key, e.value.expires_at())
        }
        let i = at.place();
        match at.0 & KIND {
            NARROW => self.narrow.get(i).map(of),
            PAIR => self.pair.get(i).map(of),
            _ => self.wide.get(i).map(of),
        }
    }

    /// The index hash of the entry at `at`, worked out again (not stored:
    /// 8 bytes per entry saved, for a hash only when entries move).
    fn hash(&self, at: u32, hasher: &foldhash::fast::RandomState) -> u64 {
        self.meta(Position(at))
            .map_or(0, |(id, key, _)| entry_hash(key_hash(hasher, key), id))
    }

    /// Removes the entry at `at`, moving the last of its vector into its
    /// place. Returns the moved entry's former position, if one moved.
    fn swap_remove(&mut self, at: Position) -> Option<u32> {
        fn take<T>(column: &mut Vec<Entry<T>>, i: usize, kind: u32) -> Option<u32> {
            if i >= column.len() {
                return None;
            }
            column.swap_remove(i);
            (i < column.len()).then_some(kind | column.len() as u32)
        }
        let i = at.place();
        match at.0 & KIND {
            NARROW => take(&mut self.narrow, i, NARROW),
            PAIR => take(&mut self.pair, i, PAIR),
            _ => take(&mut self.wide, i, 0),
        }
    }
}
/// Whether two keys are equal, compared without a call to `memcmp` for
/// keys of 4 to 32 bytes (an IP key, most API keys): their first and last
/// chunks overlap, so together they cover every byte.
#[inline]
fn same_key(a: &[u8], b: &[u8]) -> bool {
    fn ends<const N: usize>(a: &[u8], b: &[u8]) -> Option<bool> {
        Some(
            a.first_chunk::<N>()? == b.first_chunk::<N>()?
                && a.last_chunk::<N>()? == b.last_chunk::<N>()?,
        )
    }
    if a.len() != b.len() {
        return false;
    }
    match a.len() {
        16..=32 => ends::<16>(a, b),
        8..16 => ends::<8>(a, b),
        4..8 => ends::<4>(a, b),
        _ => None,
    }
    .unwrap_or_else(|| a == b)
}

/// [`Shard::find`]'s instances: the loop over a set's quotas, and every
/// other caller.
const ANY_CALLER: u8 = 0;
const SET_LOOP: u8 = 1;

impl<V: Expiring, N: Expiring, P: Expiring> Shard<V, N, P> {
    /// The position of `(id, key)`'s entry, whose index hash is `hash`.
    /// `SITE` sets apart a hot caller: each value is an instance of the
    /// index's search of its own, which with one caller LLVM inlines
    /// whole, key comparison included (guide::performance, "Notes on the hot path").
    #[inline]
    fn find<const SITE: u8>(&self, hash: u64, id: u64, key: &str) -> Option<Position> {
        let entries = &self.entries;
        self.index
            .find(hash, |&at| entries.is(at, id, key))
            .map(|&at| Position(at))
    }

    /// Removes the entry at `at`, moving the last of its kind into its
    /// place.
    fn remove_at(&mut self, at: Position, hasher: &foldhash::fast::RandomState) {
        let Some((id, _, _)) = self.entries.meta(at) else {
            return;
        };
        let hash = self.entries.hash(at.0, hasher);
        if let Ok(slot) = self.index.find_entry(hash, |&i| i == at.0) {
            slot.remove();
        }
        if let Some(old) = self.entries.swap_remove(at) {
            let hash = self.entries.hash(at.0, hasher);
            if let Some(slot) = self.index.find_mut(hash, |&i| i == old) {
                *slot = at.0;
            }
        }
        if let Some(count) = self.counts.get_mut(&id) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&id);
            }
        }
    }

    fn purge(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        for kind in [0, NARROW, PAIR] {
            let mut i = 0;
            while let Some((_, _, expires_at)) = self.entries.meta(Position(kind | i)) {
                if expires_at <= now {
                    self.remove_at(Position(kind | i), hasher);
                } else {
                    i += 1;
                }
            }
        }
    }

    /// Evicts one entry to make room for one of `id`: from `id`'s own
    /// entries once it holds its share of the shard, else from the id that
    /// holds the most.
    fn evict_for(&mut self, id: u64, hasher: &foldhash::fast::RandomState) {
        let share = self.entries.len() / self.counts.len().max(1);
        let own = self.counts.get(&id).map_or(0, |&n| n as usize);
        let from = if own >= share {
            id
        } else {
            match self.counts.iter().max_by_key(|&(_, &n)| n) {
                Some((&biggest, _)) => biggest,
                None => return,
            }
        };
        if let Some(victim) = self.sample(from) {
            self.remove_at(victim, hasher);
        }
    }

    /// The position of the entry of `id` that expires first among random
    /// positions; the whole shard is looked at only if sampling finds none.
    fn sample(&mut self, id: u64) -> Option<Position> {
        let len = self.entries.len();
        if len <= 2 * SAMPLE {
            return self.soonest(0..len, id);
        }
        let mut best: Option<(u64, Position)> = None;
        let mut looked = 0;
        while looked < MAX_SAMPLE && (looked < SAMPLE || best.is_none()) {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let at = self.entries.nth((self.rng % len as u64) as usize);
            if let Some((of, _, expires_at)) = self.entries.meta(at) {
                if of == id && best.is_none_or(|(soonest, _)| expires_at < soonest) {
                    best = Some((expires_at, at));
                }
            }
            looked += 1;
        }
        best.map(|(_, at)| at).or_else(|| self.soonest(0..len, id))
    }

    /// The position of the entry of `id` that expires first among the
    /// entries numbered `range` (wide ones counted first).
    fn soonest(&self, range: std::ops::Range<usize>, id: u64) -> Option<Position> {
        range
            .map(|i| self.entries.nth(i))
            .filter_map(|at| Some((at, self.entries.meta(at)?)))
            .filter(|&(_, (of, _, _))| of == id)
            .min_by_key(|&(_, (_, _, expires_at))| expires_at)
            .map(|(at, _)| at)
    }
}

#[cfg(test)]
mod tests;
