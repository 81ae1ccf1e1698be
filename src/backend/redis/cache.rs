//! What this process knows of a key between Redis calls: a denial Redis
//! gave (the denial cache), and units leased from Redis (see `lease.rs`).
//!
//! Denials: a key Redis refused stays refused here until its wait is over,
//! without asking Redis again, and so does a key an admission left empty,
//! until its next unit frees. Sound because the algorithms are monotone: a
//! request refused now is refused until its retry-after has passed however
//! the other servers' traffic goes (more traffic only delays it further),
//! and so is any request of the same key costing more. Sets that log refused
//! attempts (`count_rejected`) are never cached: Redis must see those
//! attempts.
//!
//! The key's call: when a denial runs out, every request it held back asks
//! again at the same moment. One of them makes the key's call to Redis and
//! the others wait for its answer (which is usually a denial again, or the
//! emptiness the admission left), as the requests of a hot key wait for its
//! lease call; see [`DenialCache::claim`].

use std::hash::BuildHasher;

use smallvec::SmallVec;
use tokio::sync::Notify;

use super::lease::{Leased, Policy};
use super::script::{Ask, Reply};
use crate::backend::table::{Expiring, Locked, Table};
use crate::decision::Decision;
use crate::quota_set::{QuotaSet, RawQuotaDecision};

/// Shards of the table, and wake-ups for ended key calls: concurrent
/// checks of different keys rarely share either.
const SHARDS: usize = 16;

/// How long a run-out denial is kept (microseconds): the requests it held
/// back ask again within a moment of its end, and must find it to share
/// one call. A second covers a loaded machine.
const AFTER_DENIAL: u64 = 1_000_000;

/// Entries by (quota set, client key), each a denial and/or a lease.
pub(crate) struct DenialCache {
    table: Table<Entry>,
    /// Woken when the call of one of its keys ends.
    call_done: Box<[Notify]>,
    hasher: foldhash::fast::RandomState,
    /// Whether denials are kept (leases may be kept without them).
    denials: bool,
}

#[derive(Default)]
struct Entry {
    denial: Option<Denial>,
    lease: Option<Leased>,
    /// Until when the key's call (a lease call, or the call after a denial
    /// ran out) is out: meanwhile other requests of the key wait for it,
    /// and ask Redis for their own cost only if they give up waiting.
    calling: u64,
}

impl Expiring for Entry {
    /// When the entry stops meaning anything (microseconds, local clock).
    fn expires_at(&self) -> u64 {
        let denial = self
            .denial
            .as_ref()
            .map_or(0, |d| d.until.saturating_add(AFTER_DENIAL));
        let lease = self.lease.as_ref().map_or(0, |l| l.expires);
        denial.max(lease).max(self.calling)
    }
}

struct Denial {
    /// The cost that was refused; cheaper requests may pass.
    cost: u64,
    /// When Redis refused it, and until when it stays refused (microseconds
    /// on the backend's local clock).
    at: u64,
    until: u64,
    decision: Decision,
}

/// What a request the cache cannot decide does: see
/// [`DenialCache::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Make the key's call; [`DenialCache::end_call`] ends it.
    Lead,
    /// Wait for the key's call, out already, then look again.
    Wait,
    /// Ask Redis for this request alone.
    Alone,
}

/// A decision made here, without Redis.
pub(crate) enum Hit {
    /// Spent from a lease, taken at this Redis time.
    Lease(Decision, u64),
    /// Refused by a remembered denial.
    Denial(Decision),
}

/// Puts `entry` back as `(set, key)`'s, or drops the key if the entry
/// means nothing any more.
fn store(shard: &mut Locked<'_, Entry>, set: u64, key: &str, entry: Entry, now: u64) {
    if now >= entry.expires_at() {
        shard.remove(set, key);
        return;
    }
    match shard.get_mut(set, key) {
        Some(slot) => *slot = entry,
        None => {
            shard.insert(set, key, entry, now);
        }
    }
}

impl DenialCache {
    /// A cache of at most `capacity` keys, keeping denials if `denials`.
    pub(crate) fn new(capacity: usize, denials: bool) -> Self {
        DenialCache {
            table: Table::new(capacity, SHARDS),
            call_done: (0..SHARDS).map(|_| Notify::new()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            denials,
        }
    }

    /// Decides `cost` for `key` of set `set` at `now` without Redis, if this
    /// process can: from a lease (when `commit`), or a remembered denial.
    pub(crate) fn get(
        &self,
        set: u64,
        key: &str,
        quotas: &QuotaSet,
        cost: u64,
        commit: bool,
        now: u64,
    ) -> Option<Hit> {
        let mut shard = self.table.lock(key);
        let entry = shard.get_mut(set, key)?;
        if now >= entry.expires_at() {
            shard.remove(set, key);
            return None;
        }
        if commit {
            if let Some(lease) = entry.lease.as_mut() {
                if let Some(decision) = lease.spend(cost, now, quotas) {
                    return Some(Hit::Lease(decision, lease.redis_at));
                }
            }
        }
        let denial = entry.denial.as_ref()?;
        if now >= denial.until || cost < denial.cost {
            return None;
        }
        Some(Hit::Denial(aged(
            &denial.decision,
            now.saturating_sub(denial.at),
        )))
    }

    /// What a request of `cost` that [`get`](Self::get) could not decide
    /// asks Redis, and whose turn it is ([`Turn`]): with leases on
    /// (`policy`), every such request of a key takes the key's call in turn,
    /// for a new lease sized by the last one (whose unspent units go back);
    /// with leases off, only the requests that find the key's denial just
    /// run out do (usually a flood's). Requests that find the call out wait
    /// for it; asking alone, they ask for their cost.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn claim(
        &self,
        set: u64,
        key: &str,
        quotas: &QuotaSet,
        cost: u64,
        now: u64,
        policy: Option<&Policy>,
        call_limit: u64,
    ) -> (Ask, Turn) {
        let mut ask = Ask {
            cost,
            commit: true,
            want: cost,
            give_back: None,
        };
        let calling = now.saturating_add(call_limit);
        let mut shard = self.table.lock(key);
        let Some(entry) = shard.get_mut(set, key) else {
            if policy.is_none() {
                return (ask, Turn::Alone);
            }
            let entry = Entry {
                calling,
                ..Entry::default()
            };
            shard.insert(set, key, entry, now);
            return (ask, Turn::Lead);
        };
        if entry.calling > now {
            return (ask, Turn::Wait);
        }
        match policy {
            Some(policy) => {
                let last = entry.lease.take();
                ask.want = policy.want(cost, last.as_ref(), quotas, now);
                ask.give_back = last
                    .as_ref()
                    .filter(|l| now < l.expires)
                    .and_then(Leased::give_back);
            }
            None if entry.denial.as_ref().is_some_and(|d| now >= d.until) => {}
            None => return (ask, Turn::Alone),
        }
        entry.calling = calling;
        (ask, Turn::Lead)
    }

    /// What wakes when the call of `key` (or of a key of the same shard)
    /// ends.
    pub(crate) fn call_done(&self, set: u64, key: &str) -> &Notify {
        let index = self.hasher.hash_one((set, key)) as usize % SHARDS;
        &self.call_done[index]
    }

    /// Ends `key`'s call, whatever came of it, and wakes the requests
    /// waiting for it.
    pub(crate) fn end_call(&self, set: u64, key: &str) {
        if let Some(entry) = self.table.lock(key).get_mut(set, key) {
            entry.calling = 0;
        }
        self.call_done(set, key).notify_waiters();
    }

    /// Records what Redis answered to a request of `cost` for `key`, asked
    /// at `sent` and answered at `now` (local clock): the lease it granted
    /// (kept under `lease`, the policy, if this was the key's lease call),
    /// the denial it gave or the emptiness it
    /// reported. Returns the request's decision. A denial that has run out
    /// is replaced by what Redis says now, nothing included.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn settle(
        &self,
        set: u64,
        key: &str,
        quotas: &QuotaSet,
        cost: u64,
        sent: u64,
        now: u64,
        reply: &Reply,
        lease: Option<&Policy>,
    ) -> Decision {
        let mut shard = self.table.lock(key);
        let mut entry = shard
            .get_mut(set, key)
            .map(std::mem::take)
            .unwrap_or_default();
        let mut decision = None;
        // The key's lease call keeps what it took, even the request alone:
        // the next lease is sized by how fast this one went.
        if let Some(policy) = lease.filter(|_| reply.spent >= cost.max(1)) {
            let lifetime = match reply.lease_ends {
                0 => policy.lifetime,
                ends => policy.lifetime.min(ends),
            };
            // From when it was asked: Redis's moment came later, so the
            // lease never outlives a window there.
            let held = Leased {
                units: reply.spent - cost,
                size: reply.spent,
                taken: sent,
                expires: sent.saturating_add(lifetime),
                redis_at: reply.now,
                verdicts: reply.verdicts.clone(),
            };
            decision = Some(held.decision(sent, quotas));
            entry.lease = Some(held);
        }
        let decision = decision.unwrap_or_else(|| quotas.decision_from(&reply.verdicts));
        if self.denials {
            let fresh =
                denial(quotas, cost, reply, &decision).map(|(cost, wait, refused)| Denial {
                    cost,
                    at: now,
                    until: now.saturating_add(wait),
                    decision: refused,
                });
            if fresh.is_some() || entry.denial.as_ref().is_some_and(|d| now >= d.until) {
                entry.denial = fresh;
            }
        }
        store(&mut shard, set, key, entry, now);
        decision
    }

    /// Takes a reservation of `cost` made at `redis_at` (Redis time) back
    /// for `key` of `quotas`: into the lease it came from, if that lease
    /// is still held, as if never spent from it, and what is left then;
    /// else `None`, and Redis must take it back. Either way the key's
    /// denial is forgotten: it was remembered with those units spent.
    pub(crate) fn give_back(
        &self,
        set: u64,
        key: &str,
        quotas: &QuotaSet,
        cost: u64,
        redis_at: u64,
        now: u64,
    ) -> Option<Decision> {
        let mut shard = self.table.lock(key);
        let entry = shard.get_mut(set, key)?;
        entry.denial = None;
        let lease = entry.lease.as_mut()?;
        if lease.redis_at != redis_at || now >= lease.expires {
            return None;
        }
        lease.units = lease.units.saturating_add(cost).min(lease.size);
        Some(lease.decision(now, quotas))
    }

    /// Forgets what this process knows of `key` in set `set`, its denial
    /// and its lease: the key was reset, and neither means anything now.
    pub(crate) fn forget(&self, set: u64, key: &str) {
        self.table.lock(key).remove(set, key);
        self.call_done(set, key).notify_waiters();
    }

    /// How many keys are cached (expired ones not yet dropped included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

/// The denial to remember after Redis's `reply`: (the cost refused from
/// now on, for how long, the decision to give). A refused request stays
/// refused for the longest wait of the enforced quotas that refused it; an
/// admission that left an enforced quota empty refuses any cost until the
/// quota frees a unit.
fn denial(
    quotas: &QuotaSet,
    cost: u64,
    reply: &Reply,
    decision: &Decision,
) -> Option<(u64, u64, Decision)> {
    let enforced = || {
        quotas
            .quotas()
            .iter()
            .zip(&reply.verdicts)
            .zip(&reply.next_free)
            .filter(|((q, _), _)| !q.params.shadow)
    };
    if !decision.allowed() {
        let wait = enforced()
            .filter(|((_, v), _)| !v.allowed)
            .map(|((_, v), _)| v.retry_after)
            .max()
            .filter(|&w| w > 0)?;
        return Some((cost, wait, decision.clone()));
    }
    let wait = enforced().map(|(_, &next)| next).max().filter(|&w| w > 0)?;
    let verdicts: SmallVec<[RawQuotaDecision; 2]> = reply
        .verdicts
        .iter()
        .zip(&reply.next_free)
        .map(|(v, &next)| match next {
            0 => *v,
            next => RawQuotaDecision {
                allowed: false,
                remaining: 0,
                retry_after: next,
                delay: 0,
                ..*v
            },
        })
        .collect();
    Some((1, wait, quotas.decision_from(&verdicts)))
}

/// A cached decision as it reads `elapsed` microseconds later: waits and
/// resets shortened; a quota whose wait is over reports that it admits.
fn aged(decision: &Decision, elapsed: u64) -> Decision {
    Decision::new(false, decision.quotas().iter().map(|q| q.aged(elapsed)))
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
