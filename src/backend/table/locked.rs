//! A shard locked to write: entries found, updated, inserted and removed.

use super::*;

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
            WORD => Found::Word(&entries.word.get(i)?.value),
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
            WORD => Found::Word(&mut entries.word.get_mut(i)?.value),
            PAIR => Found::Pair(&mut entries.pair.get_mut(i)?.value),
            _ => Found::Wide(&mut entries.wide.get_mut(i)?.value),
        })
    }

    /// The wide entry of `(id, key)`, if there is one.
    #[cfg(test)]
    pub(crate) fn get(&self, id: u64, key: &str) -> Option<&V> {
        match self.at(self.position(id, key)?)? {
            Found::Wide(v) => Some(v),
            Found::Word(_) | Found::Pair(_) => None,
        }
    }

    /// The wide entry of `(id, key)`, if there is one.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // the Redis cache's
    #[inline]
    pub(crate) fn get_mut(&mut self, id: u64, key: &str) -> Option<&mut V> {
        match self.at_mut(self.position(id, key)?)? {
            Found::Wide(v) => Some(v),
            Found::Word(_) | Found::Pair(_) => None,
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

    /// [`insert`](Self::insert), for a word entry.
    pub(crate) fn insert_word(&mut self, id: u64, key: &str, value: N, now: u64) -> isize {
        self.insert_in(id, key, value, now, |e| &mut e.word, WORD)
    }

    /// [`insert`](Self::insert), for a pair entry.
    pub(crate) fn insert_pair(&mut self, id: u64, key: &str, value: P, now: u64) -> isize {
        self.insert_in(id, key, value, now, |e| &mut e.pair, PAIR)
    }

    pub(super) fn insert_in<T>(
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
