//! The local cache of denials: a key Redis refused stays refused here until
//! its wait is over, without asking Redis again.
//!
//! Sound because the algorithms are monotone: a request refused now is
//! refused until its retry-after has passed however the other servers'
//! traffic goes (more traffic only delays it further), and so is any request
//! of the same key costing more. Sets that log refused attempts
//! (`count_rejected`) are never cached: Redis must see those attempts.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::{Equivalent, HashMap};

use crate::decision::Decision;

/// Shards, so that concurrent checks of different keys rarely share a lock.
const SHARDS: usize = 16;
/// How many entries a full shard looks at to choose one to evict.
const EVICTION_SAMPLE: usize = 8;

/// One shard: entries by (quota set, client key).
type Shard = HashMap<(u64, Box<str>), Entry, foldhash::fast::RandomState>;

pub(crate) struct DenialCache {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    hasher: foldhash::fast::RandomState,
}

struct Entry {
    /// The cost that was refused; cheaper requests may pass.
    cost: u64,
    /// When Redis refused it, and until when it stays refused (microseconds
    /// on the backend's local clock).
    at: u64,
    until: u64,
    decision: Decision,
}

/// Looks an entry up without allocating its key.
#[derive(Hash)]
struct Lookup<'a>(u64, &'a str);

impl Equivalent<(u64, Box<str>)> for Lookup<'_> {
    fn equivalent(&self, key: &(u64, Box<str>)) -> bool {
        self.0 == key.0 && self.1 == &*key.1
    }
}

impl DenialCache {
    /// A cache of at most `capacity` keys (rounded up to a multiple of the
    /// shard count).
    pub(crate) fn new(capacity: usize) -> Self {
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        let hasher = foldhash::fast::RandomState::default();
        DenialCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::with_hasher(hasher.clone())))
                .collect(),
            per_shard,
            hasher,
        }
    }

    fn shard(&self, set: u64, key: &str) -> MutexGuard<'_, Shard> {
        let index = (self.hasher.hash_one(Lookup(set, key)) >> 48) as usize % SHARDS;
        // A poisoned lock only means a panic elsewhere; the map is intact.
        self.shards[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The cached denial of `cost` for `key` of set `set`, as of `now`.
    pub(crate) fn get(&self, set: u64, key: &str, cost: u64, now: u64) -> Option<Decision> {
        let mut shard = self.shard(set, key);
        let entry = shard.get(&Lookup(set, key))?;
        if now >= entry.until {
            shard.remove(&Lookup(set, key));
            return None;
        }
        if cost < entry.cost {
            return None;
        }
        Some(aged(&entry.decision, now.saturating_sub(entry.at)))
    }

    /// Remembers that Redis refused `cost` for `key` at `now` until
    /// `now + wait`.
    pub(crate) fn insert(
        &self,
        set: u64,
        key: &str,
        cost: u64,
        now: u64,
        wait: u64,
        decision: &Decision,
    ) {
        let mut shard = self.shard(set, key);
        let entry = Entry {
            cost,
            at: now,
            until: now.saturating_add(wait),
            decision: decision.clone(),
        };
        if let Some(old) = shard.get_mut(&Lookup(set, key)) {
            *old = entry;
            return;
        }
        if shard.len() >= self.per_shard {
            shard.retain(|_, e| e.until > now);
        }
        if shard.len() >= self.per_shard {
            let victim = shard
                .iter()
                .take(EVICTION_SAMPLE)
                .min_by_key(|(_, e)| e.until)
                .map(|(k, _)| k.clone());
            if let Some(victim) = victim {
                shard.remove(&victim);
            }
        }
        shard.insert((set, key.into()), entry);
    }

    /// How many denials are cached (expired ones not yet dropped included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().map_or(0, |s| s.len()))
            .sum()
    }
}

/// A cached decision as it reads `elapsed` microseconds later: waits and
/// resets shortened; a quota whose wait is over reports that it admits.
fn aged(decision: &Decision, elapsed: u64) -> Decision {
    let elapsed = Duration::from_micros(elapsed);
    let quotas = decision
        .quotas()
        .iter()
        .map(|q| {
            let mut q = q.clone();
            q.reset = q.reset.saturating_sub(elapsed);
            q.replenish = q.replenish.saturating_sub(elapsed);
            q.delay = Duration::ZERO;
            if let Some(wait) = q.retry_after {
                let left = wait.saturating_sub(elapsed);
                q.allowed = left.is_zero();
                q.retry_after = (!left.is_zero()).then_some(left);
            }
            q
        })
        .collect();
    Decision::new(false, quotas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::QuotaDecision;
    use smallvec::smallvec;

    fn refused(retry: u64) -> Decision {
        Decision::new(
            false,
            smallvec![QuotaDecision {
                allowed: false,
                limit: 5,
                remaining: 0,
                reset: Duration::from_micros(retry * 2),
                replenish: Duration::from_micros(retry),
                retry_after: Some(Duration::from_micros(retry)),
                delay: Duration::ZERO,
                shadow: false,
            }],
        )
    }

    #[test]
    fn a_denial_holds_until_its_wait_is_over_for_costs_as_high() {
        let cache = DenialCache::new(100);
        cache.insert(1, "k", 2, 1_000, 500, &refused(500));
        let hit = cache.get(1, "k", 2, 1_200).expect("cached");
        assert!(!hit.allowed());
        assert_eq!(hit.retry_after(), Some(Duration::from_micros(300)));
        assert_eq!(hit.quotas()[0].reset, Duration::from_micros(800));
        assert!(cache.get(1, "k", 3, 1_200).is_some());
        assert!(
            cache.get(1, "k", 1, 1_200).is_none(),
            "a cheaper request may pass"
        );
        assert!(cache.get(2, "k", 2, 1_200).is_none(), "another set");
        assert!(cache.get(1, "j", 2, 1_200).is_none(), "another key");
        assert!(cache.get(1, "k", 2, 1_500).is_none());
        assert_eq!(cache.len(), 0, "expired entries are dropped when met");
    }

    #[test]
    fn the_cache_is_bounded() {
        let cache = DenialCache::new(32);
        for i in 0..10_000u64 {
            cache.insert(1, &i.to_string(), 1, i, 1_000_000, &refused(1_000_000));
        }
        assert!(cache.len() <= 32, "{}", cache.len());
        assert!(cache.get(1, "9999", 1, 10_000).is_some());
    }
}
