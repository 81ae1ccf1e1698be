//! A shard's sweep of expired entries, and its fair choice of a victim
//! when full.

use super::*;

impl<V: Expiring, N: Expiring, P: Expiring> Shard<V, N, P> {
    /// The position of `(id, key)`'s entry, whose index hash is `hash`.
    /// `SITE` sets apart a hot caller: each value is an instance of the
    /// index's search of its own, which with one caller LLVM inlines
    /// whole, key comparison included (guide::performance, "Notes on the hot path").
    #[inline]
    pub(super) fn find<const SITE: u8>(&self, hash: u64, id: u64, key: &str) -> Option<Position> {
        let entries = &self.entries;
        self.index
            .find(hash, |&at| entries.is(at, id, key))
            .map(|&at| Position(at))
    }

    /// Removes the entry at `at`, moving the last of its kind into its
    /// place.
    pub(super) fn remove_at(&mut self, at: Position, hasher: &foldhash::fast::RandomState) {
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

    pub(super) fn purge(&mut self, now: u64, hasher: &foldhash::fast::RandomState) {
        for kind in [0, WORD, PAIR] {
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
    pub(super) fn evict_for(&mut self, id: u64, hasher: &foldhash::fast::RandomState) {
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
    pub(super) fn sample(&mut self, id: u64) -> Option<Position> {
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
    pub(super) fn soonest(&self, range: std::ops::Range<usize>, id: u64) -> Option<Position> {
        range
            .map(|i| self.entries.nth(i))
            .filter_map(|at| Some((at, self.entries.meta(at)?)))
            .filter(|&(_, (of, _, _))| of == id)
            .min_by_key(|&(_, (_, _, expires_at))| expires_at)
            .map(|(at, _)| at)
    }
}
