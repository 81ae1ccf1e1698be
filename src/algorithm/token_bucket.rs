//! Token bucket: `capacity` tokens, refilled continuously at `limit` per
//! `period`; a request spends `cost` tokens, a refused one spends nothing.
//!
//! The level is kept in exact fractions of a token: units of
//! `1/unit` token, `refill` units per microsecond (see `Params`), so no
//! rounding ever creates or loses a token.
//!
//! The bucket is decided by its deficit at `now`: the units it lacks to be
//! full, which is the time until it is full, times the refill. A clock
//! behind the state (it stepped back, or another thread stored a later
//! moment first) finds the deficit larger by the refill between the two
//! moments, as an arrival time would: spends recorded later still count.
//!
//! With one unit refilled per microsecond (`refill` 1: a token is a whole
//! number of microseconds, as in 100 a second or 1 000 a minute), the
//! bucket is one number, the moment it is full again, and the algorithm is
//! GCRA's with `unit` as its interval: a level `l` at `now` is an arrival
//! time `now + full - l`. It is kept so ([`State::Word`]), and a backend
//! decides it as it decides an arrival time.

use super::Params;
use super::{Branch, Outcome, Spent, State, Update, gcra};

/// The stored bucket, when a token is not a whole number of microseconds
/// (more than one unit is refilled each microsecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// Tokens, in units of `1/unit` token.
    pub level: u64,
    /// When `level` was measured (microseconds).
    pub at: u64,
}

impl Bucket {
    /// When the bucket will be full again.
    pub(crate) fn full_at(&self, p: &Params) -> u64 {
        let full = p.capacity * p.unit;
        self.at + (full.saturating_sub(self.level)).div_ceil(p.refill)
    }
}

impl Bucket {
    /// The bucket as two numbers: the moment it is full again, and the
    /// units refilled past full by then (`r`, less than `refill`), which
    /// say exactly what it lacked before. `None` where it does not fit.
    pub(crate) fn to_pair(self, p: &Params) -> Option<(u64, u64)> {
        let full = p.capacity * p.unit;
        let lacking = full.saturating_sub(self.level);
        let steps = lacking.div_ceil(p.refill);
        let r = steps.checked_mul(p.refill)? - lacking;
        Some((self.at.checked_add(steps)?, r))
    }

    /// The bucket [`to_pair`](Bucket::to_pair) made `(full_at, r)` of,
    /// measured one microsecond before it is full (`r` 0: when it is full),
    /// which decides every later moment as the bucket did; `None` for
    /// numbers it never makes.
    pub(crate) fn from_pair(full_at: u64, r: u64, p: &Params) -> Option<Bucket> {
        let full = p.capacity * p.unit;
        if r == 0 {
            return Some(Bucket {
                level: full,
                at: full_at,
            });
        }
        Some(Bucket {
            level: full.checked_sub(p.refill.checked_sub(r)?)?,
            at: full_at.checked_sub(1)?,
        })
    }
}

/// Whether the bucket is kept as the moment it is full again: see the
/// module's docs.
#[inline]
pub(crate) fn kept_as_arrival(p: &Params) -> bool {
    p.refill == 1
}

/// The moment a bucket [`kept_as_arrival`] is full again, read from its
/// stored `state` in either form; `None` for no state, or another
/// algorithm's.
#[inline]
pub(crate) fn full_at(state: Option<&State>, p: &Params) -> Option<u64> {
    match state {
        Some(State::Word(t)) => Some(*t),
        Some(State::TokenBucket(b)) => Some(b.full_at(p)),
        _ => None,
    }
}

/// What `state` lacks of a full bucket at `now`, in `1/unit` tokens (past
/// `capacity * unit`: a level below zero, a debt); `None` for no state.
#[inline]
pub(crate) fn deficit(state: Option<&State>, p: &Params, now: u64) -> Option<u64> {
    match state {
        Some(State::TokenBucket(b)) => {
            let lacking = (p.capacity * p.unit).saturating_sub(b.level);
            Some(if now >= b.at {
                lacking.saturating_sub((now - b.at).saturating_mul(p.refill))
            } else {
                lacking.saturating_add((b.at - now).saturating_mul(p.refill))
            })
        }
        Some(State::Word(full_at)) => Some(full_at.saturating_sub(now).saturating_mul(p.refill)),
        _ => None,
    }
}

/// `state`: a [`Bucket`], or the moment the bucket is full again; either
/// is read, and the one [`kept_as_arrival`] says is stored. `alone`: see
/// [`check`](super::check); an admission then leaves its refusal branch
/// uncomputed, which saves divisions.
#[inline]
pub(crate) fn check(
    state: Option<&State>,
    p: &Params,
    cost: u64,
    now: u64,
    alone: bool,
) -> Outcome {
    if kept_as_arrival(p) {
        // `unit` is then `interval`, and `full` GCRA's tolerance.
        return gcra::check(full_at(state, p), p, cost, now, alone);
    }
    take(state, p, cost, now).outcome(p, now, alone)
}

/// A check of a bucket not [`kept_as_arrival`] in plain numbers: what it
/// lacked of full before the request and would lack after it, in `1/unit`
/// tokens. A backend's compare-and-swap loop holds only this (made on the
/// stored numbers by [`Spend::take`]); the divisions of what it reports
/// ([`Taken::outcome`]) are made once the swap holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    deficit: u64,
    after: u64,
}

/// [`Taken`] for `cost` at `now` on the stored `state`.
#[inline]
pub(crate) fn take(state: Option<&State>, p: &Params, cost: u64, now: u64) -> Taken {
    let deficit = deficit(state, p, now).unwrap_or(0);
    Taken {
        deficit,
        after: deficit.saturating_add(cost * p.unit),
    }
}

/// A check of `cost` made on a bucket's two numbers as [`Bucket::to_pair`]
/// makes them, without reading them back into a [`Bucket`]: `cost`'s units
/// are split once, before a compare-and-swap loop, into whole microseconds
/// of refill and the units left over, so that the loop holds one
/// multiplication and a few additions where `to_pair` divides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spend {
    units: u64,
    whole: u64,
    part: u64,
}

impl Spend {
    /// `cost` on a quota of `p`.
    #[inline]
    pub(crate) fn new(p: &Params, cost: u64) -> Spend {
        let units = cost * p.unit;
        let (whole, part) = if units < p.refill {
            (0, units)
        } else {
            (units / p.refill, units % p.refill)
        };
        Spend { units, whole, part }
    }

    /// [`take`] on the bucket `(full_at, r)`, and the bucket's two numbers
    /// after it when it admits: the moment of being full moves by the whole
    /// microseconds, and by one more when the units left over are more than
    /// the `r` refilled past full. `None` for an `r` that `to_pair` never
    /// makes.
    #[inline]
    pub(crate) fn take(
        &self,
        p: &Params,
        (full_at, r): (u64, u64),
        now: u64,
    ) -> Option<(Taken, Option<(u64, u64)>)> {
        if r >= p.refill {
            return None;
        }
        // A bucket full by `now` has nothing refilled past full to count.
        let (full_at, r) = if full_at > now {
            (full_at, r)
        } else {
            (now, 0)
        };
        let deficit = (full_at - now).saturating_mul(p.refill) - r;
        let taken = Taken {
            deficit,
            after: deficit.saturating_add(self.units),
        };
        if !taken.admits(p) {
            return Some((taken, None));
        }
        let carry = self.part > r;
        let next = (
            full_at + self.whole + u64::from(carry),
            r + if carry { p.refill } else { 0 } - self.part,
        );
        Some((taken, Some(next)))
    }
}

impl Taken {
    /// Whether the request fits in the bucket.
    #[inline]
    pub(crate) fn admits(&self, p: &Params) -> bool {
        self.after <= p.capacity * p.unit
    }

    /// The bucket after an admission at `now`.
    #[inline]
    pub(crate) fn bucket(&self, p: &Params, now: u64) -> Bucket {
        Bucket {
            level: (p.capacity * p.unit).saturating_sub(self.after),
            at: now,
        }
    }

    /// The outcome [`check`] reports: see there for `alone`.
    #[inline]
    pub(crate) fn outcome(&self, p: &Params, now: u64, alone: bool) -> Outcome {
        let full = p.capacity * p.unit;
        // A deficit past `full` is a level below zero: no token until it
        // climbs back to one.
        let branch = |deficit: u64, update| {
            let remaining = full.saturating_sub(deficit) / p.unit;
            let next_token = ((remaining + 1) * p.unit).saturating_add(deficit) - full;
            Branch {
                remaining,
                reset: deficit.div_ceil(p.refill),
                replenish: next_token.div_ceil(p.refill),
                update,
            }
        };
        if self.admits(p) {
            let admit = branch(
                self.after,
                Update::Set(State::TokenBucket(self.bucket(p, now))),
            );
            let refuse = if alone {
                Branch::unread()
            } else {
                branch(self.deficit, Update::Keep)
            };
            Outcome::allow(0, admit, refuse)
        } else {
            Outcome::deny(
                (self.after - full).div_ceil(p.refill),
                branch(self.deficit, Update::Keep),
            )
        }
    }
}

/// Gives back `spent` (see [`super::give_back`]): the bucket refilled to
/// `now` as [`check`] reads it, plus the units, never past full. A bucket
/// kept as the moment it is full again is given back as an arrival time.
pub(crate) fn give_back(state: Option<&State>, p: &Params, spent: Spent, now: u64) -> Update {
    if kept_as_arrival(p) {
        return match full_at(state, p) {
            Some(t) => gcra::give_back(t, p.unit, spent, now),
            None => Update::Keep,
        };
    }
    if now >= spent.until {
        return Update::Keep;
    }
    let full = p.capacity * p.unit;
    let Some(deficit) = deficit(state, p, now) else {
        return Update::Keep;
    };
    let after = deficit.saturating_sub(spent.cost.saturating_mul(p.unit));
    // A level still below zero cannot be stored as one: keep the spend
    // rather than round in the client's favour.
    if after >= deficit || after > full {
        return Update::Keep;
    }
    Update::Set(State::TokenBucket(Bucket {
        level: full - after,
        at: now,
    }))
}

#[cfg(test)]
mod tests {
    use super::{Bucket, check};
    use crate::Quota;
    use crate::algorithm::testing::{S, Sim};
    use crate::algorithm::{Outcome, State, Update};
    use std::time::Duration;

    /// The bucket as the level and the moment it was measured, decided on
    /// a clock that never steps back: the reference both forms must match.
    /// Also the bucket after the request.
    fn by_level(
        b: Option<Bucket>,
        q: &Quota,
        cost: u64,
        now: u64,
    ) -> ((bool, u64, [u64; 3]), Bucket) {
        let p = &q.params;
        let full = p.capacity * p.unit;
        let level = b.map_or(full, |b| full.min(b.level + (now - b.at) * p.refill));
        let need = cost * p.unit;
        let left = if level >= need { level - need } else { level };
        let report = [
            left / p.unit,
            (full - left).div_ceil(p.refill),
            ((left / p.unit + 1) * p.unit - left).div_ceil(p.refill),
        ];
        let retry = if level >= need {
            0
        } else {
            (need - level).div_ceil(p.refill).max(1)
        };
        let after = Bucket {
            level: left,
            at: now,
        };
        ((level >= need, retry, report), after)
    }

    /// What a caller reads of an outcome.
    fn seen(o: &Outcome) -> (bool, u64, [u64; 3]) {
        let b = if o.allowed { &o.admit } else { &o.refuse };
        (
            o.allowed,
            o.retry_after(),
            [b.remaining, b.reset, b.replenish],
        )
    }

    #[test]
    fn both_forms_decide_as_the_level_does_on_a_clock_that_never_steps_back() {
        // 100 a second is one unit a microsecond, kept as the moment the
        // bucket is full; 3 per 10 s and 7 a minute are not.
        let quotas = [
            Quota::token_bucket(100, Duration::from_secs(1)).burst(5),
            Quota::token_bucket(3, Duration::from_secs(10)).burst(4),
            Quota::token_bucket(7, Duration::from_secs(60)),
        ];
        for q in quotas {
            let q = q.build().unwrap();
            let one_number = super::kept_as_arrival(&q.params);
            let (mut state, mut level) = (None::<State>, None::<Bucket>);
            let mut now = 5 * S;
            let mut x = 0x2545_f491_4f6c_dd1d_u64;
            let mut allowed = [0; 2];
            for i in 0..2000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // About a token a step, two or so a request.
                now += x % (2 * q.params.period.get() / q.params.limit);
                let cost = 1 + x % 3;
                let o = check(state.as_ref(), &q.params, cost, now, false);
                let (expected, after) = by_level(level, &q, cost, now);
                assert_eq!(seen(&o), expected, "{q:?}, request {i}");
                allowed[usize::from(o.allowed)] += 1;
                if o.allowed {
                    level = Some(after);
                    match &o.admit.update {
                        Update::Set(State::Word(_)) => assert!(one_number, "{q:?}"),
                        Update::Set(State::TokenBucket(_)) => assert!(!one_number, "{q:?}"),
                        other => panic!("{other:?}"),
                    }
                    o.admit.update.clone().apply(&mut state, &q.params);
                }
            }
            assert!(allowed[0] > 100 && allowed[1] > 100, "{q:?}: {allowed:?}");
        }
    }

    #[test]
    fn a_clock_behind_the_state_finds_the_bucket_further_from_full() {
        // A token about every second, two at most, in both forms: 2 per 2 s
        // (one unit a microsecond) and 2 per 2.000001 s (two units).
        for period in [2 * S, 2 * S + 1] {
            let q = Quota::token_bucket(2, Duration::from_micros(period))
                .build()
                .unwrap();
            let mut b = Sim::new(q);
            assert!(b.at(10 * S, 2).allowed);
            // Half a second earlier, the bucket is half a token further from
            // full than when it was emptied: a token comes 1.5 s later.
            let behind = b.at(10 * S - S / 2, 1);
            assert!(!behind.allowed);
            assert_eq!(behind.refuse.remaining, 0);
            assert!(
                behind.retry_after().abs_diff(S + S / 2) <= 1,
                "{period}: {behind:?}"
            );
            assert!(
                behind.refuse.reset.abs_diff(2 * S + S / 2) <= 2,
                "{period}: {behind:?}"
            );
            // A whole token later than that, one is there.
            assert!(b.allowed(11 * S + 1));
        }
    }

    #[test]
    fn an_arrival_time_and_a_bucket_of_the_same_moment_mean_the_same() {
        // A state of either form, as a store may hold from before, is read.
        let q = Quota::token_bucket(10, Duration::from_secs(10))
            .build()
            .unwrap();
        let p = &q.params;
        let bucket = Bucket {
            level: 4 * p.unit,
            at: 20 * S,
        };
        let full_at = State::Word(bucket.full_at(p));
        for now in [20 * S, 21 * S + 3, 30 * S] {
            let a = check(Some(&State::TokenBucket(bucket)), p, 3, now, false);
            let b = check(Some(&full_at), p, 3, now, false);
            assert_eq!(a, b);
        }
    }

    #[test]
    fn bursts_to_capacity_then_refills_continuously() {
        // 2 per second, burst 4.
        let q = Quota::token_bucket(2, Duration::from_secs(1))
            .burst(4)
            .build()
            .unwrap();
        let mut b = Sim::new(q);
        for _ in 0..4 {
            assert!(b.allowed(0));
        }
        let refused = b.at(0, 1);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after(), S / 2);
        assert!(!b.allowed(S / 2 - 1));
        assert!(b.allowed(S / 2));
        // Full again two seconds after the last spend.
        let step = b.at(S / 2, 0);
        assert_eq!(step.admit.reset, 2 * S);
        assert!(b.at(3 * S, 4).allowed);
    }

    #[test]
    fn cost_spends_several_tokens_and_a_refusal_spends_none() {
        let q = Quota::token_bucket(10, Duration::from_secs(10))
            .build()
            .unwrap();
        let mut b = Sim::new(q);
        assert_eq!(b.at(0, 7).admit.remaining, 3);
        let refused = b.at(0, 5);
        assert!(!refused.allowed);
        assert_eq!(refused.refuse.remaining, 3);
        // Two more tokens arrive after two seconds.
        assert_eq!(refused.retry_after(), 2 * S);
        assert!(b.at(2 * S, 5).allowed);
    }

    #[test]
    fn fractional_rates_are_exact() {
        // 3 per 10 s: one token every 3.333... s, never rounded. A burst of
        // two leaves room for the fraction gained between samples.
        let q = Quota::token_bucket(3, Duration::from_secs(10))
            .burst(2)
            .build()
            .unwrap();
        let mut b = Sim::new(q);
        assert!(b.at(0, 2).allowed);
        let r = b.at(0, 1).retry_after();
        assert_eq!(r, 3_333_334);
        assert!(!b.allowed(r - 1));
        assert!(b.allowed(r));
        // The ninth token after r arrives exactly 30 s later.
        let mut admitted = 0;
        for t in (r..=r + 30 * S).step_by(1000) {
            admitted += u64::from(b.allowed(t));
        }
        assert_eq!(admitted, 9);
    }

    #[test]
    fn replenish_is_the_time_to_the_next_whole_token() {
        // One token a second, ten at most.
        let q = Quota::token_bucket(10, Duration::from_secs(10))
            .build()
            .unwrap();
        let mut b = Sim::new(q);
        assert_eq!(b.at(0, 1).admit.replenish, S);
        let step = b.at(S / 2, 1);
        assert_eq!(step.admit.remaining, 8);
        assert_eq!(step.admit.replenish, S / 2);
        // A full bucket gains its next token one interval after a spend.
        assert_eq!(b.at(20 * S, 0).refuse.replenish, S);
    }
}
