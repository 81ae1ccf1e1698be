//! A set's stored states for one decision under the shard's write lock:
//! each quota's entry found once, updated in place, and the states that
//! need new entries stored once the decision is over.

use smallvec::SmallVec;

use super::super::CheckRequest;
use super::super::table::Position;
use super::entry::{Entries, lend, store_new, update_found};
use crate::algorithm::{Params, State, Update};
use crate::metrics::MemoryMetrics;
use crate::quota_set::States;

/// The states of a set's quotas, at the positions found for them, and the
/// updates that make new entries, kept until the decision is over (an
/// insert may sweep or evict, and so move entries): then
/// [`store_new`](Stored::store_new) stores them.
pub(super) struct Stored<'a, 'b> {
    pub(super) shard: &'a mut Entries<'b>,
    pub(super) positions: &'a [Option<Position>],
    /// (quota, the update to store anew, whether it replaces a word
    /// entry)
    pub(super) new: SmallVec<[(usize, Update, bool); 4]>,
    pub(super) metrics: &'a MemoryMetrics,
    pub(super) request: &'a CheckRequest<'a>,
    pub(super) now: u64,
}

impl Stored<'_, '_> {
    /// Stores the new entries, once the decision is made. Borrowed, not
    /// taken: `Stored` holds its list inline, and moving it into the call
    /// copied it (a `memcpy` on every check of a set).
    #[inline]
    pub(super) fn store_new(&mut self) {
        // Most checks store nothing new (a refusal, or keys already
        // stored).
        if !self.new.is_empty() {
            self.store_new_entries();
        }
    }

    /// [`store_new`](Self::store_new) once there is something to store.
    #[inline(never)]
    fn store_new_entries(&mut self) {
        let (ids, quotas) = (
            self.request.quotas.state_ids(),
            self.request.quotas.quotas(),
        );
        // A quota alone keeps its pair (see `store_new`).
        let pairs = quotas.len() == 1;
        for (i, update, replaces) in self.new.drain(..) {
            if let (Some(&id), Some(quota)) = (ids.get(i), quotas.get(i)) {
                let key = self.request.key;
                let (p, now) = (&quota.params, self.now);
                let (shard, metrics) = (&mut *self.shard, self.metrics);
                store_new(shard, metrics, id, key, update, p, now, replaces, pairs);
            }
        }
    }
}

impl States for Stored<'_, '_> {
    #[inline]
    fn with<R>(&self, i: usize, f: impl FnOnce(Option<&State>) -> R) -> R {
        let at = self.positions.get(i).copied().flatten();
        let found = at.and_then(|at| self.shard.at(at));
        match self.request.quotas.quotas().get(i) {
            Some(quota) => lend(found, &quota.params, f),
            None => f(None),
        }
    }

    // Always inlined into the set's loop: a call per quota, its update
    // passed through memory, cost more than the store itself.
    #[inline(always)]
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
