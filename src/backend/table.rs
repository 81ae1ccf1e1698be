//! A sharded, bounded map of `(id, key) -> value` that forgets what has
//! expired and, when full, evicts fairly: what the memory backend keeps its
//! states in, and the Redis backend its denials.
//!
//! Values come in three kinds, each in its own vector per shard: wide ones
//! (`V`), words (`N`, a state of one number in the memory backend)
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

use compact_str::CompactString;
use hashbrown::{HashMap, HashTable};

mod entries;
mod evict;
mod lock;
mod locked;

use lock::{Padded, ReadGuard, ShardLock, WriteGuard};

use entries::{ANY_CALLER, SET_LOOP, same_key};

/// How often, at most, a shard is swept for expired entries (microseconds).
const PURGE_EVERY: u64 = 1_000_000;
/// Random positions looked at to choose a victim; more when few of them
/// hold the id to evict from.
const SAMPLE: usize = 16;
const MAX_SAMPLE: usize = 256;
/// The bits of a position that say the entry is a word, or a pair; the
/// rest is its place in its vector.
const WORD: u32 = 1 << 31;
const PAIR: u32 = 1 << 30;
const KIND: u32 = WORD | PAIR;

/// A value that stops mattering at a known moment.
pub(crate) trait Expiring {
    /// Microseconds after which the entry means the same as no entry.
    fn expires_at(&self) -> u64;
}

pub(crate) struct Table<V, N = V, P = N> {
    shards: Shards<V, N, P>,
    hasher: foldhash::fast::RandomState,
    capacity: usize,
}

/// The shards, each behind its lock, each lock on its own cache line.
type Shards<V, N, P> = Box<[Padded<ShardLock<Shard<V, N, P>>>]>;

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

/// A shard's entries: wide ones, words and pairs.
struct Entries<V, N, P> {
    wide: Vec<Entry<V>>,
    word: Vec<Entry<N>>,
    pair: Vec<Entry<P>>,
}

struct Entry<V> {
    id: u64,
    /// Inline up to 24 bytes (an IP key, most API keys): no allocation, and
    /// no second cache miss to compare it.
    key: CompactString,
    value: V,
}

/// Where an entry is in its shard: its vector ([`WORD`] set or not) and
/// its place there. Valid until the next insert or removal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position(u32);

/// A value found in the table, of any kind.
pub(crate) enum Found<W, N, P = N> {
    Wide(W),
    Word(N),
    Pair(P),
}

impl<W, N, P> Found<&mut W, &mut N, &mut P> {
    /// The same entry, to read.
    pub(crate) fn shared(&self) -> Found<&W, &N, &P> {
        match self {
            Found::Wide(w) => Found::Wide(w),
            Found::Word(n) => Found::Word(n),
            Found::Pair(p) => Found::Pair(p),
        }
    }
}

/// One key's shard, locked to write: all of a key's ids live in the same
/// shard, so a decision over several of them is atomic.
pub(crate) struct Locked<'a, V, N = V, P = N> {
    shard: WriteGuard<'a, Shard<V, N, P>>,
    hasher: &'a foldhash::fast::RandomState,
    key_hash: u64,
}

/// One key's shard, locked to read: other readers of the shard go on at the
/// same time, so a value that updates itself atomically (a compare-and-swap)
/// is decided on without excluding anyone.
pub(crate) struct Read<'a, V, N, P> {
    shard: ReadGuard<'a, Shard<V, N, P>>,
    table: &'a Table<V, N, P>,
    index: usize,
    key_hash: u64,
}

/// The hash of `key`: `hash_one`'s, written out so that it inlines into
/// every check (`hash_one` is not `#[inline]`, and was left a call).
#[inline(always)]
#[allow(clippy::manual_hash_one)] // on purpose: see above
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
                Padded(ShardLock::new(Shard {
                    bound: (capacity / shards + usize::from(i < capacity % shards))
                        .min(PAIR as usize - 1),
                    entries: Entries {
                        wide: Vec::new(),
                        word: Vec::new(),
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
        self.shards.iter().map(|s| s.0.read().entries.len()).sum()
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
            shard: self.shards[index].0.write(),
            hasher: &self.hasher,
            key_hash,
        }
    }

    /// Locks the shard of `key` to read. Always inlined: left out of line
    /// on the paths of a fixed window and of two numbers, its call cost
    /// those checks 8-19 instructions more.
    #[inline(always)]
    pub(crate) fn read(&self, key: &str) -> Read<'_, V, N, P> {
        let (key_hash, index) = self.place(key);
        Read {
            shard: self.shards[index].0.read(),
            table: self,
            index,
            key_hash,
        }
    }
}

impl<'a, V: Expiring, N: Expiring, P: Expiring> Read<'a, V, N, P> {
    /// The word entry of `(id, key)`, if there is one: searched as
    /// [`by_id`](Self::by_id) does, over word entries (there is never a
    /// wide one of the same quota and key beside). Inlined always: the
    /// paths that read a word are inlined into the caller's check, and a
    /// call cost each ~25 instructions.
    #[inline(always)]
    pub(crate) fn word(&self, id: u64, key: &str) -> Option<&N> {
        let entries = &self.shard.entries;
        self.by_id(id, key, |at| entries.word.get(Position(at).word()?))
    }

    /// The pair entry of `(id, key)`, if there is one: searched as
    /// [`by_id`](Self::by_id) does, over pair entries. Inlined always, as
    /// [`word`](Self::word) is.
    #[inline(always)]
    pub(crate) fn pair(&self, id: u64, key: &str) -> Option<&P> {
        let entries = &self.shard.entries;
        self.by_id(id, key, |at| entries.pair.get(Position(at).pair()?))
    }

    /// The entry of `(id, key)` among one kind's (`entry` reads a position
    /// of the index as one of that kind, if it is), searched by id alone
    /// and the key compared once an entry is found (another key of the
    /// same id whose hash collides with this one is then searched for
    /// again, in full): the index calls its comparison through a
    /// `dyn FnMut`, which LLVM inlines only when it is small.
    #[inline(always)]
    fn by_id<'s, T: 's>(
        &'s self,
        id: u64,
        key: &str,
        entry: impl Fn(u32) -> Option<&'s Entry<T>>,
    ) -> Option<&'s T> {
        let hash = entry_hash(self.key_hash, id);
        let at = (self.shard.index).find(hash, |&at| entry(at).is_some_and(|e| e.id == id))?;
        let found = entry(*at)?;
        if same_key(found.key.as_bytes(), key.as_bytes()) {
            return Some(&found.value);
        }
        self.colliding(hash, id, key, entry)
    }

    /// [`by_id`](Self::by_id)'s search in full, for a key whose hash
    /// collides with another's of the same id.
    #[cold]
    #[inline(never)]
    fn colliding<'s, T: 's>(
        &'s self,
        hash: u64,
        id: u64,
        key: &str,
        entry: impl Fn(u32) -> Option<&'s Entry<T>>,
    ) -> Option<&'s T> {
        let at = (self.shard.index).find(hash, |&at| entry(at).is_some_and(|e| e.is(id, key)))?;
        Some(&entry(*at)?.value)
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

#[cfg(test)]
mod tests;
