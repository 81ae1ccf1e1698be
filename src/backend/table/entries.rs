//! A shard's entries in their three vectors, and where each one is.

use super::*;

impl Position {
    /// The place in the word vector, if the entry is a word.
    #[inline]
    pub(super) fn word(self) -> Option<usize> {
        (self.0 & KIND == WORD).then_some((self.0 & !KIND) as usize)
    }

    /// The place in the pair vector, if the entry is a pair.
    #[inline]
    pub(super) fn pair(self) -> Option<usize> {
        (self.0 & KIND == PAIR).then_some((self.0 & !KIND) as usize)
    }

    /// The place in its vector.
    #[inline]
    pub(super) fn place(self) -> usize {
        (self.0 & !KIND) as usize
    }
}

impl<V: Expiring, N: Expiring, P: Expiring> Entries<V, N, P> {
    pub(super) fn len(&self) -> usize {
        self.wide.len() + self.word.len() + self.pair.len()
    }

    /// The position of the `i`th entry, wide ones counted first, then
    /// words.
    pub(super) fn nth(&self, i: usize) -> Position {
        match i.checked_sub(self.wide.len()) {
            None => Position(i as u32),
            Some(n) => match n.checked_sub(self.word.len()) {
                None => Position(WORD | n as u32),
                Some(n) => Position(PAIR | n as u32),
            },
        }
    }

    /// Whether the entry at `at` is `(id, key)`'s.
    #[inline]
    pub(super) fn is(&self, at: u32, id: u64, key: &str) -> bool {
        let i = Position(at).place();
        match at & KIND {
            WORD => self.word.get(i).is_some_and(|e| e.is(id, key)),
            PAIR => self.pair.get(i).is_some_and(|e| e.is(id, key)),
            _ => self.wide.get(i).is_some_and(|e| e.is(id, key)),
        }
    }

    /// The id, key and expiry of the entry at `at`.
    pub(super) fn meta(&self, at: Position) -> Option<(u64, &str, u64)> {
        fn of<T: Expiring>(e: &Entry<T>) -> (u64, &str, u64) {
            (e.id, &e.key, e.value.expires_at())
        }
        let i = at.place();
        match at.0 & KIND {
            WORD => self.word.get(i).map(of),
            PAIR => self.pair.get(i).map(of),
            _ => self.wide.get(i).map(of),
        }
    }

    /// The index hash of the entry at `at`, worked out again (not stored:
    /// 8 bytes per entry saved, for a hash only when entries move).
    pub(super) fn hash(&self, at: u32, hasher: &foldhash::fast::RandomState) -> u64 {
        self.meta(Position(at))
            .map_or(0, |(id, key, _)| entry_hash(key_hash(hasher, key), id))
    }

    /// Removes the entry at `at`, moving the last of its vector into its
    /// place. Returns the moved entry's former position, if one moved.
    pub(super) fn swap_remove(&mut self, at: Position) -> Option<u32> {
        fn take<T>(column: &mut Vec<Entry<T>>, i: usize, kind: u32) -> Option<u32> {
            if i >= column.len() {
                return None;
            }
            column.swap_remove(i);
            (i < column.len()).then_some(kind | column.len() as u32)
        }
        let i = at.place();
        match at.0 & KIND {
            WORD => take(&mut self.word, i, WORD),
            PAIR => take(&mut self.pair, i, PAIR),
            _ => take(&mut self.wide, i, 0),
        }
    }
}
/// Whether two keys are equal, compared without a call to `memcmp` for
/// keys of 4 to 32 bytes (an IP key, most API keys): their first and last
/// chunks overlap, so together they cover every byte.
#[inline]
pub(super) fn same_key(a: &[u8], b: &[u8]) -> bool {
    pub(super) fn ends<const N: usize>(a: &[u8], b: &[u8]) -> Option<bool> {
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
pub(super) const ANY_CALLER: u8 = 0;
pub(super) const SET_LOOP: u8 = 1;
