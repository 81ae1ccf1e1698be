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

use std::hash::BuildHasher;

use smallvec::SmallVec;
use tokio::sync::Notify;

use super::lease::{Held, Policy};
use super::script::{Ask, Reply};
use crate::backend::table::{Expiring, Locked, Table};
use crate::decision::Decision;
use crate::quota_set::{QuotaSet, RawQuotaDecision};

/// Shards of the table, and wake-ups for ended lease calls: concurrent
/// checks of different keys rarely share either.
const SHARDS: usize = 16;

/// Entries by (quota set, client key), each a denial and/or a lease.
pub(crate) struct DenialCache {
    table: Table<Entry>,
    /// Woken when a lease call of one of its keys ends.
    lease_done: Box<[Notify]>,
    hasher: foldhash::fast::RandomState,
    /// Whether denials are kept (leases may be kept without them).
    denials: bool,
}

#[derive(Default)]
struct Entry {
    denial: Option<Denial>,
    lease: Option<Held>,
    /// Until when a lease call is out for this key: meanwhile other requests
    /// of the key ask Redis for their own cost only.
    leasing: u64,
}

impl Expiring for Entry {
    /// When the entry stops meaning anything (microseconds, local clock).
    fn expires_at(&self) -> u64 {
        let denial = self.denial.as_ref().map_or(0, |d| d.until);
        let lease = self.lease.as_ref().map_or(0, |l| l.expires);
        denial.max(lease).max(self.leasing)
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

/// A decision made here, without Redis.
pub(crate) enum Hit {
    /// Spent from a lease.
    Lease(Decision),
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
            lease_done: (0..SHARDS).map(|_| Notify::new()).collect(),
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
            if let Some(decision) = entry
                .lease
                .as_mut()
                .and_then(|l| l.spend(cost, now, quotas))
            {
                return Some(Hit::Lease(decision));
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

    /// What to ask Redis for a request of `cost` that the lease here cannot
    /// pay, under lease `policy`: a new lease sized by the last one (whose
    /// unspent units go back), unless a lease call for the key is out
    /// already; then the cost alone. Returns the ask, and whether it is
    /// the key's lease call (to be ended by [`settle`](Self::settle)).
    pub(crate) fn lease_ask(
        &self,
        set: u64,
        key: &str,
        cost: u64,
        now: u64,
        policy: &Policy,
        call_limit: u64,
    ) -> (Ask, bool) {
        let mut ask = Ask {
            cost,
            commit: true,
            want: cost,
            give_back: None,
        };
        let mut shard = self.table.lock(key);
        let entry = match shard.get_mut(set, key) {
            Some(entry) => entry,
            None => {
                let entry = Entry {
                    leasing: now.saturating_add(call_limit),
                    ..Entry::default()
                };
                shard.insert(set, key, entry, now);
                return (ask, true);
            }
        };
        if entry.leasing > now {
            return (ask, false);
        }
        entry.leasing = now.saturating_add(call_limit);
        let last = entry.lease.take();
        ask.want = policy.want(cost, last.as_ref(), now);
        ask.give_back = last
            .as_ref()
            .filter(|l| now < l.expires)
            .and_then(Held::give_back);
        (ask, true)
    }

    /// What wakes when a lease call of `key` (or of a key of the same
    /// shard) ends.
    pub(crate) fn lease_done(&self, set: u64, key: &str) -> &Notify {
        let index = self.hasher.hash_one((set, key)) as usize % SHARDS;
        &self.lease_done[index]
    }

    /// Ends `key`'s lease call, whatever came of it, and wakes the requests
    /// waiting for it.
    pub(crate) fn end_lease_call(&self, set: u64, key: &str) {
        if let Some(entry) = self.table.lock(key).get_mut(set, key) {
            entry.leasing = 0;
        }
        self.lease_done(set, key).notify_waiters();
    }

    /// Records what Redis answered to a request of `cost` for `key`, asked
    /// at `sent` and answered at `now` (local clock): the lease it granted
    /// (kept under `policy`), the denial it gave or the emptiness it
    /// reported. Returns the request's decision.
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
        lease: Option<(&Policy, bool)>,
    ) -> Decision {
        let mut shard = self.table.lock(key);
        let mut entry = shard
            .get_mut(set, key)
            .map(std::mem::take)
            .unwrap_or_default();
        let mut decision = None;
        // The key's lease call keeps what it took, even the request alone:
        // the next lease is sized by how fast this one went.
        if let Some((policy, _)) = lease.filter(|&(_, ours)| ours && reply.spent >= cost.max(1)) {
            let lifetime = match reply.lease_ends {
                0 => policy.lifetime,
                ends => policy.lifetime.min(ends),
            };
            // From when it was asked: Redis's moment came later, so the
            // lease never outlives a window there.
            let held = Held {
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
            if let Some((cost, wait, refused)) = denial(quotas, cost, reply, &decision) {
                entry.denial = Some(Denial {
                    cost,
                    at: now,
                    until: now.saturating_add(wait),
                    decision: refused,
                });
            }
        }
        store(&mut shard, set, key, entry, now);
        decision
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
    let quotas = decision.quotas().iter().map(|q| q.aged(elapsed)).collect();
    Decision::new(false, quotas)
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
