//! A sharded, bounded map of `(id, key) -> value` that forgets what has
//! expired and, when full, evicts fairly: what the memory backend keeps its
//! states in, and the Redis backend its denials.
//!
//! Entries live in a vector per shard, found through an index of positions,
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

/// A value that stops mattering at a known moment.
pub(crate) trait Expiring {
    /// Microseconds after which the entry means the same as no entry.
    fn expires_at(&self) -> u64;
}

pub(crate) struct Table<V> {
    shards: Box<[Padded<RwLock<Shard<V>>>]>,
    hasher: foldhash::fast::RandomState,
    capacity: usize,
}

/// Keeps each shard's lock on its own cache line.
#[repr(align(128))]
struct Padded<T>(T);

pub(crate) struct Shard<V> {
    /// The most entries this shard keeps.
    bound: usize,
    entries: Vec<Entry<V>>,
    /// Positions in `entries`, by the entry's hash.
    index: HashTable<u32>,
    /// Entries per id, for the eviction budget.
    counts: HashMap<u64, u32, foldhash::fast::RandomState>,
    next_purge: u64,
    /// xorshift state for sampling; seeded at random, so a client cannot
    /// predict which positions are looked at.
    rng: u64,
}

struct Entry<V> {
    id: u64,
    /// Inline up to 24 bytes (an IP key, most API keys): no allocation, and
    /// no second cache miss to compare it.
    key: CompactString,
    value: V,
}

/// One key's shard, locked to write: all of a key's ids live in the same
/// shard, so a decision over several of them is atomic.
pub(crate) struct Locked<'a, V> {
    shard: RwLockWriteGuard<'a, Shard<V>>,
    hasher: &'a foldhash::fast::RandomState,
    key_hash: u64,
}

/// One key's shard, locked to read: other readers of the shard go on at the
/// same time, so a value that updates itself atomically (a compare-and-swap)
/// is decided on without excluding anyone.
pub(crate) struct Read<'a, V> {
    shard: RwLockReadGuard<'a, Shard<V>>,
    table: &'a Table<V>,
    index: usize,
    key_hash: u64,
}

/// Where `(id, key)` lives in its shard's index.
fn entry_hash(key_hash: u64, id: u64) -> u64 {
    (key_hash ^ id).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl<V> Entry<V> {
    /// Its place in the index, worked out again (not stored: 8 bytes per
    /// entry saved, for a hash only when entries move).
    fn hash(&self, hasher: &foldhash::fast::RandomState) -> u64 {
        entry_hash(hasher.hash_one(&*self.key), self.id)
    }
}

impl<V: Expiring> Table<V> {
    /// A table of at most `capacity` entries (at least one) over `shards`
    /// shards (rounded up to a power of two, and down to at most
    /// `capacity`). The bound is exact: the shards' own bounds add up to it.
    pub(crate) fn new(capacity: usize, shards: usize) -> Self {
        let capacity = capacity.max(1);
        let most = 1 << capacity.ilog2();
        let shards = shards.max(1).next_power_of_two().min(most);
        let hasher = foldhash::fast::RandomState::default();
        let shards = (0..shards)
            .map(|i| {
                Padded(RwLock::new(Shard {
                    bound: capacity / shards + usize::from(i < capacity % shards),
                    entries: Vec::new(),
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
        let key_hash = self.hasher.hash_one(key);
        (
            key_hash,
            (key_hash >> 40) as usize & (self.shards.len() - 1),
        )
    }

    /// Locks the shard of `key` to write.
    #[inline]
    pub(crate) fn lock(&self, key: &str) -> Locked<'_, V> {
        let (key_hash, index) = self.place(key);
        self.lock_at(index, key_hash)
    }

    #[inline]
    fn lock_at(&self, index: usize, key_hash: u64) -> Locked<'_, V> {
        Locked {
            shard: write(&self.shards[index].0),
            hasher: &self.hasher,
            key_hash,
        }
    }

    /// Locks the shard of `key` to read.
    #[inline]
    pub(crate) fn read(&self, key: &str) -> Read<'_, V> {
        let (key_hash, index) = self.place(key);
        Read {
            shard: read(&self.shards[index].0),
            table: self,
            index,
            key_hash,
        }
    }
}

impl<'a, V: Expiring> Read<'a, V> {
    /// The entry of `(id, key)`, if there is one.
    #[inline]
    pub(crate) fn get(&self, id: u64, key: &str) -> Option<&V> {
        let i = self.shard.find(entry_hash(self.key_hash, id), id, key)?;
        Some(&self.shard.entries[i].value)
    }

    /// The same shard locked to write instead (another writer may come
    /// between): for a key whose entry must be made.
    pub(crate) fn write(self) -> Locked<'a, V> {
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

impl<V: Expiring> Locked<'_, V> {
    /// Where `(id, key)`'s entry is, for [`at`](Self::at) and
    /// [`at_mut`](Self::at_mut): valid until the next insert or removal.
    #[inline]
    pub(crate) fn position(&self, id: u64, key: &str) -> Option<usize> {
        self.shard.find(entry_hash(self.key_hash, id), id, key)
    }

    /// The entry at a position found since the last insert or removal.
    pub(crate) fn at(&self, position: usize) -> Option<&V> {
        self.shard.entries.get(position).map(|e| &e.value)
    }

    /// The entry at a position found since the last insert or removal.
    pub(crate) fn at_mut(&mut self, position: usize) -> Option<&mut V> {
        self.shard.entries.get_mut(position).map(|e| &mut e.value)
    }

    #[cfg(test)]
    pub(crate) fn get(&self, id: u64, key: &str) -> Option<&V> {
        let i = self.position(id, key)?;
        Some(&self.shard.entries[i].value)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: u64, key: &str) -> Option<&mut V> {
        let i = self.position(id, key)?;
        Some(&mut self.shard.entries[i].value)
    }

    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // only the Redis cache removes
    pub(crate) fn remove(&mut self, id: u64, key: &str) {
        if let Some(i) = self.position(id, key) {
            self.shard.remove_at(i, self.hasher);
        }
    }

    /// Stores a new entry (the caller found none for `(id, key)`), first
    /// sweeping expired entries when it is time to and evicting one if the
    /// shard is still full. Returns how many entries the table gained (1
    /// less those swept or evicted), so a size can be kept without a scan.
    pub(crate) fn insert(&mut self, id: u64, key: &str, value: V, now: u64) -> isize {
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
        if shard.entries.len() == shard.entries.capacity() {
            // Grow by half, never past the bound: doubling would leave up to
            // half the vector unused for good, at 60-odd bytes an entry.
            let room = shard.bound.saturating_sub(shard.entries.len()).max(1);
            let more = (shard.entries.len() / 2).max(4).min(room);
            shard.entries.reserve_exact(more);
        }
        let hash = entry_hash(self.key_hash, id);
        let position = shard.entries.len() as u32;
        shard.entries.push(Entry {
            id,
            key: CompactString::new(key),
            value,
        });
        let entries = &shard.entries;
        shard
            .index
            .insert_unique(hash, position, |&i| entries[i as usize].hash(hasher));
        *shard.counts.entry(id).or_default() += 1;
        shard.entries.len() as isize - before as isize
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

impl<V: Expiring> Shard<V> {
    /// The position of `(id, key)`'s entry, whose index hash is `hash`.
    #[inline]
    fn find(&self, hash: u64, id: u64, key: &str) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(hash, |&i| {
                let e = &entries[i as usize];
                e.id == id && same_key(e.key.as_bytes(), key.as_bytes())
            })
            .map(|&i| i as usize)
    }

    /// Removes the entry at `position`, moving the last one into its place.
    fn remove_at(&mut self, position: usize, hasher: &foldhash::fast::RandomState) {
        let hash = self.entries[position].hash(hasher);
        if let Ok(slot) = self.index.find_entry(hash, |&i| i as usize == position) {
            slot.remove();
        }
        let removed = self.entries.swap_remove(position);
        if let Some(count) = self.counts.get_mut(&removed.id) {
            *count -= 1;
            if *count == 0 {
                self.counts.remove(&removed.id);
            }
        }
        if let Some(moved) = self.entries.get(position) {
            let old = self.entries.len() as u32;
            if let Some(slot) = self.index.find_mut(moved.hash(hasher), |&i| i == old) {
                *slot = position as u32;
            }
        }
    }

    fn purge(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        let mut i = 0;
        while i < self.entries.len() {
            if self.entries[i].value.expires_at() <= now {
                self.remove_at(i, hasher);
            } else {
                i += 1;
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
    fn sample(&mut self, id: u64) -> Option<usize> {
        let len = self.entries.len();
        if len <= 2 * SAMPLE {
            return self.soonest(0..len, id);
        }
        let mut best: Option<(u64, usize)> = None;
        let mut looked = 0;
        while looked < MAX_SAMPLE && (looked < SAMPLE || best.is_none()) {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let i = (self.rng % len as u64) as usize;
            let e = &self.entries[i];
            if e.id == id && best.is_none_or(|(at, _)| e.value.expires_at() < at) {
                best = Some((e.value.expires_at(), i));
            }
            looked += 1;
        }
        best.map(|(_, i)| i).or_else(|| self.soonest(0..len, id))
    }

    /// The position of the entry of `id` that expires first in `positions`.
    fn soonest(&self, positions: std::ops::Range<usize>, id: u64) -> Option<usize> {
        positions
            .filter(|&i| self.entries[i].id == id)
            .min_by_key(|&i| self.entries[i].value.expires_at())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Until(u64);

    impl Expiring for Until {
        fn expires_at(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn keys_compare_equal_exactly_when_their_bytes_do() {
        let base: Vec<u8> = (0..40u8).map(|b| b'a' + b % 26).collect();
        for len in 0..=40 {
            let a = &base[..len];
            assert!(same_key(a, a), "{len}");
            if len > 0 {
                assert!(!same_key(a, &base[..len - 1]), "{len}");
            }
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 1;
                assert!(!same_key(a, &b), "length {len}, byte {at}");
            }
        }
    }

    #[test]
    fn entries_are_found_updated_and_removed() {
        let table = Table::new(100, 4);
        let mut shard = table.lock("k");
        shard.insert(1, "k", Until(10), 0);
        shard.insert(2, "k", Until(20), 0);
        assert_eq!(shard.get(1, "k").map(|v| v.0), Some(10));
        if let Some(v) = shard.get_mut(2, "k") {
            v.0 = 30;
        }
        assert_eq!(shard.get(2, "k").map(|v| v.0), Some(30));
        shard.remove(1, "k");
        assert!(shard.get(1, "k").is_none());
        assert_eq!(
            shard.get(2, "k").map(|v| v.0),
            Some(30),
            "the moved entry is found"
        );
        drop(shard);
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn the_bound_holds_and_expired_entries_are_swept() {
        let table = Table::new(64, 1);
        for i in 0..1_000u64 {
            table
                .lock(&i.to_string())
                .insert(1, &i.to_string(), Until(u64::MAX), 0);
        }
        assert_eq!(table.len(), 64);
        assert_eq!(table.capacity(), 64);
        for (max, shards) in [(10, 64), (1_000, 64), (1, 8), (5_003, 64)] {
            let table = Table::new(max, shards);
            for i in 0..20 * max as u64 + 200 {
                table
                    .lock(&i.to_string())
                    .insert(1, &i.to_string(), Until(u64::MAX), 0);
            }
            assert_eq!(table.len(), max, "the bound is exact");
        }
        let table = Table::new(64, 1);
        for i in 0..10u64 {
            table
                .lock(&i.to_string())
                .insert(1, &i.to_string(), Until(5), 0);
        }
        table
            .lock("late")
            .insert(1, "late", Until(u64::MAX), PURGE_EVERY);
        assert_eq!(table.len(), 1, "expired entries are swept on insert");
    }

    #[test]
    fn a_flood_under_one_id_does_not_evict_another_ids_entries() {
        let table = Table::new(100, 1);
        // Another rule's 10 entries, expiring soonest of all.
        for i in 0..10u64 {
            let key = format!("login:{i}");
            table.lock(&key).insert(7, &key, Until(1_000), 0);
        }
        for i in 0..10_000u64 {
            let key = format!("flood:{i}");
            table.lock(&key).insert(9, &key, Until(u64::MAX), 1);
        }
        for i in 0..10u64 {
            let key = format!("login:{i}");
            assert!(table.lock(&key).get(7, &key).is_some(), "{key} was evicted");
        }
        assert_eq!(table.len(), 100);
    }

    #[test]
    fn within_an_id_the_entry_closest_to_expiry_is_evicted() {
        let table = Table::new(16, 1);
        for i in 0..16u64 {
            let key = i.to_string();
            table.lock(&key).insert(1, &key, Until(100 + i), 0);
        }
        table.lock("new").insert(1, "new", Until(1_000), 1);
        assert!(
            table.lock("0").get(1, "0").is_none(),
            "the soonest to expire went"
        );
        assert!(table.lock("15").get(1, "15").is_some());
    }
}
