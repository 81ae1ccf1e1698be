//! Where schedules live: [`MemoryPace`] in this process, or (with the
//! `redis` feature) [`RedisPace`](super::RedisPace), one schedule for a
//! whole fleet.

use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use hashbrown::HashMap;

use super::schedule::{self, Entry, Plan, Told, Turn};
use crate::backend::BackendError;
use crate::sync::lock;

/// A store's answer to a request for a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub(crate) turn: Turn,
    /// The store's time when it answered, in microseconds.
    pub(crate) now: u64,
    /// Microseconds the key is still paused for (0: not paused).
    pub(crate) paused: u64,
}

/// Where the schedules of [`Pacer`](super::Pacer)s are kept, atomically:
/// every caller of one key, in this process or (for a shared store) in
/// the fleet, is scheduled on one timeline, on the store's clock.
///
/// Implemented by [`MemoryPace`] and, with the `redis` feature,
/// [`RedisPace`](super::RedisPace); its methods are the crate's.
pub trait PaceStore: Clone + Send + Sync + 'static {
    #[doc(hidden)]
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        plan: &'a Plan,
        cost: u64,
        max_wait: u64,
    ) -> impl Future<Output = Result<Scheduled, BackendError>> + Send + 'a;

    #[doc(hidden)]
    fn give_back<'a>(
        &'a self,
        key: &'a str,
        plan: &'a Plan,
        cost: u64,
        interval: u64,
        slot: u64,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a;

    /// `told` in the store's time, given as offsets from its `now`.
    #[doc(hidden)]
    fn obey<'a>(
        &'a self,
        key: &'a str,
        plan: &'a Plan,
        told: Told,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a;

    /// Whether other processes share these schedules (Redis does).
    fn shared(&self) -> bool {
        false
    }
}

/// Shards, so that keys seldom share a lock.
const SHARDS: usize = 16;

/// A shard holding more entries than this drops those that no longer
/// matter before it grows: memory stays bounded by the keys in use.
const SWEEP_AT: usize = 1024;

type Entries = HashMap<Box<str>, Entry, foldhash::fast::RandomState>;

struct Shards {
    hasher: foldhash::fast::RandomState,
    shards: [Mutex<(Entries, usize)>; SHARDS],
    zero: tokio::time::Instant,
}

/// Schedules kept in this process, on tokio's clock (so that a test with
/// paused time schedules on it too). Clones share them.
#[derive(Clone)]
pub struct MemoryPace {
    inner: Arc<Shards>,
}

impl fmt::Debug for MemoryPace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryPace").finish_non_exhaustive()
    }
}

impl Default for MemoryPace {
    fn default() -> Self {
        MemoryPace::new()
    }
}

impl MemoryPace {
    /// An empty store. Call it inside a tokio runtime when tokio's time
    /// may be paused (tests): its clock starts at tokio's now.
    pub fn new() -> Self {
        MemoryPace {
            inner: Arc::new(Shards {
                hasher: foldhash::fast::RandomState::default(),
                shards: std::array::from_fn(|_| Mutex::new((Entries::default(), SWEEP_AT))),
                zero: tokio::time::Instant::now(),
            }),
        }
    }

    /// Microseconds since the store was made; never 0, which means
    /// "never used" in an entry.
    fn now(&self) -> u64 {
        schedule::micros(self.inner.zero.elapsed()).saturating_add(1)
    }

    /// Runs `f` on `key`'s entry at the store's now, then drops the entry
    /// if it no longer matters.
    fn with<T>(&self, key: &str, plan: &Plan, f: impl FnOnce(&mut Entry, u64) -> T) -> T {
        let shard = &self.inner.shards[(self.inner.hasher.hash_one(key) as usize) % SHARDS];
        let now = self.now();
        let mut guard = lock(shard);
        let (entries, sweep_at) = &mut *guard;
        let mut entry = entries.get(key).copied().unwrap_or_default();
        let out = f(&mut entry, now);
        if schedule::lifetime(&entry, plan, now) == 0 {
            entries.remove(key);
        } else {
            if entries.len() >= *sweep_at {
                entries.retain(|_, e| schedule::lifetime(e, plan, now) > 0);
                *sweep_at = (entries.len() * 2).max(SWEEP_AT);
            }
            entries.insert(key.into(), entry);
        }
        out
    }

    /// Keys with an entry now (for tests of the memory bound).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).0.len()).sum()
    }
}

impl PaceStore for MemoryPace {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        plan: &'a Plan,
        cost: u64,
        max_wait: u64,
    ) -> impl Future<Output = Result<Scheduled, BackendError>> + Send + 'a {
        let answer = self.with(key, plan, |e, now| Scheduled {
            turn: schedule::acquire(e, plan, cost, now, max_wait),
            now,
            paused: e.pause_until.saturating_sub(now),
        });
        std::future::ready(Ok(answer))
    }

    fn give_back<'a>(
        &'a self,
        key: &'a str,
        plan: &'a Plan,
        cost: u64,
        interval: u64,
        slot: u64,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a {
        self.with(key, plan, |e, now| {
            schedule::give_back(e, cost, interval, slot, now)
        });
        std::future::ready(Ok(()))
    }

    fn obey<'a>(
        &'a self,
        key: &'a str,
        plan: &'a Plan,
        told: Told,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a {
        self.with(key, plan, |e, now| {
            let told = Told {
                pause_until: if told.pause_until > 0 {
                    now.saturating_add(told.pause_until)
                } else {
                    0
                },
                ..told
            };
            schedule::obey(e, plan, told, now)
        });
        std::future::ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Quota;

    #[tokio::test(start_paused = true)]
    async fn entries_whose_schedule_has_passed_are_swept() {
        let store = MemoryPace::new();
        let quota = Quota::gcra(10, Duration::from_secs(1))
            .burst(1)
            .build()
            .unwrap();
        let plan = Plan::of(&quota);
        const KEYS: usize = 20_000;
        for i in 0..KEYS {
            store.acquire(&format!("a{i}"), &plan, 1, 0).await.unwrap();
        }
        assert_eq!(store.len(), KEYS);
        tokio::time::advance(Duration::from_secs(1)).await;
        for i in 0..KEYS {
            store.acquire(&format!("b{i}"), &plan, 1, 0).await.unwrap();
        }
        // Without the sweep, 40 000: the first keys' schedules have passed,
        // and each shard dropped them as it grew.
        assert!(store.len() < KEYS * 3 / 2, "{}", store.len());
        // A key touched once its schedule has passed goes at once.
        tokio::time::advance(Duration::from_secs(1)).await;
        let before = store.len();
        store.give_back("b0", &plan, 1, 1, 1).await.unwrap();
        assert_eq!(store.len(), before - 1);
    }
}
