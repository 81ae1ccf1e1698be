//! Concurrency slots: how many requests of one key are under way at once.
//!
//! Unlike a rate quota's state, a slot is given back: the holder drops its
//! [`Slot`] when the request is over, however it ends.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use hashbrown::HashMap;

use super::BackendError;
use crate::sync::lock;

/// A slot being acquired, for stores that must be awaited.
pub type SlotFuture<'a> = Pin<Box<dyn Future<Output = Result<Acquired, BackendError>> + Send + 'a>>;

/// A held slot. Dropping it gives the slot back, whatever ended the request
/// (its body sent, the client gone, a panic in the handler).
pub struct Slot(#[allow(dead_code)] Box<dyn Any + Send + Sync>);

impl Slot {
    /// A slot released by `guard`'s `Drop`: how a custom [`SlotStore`] hands
    /// out slots.
    pub fn new(guard: impl Any + Send + Sync) -> Self {
        Slot(Box::new(guard))
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

/// What a store answers when asked for a slot.
#[derive(Debug)]
pub enum Acquired {
    /// A slot, now held; `in_use` counts it.
    Granted {
        /// The slot, given back when dropped.
        slot: Slot,
        /// Slots of this key in use, this one included.
        in_use: u64,
    },
    /// Every slot up to the limit is taken.
    Full {
        /// Slots of this key in use.
        in_use: u64,
    },
}

/// Where the slots of concurrency quotas are counted: [`MemorySlots`] in
/// this process, or (with the `redis` feature) `RedisSlots`, shared by a
/// fleet.
pub trait SlotStore: Send + Sync + 'static {
    /// A slot of `key` if fewer than `limit` are in use, decided without
    /// waiting; `None` when this store must be awaited through
    /// [`acquire`](SlotStore::acquire) (and then nothing has changed).
    fn acquire_now(&self, key: &str, limit: u64) -> Option<Result<Acquired, BackendError>> {
        let _ = (key, limit);
        None
    }

    /// A slot of `key` if fewer than `limit` are in use.
    fn acquire<'a>(&'a self, key: &'a str, limit: u64) -> SlotFuture<'a>;
}

/// Shards of the in-memory count, so that keys seldom share a lock.
const SHARDS: usize = 16;

type Counts = HashMap<Box<str>, u64, foldhash::fast::RandomState>;

struct Shards {
    hasher: foldhash::fast::RandomState,
    shards: [Mutex<Counts>; SHARDS],
}

impl Shards {
    fn shard(&self, key: &str) -> &Mutex<Counts> {
        // The modulo keeps the index in range, so indexing cannot fail.
        &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS]
    }
}

/// Concurrency slots counted in this process. A key has an entry only while
/// one of its slots is held, so the memory used is bounded by the requests
/// under way. Clones share the counts.
#[derive(Clone)]
pub struct MemorySlots {
    shards: Arc<Shards>,
}

impl Default for MemorySlots {
    fn default() -> Self {
        MemorySlots::new()
    }
}

impl fmt::Debug for MemorySlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemorySlots").finish_non_exhaustive()
    }
}

impl MemorySlots {
    /// An empty store.
    pub fn new() -> Self {
        MemorySlots {
            shards: Arc::new(Shards {
                hasher: foldhash::fast::RandomState::default(),
                shards: std::array::from_fn(|_| Mutex::new(Counts::default())),
            }),
        }
    }

    /// Slots of `key` in use now.
    pub fn in_use(&self, key: &str) -> u64 {
        lock(self.shards.shard(key)).get(key).copied().unwrap_or(0)
    }

    fn take(&self, key: &str, limit: u64) -> Acquired {
        let mut counts = lock(self.shards.shard(key));
        let in_use = counts.get(key).copied().unwrap_or(0);
        if in_use >= limit {
            return Acquired::Full { in_use };
        }
        match counts.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                counts.insert(key.into(), 1);
            }
        }
        let slot = Slot::new(MemorySlot {
            shards: Arc::clone(&self.shards),
            key: key.into(),
        });
        Acquired::Granted {
            slot,
            in_use: in_use + 1,
        }
    }
}

impl SlotStore for MemorySlots {
    fn acquire_now(&self, key: &str, limit: u64) -> Option<Result<Acquired, BackendError>> {
        Some(Ok(self.take(key, limit)))
    }

    fn acquire<'a>(&'a self, key: &'a str, limit: u64) -> SlotFuture<'a> {
        let acquired = self.take(key, limit);
        Box::pin(async move { Ok(acquired) })
    }
}

/// A slot held in a [`MemorySlots`].
struct MemorySlot {
    shards: Arc<Shards>,
    key: Box<str>,
}

impl Drop for MemorySlot {
    fn drop(&mut self) {
        let mut counts = lock(self.shards.shard(&self.key));
        if let Some(n) = counts.get_mut(&*self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&*self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(a: Acquired) -> Slot {
        match a {
            Acquired::Granted { slot, .. } => slot,
            Acquired::Full { in_use } => panic!("full at {in_use}"),
        }
    }

    #[test]
    fn slots_are_counted_per_key_and_given_back_on_drop() {
        let slots = MemorySlots::new();
        let a = granted(slots.take("a", 2));
        let b = granted(slots.take("a", 2));
        assert!(matches!(slots.take("a", 2), Acquired::Full { in_use: 2 }));
        let other = granted(slots.take("b", 2));
        drop(a);
        assert_eq!(slots.in_use("a"), 1);
        let c = granted(slots.take("a", 2));
        drop((b, c, other));
        assert_eq!(slots.in_use("a"), 0);
        assert!(
            lock(slots.shards.shard("a")).is_empty(),
            "no entry is kept for an idle key"
        );
    }
}
