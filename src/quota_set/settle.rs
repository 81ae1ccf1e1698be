//! What a settled reservation does to a set's states: units given back,
//! and usage beyond the reservation charged, each quota by what it counts.

use super::{QuotaSet, States};
use crate::algorithm;
use crate::clock::Timestamp;
use crate::decision::Decision;
use crate::quota::Counts;
use crate::state::QuotaState;

impl QuotaSet {
    /// Gives back a reservation: what `decision` (a committed decision of
    /// this set, of `cost` units, made at `at` on the store's clock) spent,
    /// at `now`, on the states a store keeps for its key, as
    /// [`decide`](QuotaSet::decide) reads them. `requests` is what goes
    /// back to the quotas counting requests ([`Counts::Requests`]): 1 when
    /// the whole reservation goes back, 0 when only part of its cost does
    /// ([`GiveBackRequest::requests`](crate::backend::GiveBackRequest::requests)). Each quota that spent gets
    /// its units back as if the reservation had not happened, as far as
    /// that is still known: a window that has rolled over since gives
    /// nothing back, and nothing ever goes back beyond a fresh key's
    /// quota. A refused decision spent nothing, and gives nothing back.
    /// Returns what is left then: the decision of a peek at cost 0. What a
    /// store outside the crate calls in
    /// [`Backend::give_back`](crate::Backend::give_back).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Quota, QuotaSet, QuotaState, Timestamp};
    ///
    /// let set = QuotaSet::single(Quota::fixed_window(1, Duration::from_secs(60)).build()?);
    /// let mut states: Vec<Option<QuotaState>> = vec![None];
    /// let now = Timestamp::from_secs(1_800_000_000);
    /// let reserved = set.decide(&mut states, 1, now, true);
    /// assert!(!set.decide(&mut states, 1, now, false).allowed());
    /// let left = set.give_back(&mut states, &reserved, 1, 1, now, now);
    /// assert_eq!(left.remaining(), 1);
    /// assert!(set.decide(&mut states, 1, now, false).allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn give_back(
        &self,
        states: &mut [Option<QuotaState>],
        decision: &Decision,
        cost: u64,
        requests: u64,
        at: Timestamp,
        now: Timestamp,
    ) -> Decision {
        let (at, now) = (at.as_micros(), now.as_micros());
        self.give_back_in(states, decision, [cost, requests], at, now)
    }

    /// [`give_back`](QuotaSet::give_back) on any [`States`], of `[cost,
    /// requests]`.
    pub(crate) fn give_back_in(
        &self,
        states: &mut (impl States + ?Sized),
        decision: &Decision,
        units: [u64; 2],
        at: u64,
        now: u64,
    ) -> Decision {
        self.give_back_spent(states, decision, units, at, now);
        self.evaluate(states, 0, Timestamp::from_micros(now), false, false)
    }

    /// [`give_back_in`](QuotaSet::give_back_in) without the peek that
    /// follows: for a store that stores its new entries only once the
    /// states are handed back, and then peeks itself.
    pub(crate) fn give_back_spent(
        &self,
        states: &mut (impl States + ?Sized),
        decision: &Decision,
        [cost, requests]: [u64; 2],
        at: u64,
        now: u64,
    ) {
        // A refused decision spent nothing.
        if !decision.allowed() {
            return;
        }
        let answers = self.quotas.iter().zip(decision.quotas()).enumerate();
        for (i, (quota, answer)) in answers {
            let cost = quota.units(cost, requests);
            // A shadow quota that refused admitted nothing of it.
            if !answer.allowed() || cost == 0 {
                continue;
            }
            let spent = algorithm::Spent {
                cost,
                at,
                until: at.saturating_add(answer.reset_micros()),
            };
            let (algorithm, p) = (quota.algorithm(), &quota.params);
            let update = states.with(i, |s| algorithm::give_back(algorithm, s, p, spent, now));
            states.store(i, update, p);
        }
    }

    /// Spends `cost` on every quota counting the cost whatever is left, at
    /// `now`, on the states a store keeps for the key (see
    /// [`Backend::charge`](crate::Backend::charge)): usage beyond a
    /// reservation, whose request was counted already. The store then
    /// peeks at cost 0 for what is left, once its new entries are stored.
    pub(crate) fn charge_in(&self, states: &mut (impl States + ?Sized), cost: u64, now: u64) {
        for (i, quota) in self.quotas.iter().enumerate() {
            if quota.counts() == Counts::Requests {
                continue;
            }
            let (algorithm, p) = (quota.algorithm(), &quota.params);
            let update = states.with(i, |s| algorithm::charge::charge(algorithm, s, p, cost, now));
            states.store(i, update, p);
        }
    }
}
