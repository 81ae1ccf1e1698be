//! A set's evaluation: one request decided against its quotas' states.

use smallvec::SmallVec;

use super::checked::{Checked, Outcomes, RawQuotaDecision, resolve, resolve_counted};
use super::{QuotaSet, SET_INLINE, States, requests};
use crate::algorithm::{
    self, Outcome, State, Update, fixed_window, gcra, sliding_window, token_bucket,
};
use crate::clock::Timestamp;
use crate::decision::{Decision, QuotaDecision};
use crate::quota::Quota;

impl QuotaSet {
    /// Decides one request against the stored states and hands each
    /// quota's update to [`States::store`]. `commit: false` is a peek;
    /// `room`: whether elastic quotas may use their extra.
    pub(crate) fn evaluate(
        &self,
        states: &mut (impl States + ?Sized),
        cost: u64,
        now: Timestamp,
        commit: bool,
        room: bool,
    ) -> Decision {
        let now = now.as_micros();
        if let [quota] = &*self.quotas {
            let cost = self.cost_of(cost, commit);
            let (decision, update) =
                states.with(0, |s| self.evaluate_one(s, cost, now, commit, room));
            states.store(0, update, &quota.params);
            return decision;
        }
        if self.counts_requests {
            self.evaluate_many::<true>(states, cost, now, commit, room)
        } else {
            self.evaluate_many::<false>(states, cost, now, commit, room)
        }
    }

    /// [`evaluate`](QuotaSet::evaluate) for a set of several quotas.
    /// `MIXED`: whether some quota counts requests, so that each quota's
    /// units are worked out; made a constant so that the sets that do not
    /// (most) pay nothing for it.
    #[inline]
    fn evaluate_many<const MIXED: bool>(
        &self,
        states: &mut (impl States + ?Sized),
        cost: u64,
        now: u64,
        commit: bool,
        room: bool,
    ) -> Decision {
        // Each quota spends its own units: the cost, or the request.
        let requests = requests(cost, commit);
        let units = |quota: &Quota| {
            if MIXED {
                quota.units(cost, requests)
            } else {
                cost
            }
        };
        // Pushed once and resolved in place, never moved again.
        let mut checks = SmallVec::<[Checked; SET_INLINE]>::new();
        let mut outcomes = Outcomes::new();
        for (i, quota) in self.quotas.iter().enumerate() {
            let cost = units(quota);
            let check = states.with(i, |s| {
                Checked::new(quota, s, cost, now, room, &mut outcomes)
            });
            checks.push(check);
        }
        let allowed = self.admits(checks.iter().map(Checked::allowed));
        // Each check turned into its decision, and its update stored, as it
        // resolves: no list of either between.
        Decision::new(
            allowed,
            checks
                .iter_mut()
                .zip(&*self.quotas)
                .enumerate()
                .map(|(i, (checked, quota))| {
                    let cost = units(quota);
                    let (decision, update) =
                        checked.resolve(quota, allowed, commit, cost, &mut outcomes);
                    states.store(i, update, &quota.params);
                    decision
                }),
        )
    }

    /// [`evaluate`](QuotaSet::evaluate) for a set of one quota, the common
    /// case: no list of outcomes or updates, and the decision built in place.
    #[inline]
    pub(crate) fn evaluate_one(
        &self,
        state: Option<&State>,
        cost: u64,
        now: u64,
        commit: bool,
        room: bool,
    ) -> (Decision, Update) {
        // Alone in its set: when it admits, its refusal is never read.
        self.resolve_one(
            |q| q.check(state, cost, now, room, true),
            commit,
            RawQuotaDecision::decision,
        )
    }

    /// [`evaluate_one`](QuotaSet::evaluate_one) for the quota of a set of
    /// one whose algorithm already gave its `outcome`.
    #[inline]
    pub(crate) fn evaluate_outcome(&self, outcome: Outcome, commit: bool) -> (Decision, Update) {
        self.resolve_one(|_| outcome, commit, RawQuotaDecision::decision)
    }

    /// The decision of a set of one sliding window, not elastic
    /// (`Path::SlidingWindow`), that admitted (`sliding_window::admit_or_check`):
    /// its numbers (a search, for replenish) are computed only when read.
    #[inline]
    pub(crate) fn sliding_window_admitted(&self, admitted: sliding_window::Admitted) -> Decision {
        let p = &self.quotas[0].params;
        Decision::one(true, QuotaDecision::sliding_window(p, admitted))
    }

    /// The decision of a set of one token bucket kept as two numbers, not
    /// elastic (`Path::Bucket`), on its check `taken`: only the branch that
    /// holds is computed, and no update, which the backend has stored.
    #[inline]
    pub(crate) fn bucket_decision(&self, taken: &token_bucket::Taken) -> Decision {
        let quota = &self.quotas[0];
        let p = &quota.params;
        // An admission's numbers are left to be computed when read: each
        // takes a division, and a caller that only asks whether the request
        // passed reads none.
        if p.capacity == p.reported_capacity && taken.admits(p) {
            return Decision::one(true, QuotaDecision::bucket(p, taken.after()));
        }
        let (admits, wait, numbers) = taken.reported(p);
        let raw = RawQuotaDecision::resolved(admits, wait, admits, numbers);
        Decision::one(admits || p.shadow, raw.decision(quota))
    }

    /// The decision of a set of one fixed window, not elastic
    /// (`Path::Window`, `Path::WindowPair`), on its count `counted` of
    /// `cost` (the backend counts inside its compare-and-swap loop, and
    /// stores what `Counted::state_after` says if it admits): only the
    /// branch that holds is made, once the swap holds.
    #[inline]
    pub(crate) fn window_decision(&self, counted: &fixed_window::Counted, cost: u64) -> Decision {
        let quota = &self.quotas[0];
        let allowed = counted.allowed || quota.params.shadow;
        let (decision, _) = resolve_counted(counted, quota, allowed, false, cost);
        Decision::one(allowed, decision)
    }

    /// A set of one quota decided: its outcome resolved into the update to
    /// store and the decision, in the form `report` gives it.
    #[inline(always)]
    fn resolve_one(
        &self,
        check: impl FnOnce(&Quota) -> Outcome,
        commit: bool,
        report: impl FnOnce(&RawQuotaDecision, &Quota) -> QuotaDecision,
    ) -> (Decision, Update) {
        let quota = &self.quotas[0];
        let mut outcome = check(quota);
        let allowed = outcome.allowed || quota.params.shadow;
        let (raw, update) = resolve(&mut outcome, allowed, commit);
        (Decision::one(allowed, report(&raw, quota)), update)
    }

    /// Whether a request passes, given whether each quota admits it: every
    /// enforced quota must.
    pub(crate) fn admits(&self, allowed: impl IntoIterator<Item = bool>) -> bool {
        self.quotas
            .iter()
            .zip(allowed)
            .all(|(q, allowed)| allowed || q.params.shadow)
    }

    /// The decision reported for the quotas' raw decisions (one per quota, in
    /// order), however they were computed: in this process or by the Redis
    /// script, which returns the same numbers.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // the Redis backend's
    pub(crate) fn decision_from(&self, raw: &[RawQuotaDecision]) -> Decision {
        let allowed = self.admits(raw.iter().map(|v| v.allowed));
        let decisions = raw.iter().zip(&*self.quotas).map(|(v, q)| v.decision(q));
        Decision::new(allowed, decisions)
    }
}

/// The check of a set of one quota kept as an arrival time, not elastic
/// ([`Path::Arrival`](crate::quota::Path)), on the stored `tat`: plain
/// numbers, made inside the backend's compare-and-swap loop, which stores
/// `next` if it admits. The decision is built from them once the swap
/// holds ([`arrival_decision`]), outside the loop. Given the set's one
/// quota, not the set: the backend has it at hand, and indexing the set
/// again costs a bounds check each time.
#[inline(always)]
pub(crate) fn arrive(quota: &Quota, tat: u64, cost: u64, now: u64) -> gcra::Arrival {
    algorithm::arrive(quota.algorithm(), Some(tat), &quota.params, cost, now)
}

/// The decision of a set of one quota kept as an arrival time on its
/// check `a` ([`arrive`]). Alone in its set, the quota is admitted exactly
/// when it admits (a shadow quota that refuses lets the request pass, but
/// spends nothing). Remaining and replenish are left to be derived from the
/// reset when read: the division they take is then never made for a
/// caller that does not read them.
#[inline]
pub(crate) fn arrival_decision(quota: &Quota, a: &gcra::Arrival) -> Decision {
    let allowed = a.allowed || quota.params.shadow;
    let reset = a.reset(a.allowed);
    let raw = RawQuotaDecision::resolved(a.allowed, a.wait, a.allowed, [0, reset, 0]);
    Decision::one(allowed, raw.arrival_decision(quota))
}
