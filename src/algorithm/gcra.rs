//! GCRA: one timestamp per key, the theoretical arrival time (TAT) of the
//! next request if traffic ran exactly at the rate. A request conforms when
//! its arrival would not push the TAT more than `capacity` intervals ahead.
//!
//! The interval is rounded up to a whole microsecond, so the rate can only
//! be a hair slower than asked, never faster.

use super::Params;
use super::{Branch, Outcome, Spent, State, Update};

/// Where an arrival time lands for one request, in plain numbers: what
/// GCRA, the leaky bucket and a token bucket kept as its moment of being
/// full share. Nothing here depends on a tag or an algorithm: a backend
/// deciding such a quota alone swaps `next` in and builds the decision from
/// the branch that holds, without the general [`Outcome`], whose remaining
/// and replenish (a division each) nobody may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// Whether the request conforms.
    pub allowed: bool,
    /// As [`Outcome::wait`]: allowed, the delay before its turn (the leaky
    /// bucket's; 0 for the others); refused, the retry-after.
    pub wait: u64,
    /// How far ahead of now the arrival time is if the request is
    /// admitted (the reset then) ...
    pub admit_reset: u64,
    /// ... and the arrival time stored then.
    pub next: u64,
    /// How far ahead of now it is if the request is not (the arrival time
    /// then stays as it is).
    pub refuse_reset: u64,
}

impl Arrival {
    /// The reset of the branch that holds: `admitted` or not.
    #[inline]
    pub(crate) fn reset(&self, admitted: bool) -> u64 {
        if admitted {
            self.admit_reset
        } else {
            self.refuse_reset
        }
    }
}

/// A request of `cost` at `now` on the arrival time `tat` (`None`: nothing
/// stored): whether it is within the tolerance, and where the arrival time
/// lands. `delays`: the leaky bucket, whose admitted request waits for its
/// turn.
#[inline(always)]
pub(crate) fn arrive(tat: Option<u64>, p: &Params, cost: u64, now: u64, delays: bool) -> Arrival {
    let tolerance = p.capacity * p.interval;
    let start = tat.unwrap_or(now).max(now);
    let next = start + cost * p.interval;
    let allowed = next - now <= tolerance;
    let wait = match (allowed, delays) {
        (false, _) => next - tolerance - now,
        (true, true) => start - now,
        (true, false) => 0,
    };
    Arrival {
        allowed,
        wait,
        admit_reset: next - now,
        next,
        refuse_reset: start - now,
    }
}

/// What is left of an arrival-time quota whose TAT is `reset` ahead of
/// now: the units that still fit in the `tolerance`, and the microseconds
/// until the next one returns, when the TAT falls one more `interval` below
/// the tolerance (reset + (remaining + 1) intervals - tolerance). Also what
/// a [`QuotaDecision`](crate::QuotaDecision) kept in that form reports
/// when read.
#[inline]
pub(crate) fn left(reset: u64, tolerance: u64, interval: u64) -> (u64, u64) {
    let remaining = tolerance.saturating_sub(reset) / interval;
    let replenish = (reset + (remaining + 1) * interval).saturating_sub(tolerance);
    (remaining, replenish)
}

/// The general [`Outcome`] of [`arrive`], both branches' numbers counted.
/// `alone`: see [`check`](super::check); an admission then leaves its
/// refusal branch's numbers at 0, which saves a division.
#[inline]
pub(crate) fn outcome(
    tat: Option<u64>,
    p: &Params,
    cost: u64,
    now: u64,
    alone: bool,
    delays: bool,
) -> Outcome {
    let a = arrive(tat, p, cost, now, delays);
    let tolerance = p.capacity * p.interval;
    let branch = |reset: u64, update| {
        let (remaining, replenish) = left(reset, tolerance, p.interval);
        Branch {
            remaining,
            reset,
            replenish,
            update,
        }
    };
    if a.allowed {
        let admit = branch(a.admit_reset, Update::Set(State::Word(a.next)));
        let refuse = if alone {
            Branch::unread()
        } else {
            branch(a.refuse_reset, Update::Keep)
        };
        Outcome::allow(a.wait, admit, refuse)
    } else {
        Outcome::deny(a.wait, branch(a.refuse_reset, Update::Keep))
    }
}

#[inline]
pub(crate) fn check(tat: Option<u64>, p: &Params, cost: u64, now: u64, alone: bool) -> Outcome {
    outcome(tat, p, cost, now, alone, false)
}

/// Gives back `spent` on the arrival time `tat` of a quota of `interval`
/// microseconds a unit (GCRA, the leaky bucket, a token bucket kept as its
/// moment of being full): the time moves back by the units' intervals, and
/// never before `now`, which is already a full quota.
#[inline]
pub(crate) fn give_back(tat: u64, interval: u64, spent: Spent, now: u64) -> Update {
    if now >= spent.until {
        return Update::Keep;
    }
    let back = tat
        .saturating_sub(spent.cost.saturating_mul(interval))
        .max(now);
    if back >= tat {
        return Update::Keep;
    }
    Update::Set(State::Word(back))
}

#[cfg(test)]
mod tests {
    use crate::Quota;
    use crate::algorithm::testing::{S, Sim};
    use std::time::Duration;

    #[test]
    fn burst_then_one_per_interval() {
        let q = Quota::gcra(10, Duration::from_secs(10))
            .burst(3)
            .build()
            .unwrap();
        let mut g = Sim::new(q);
        assert_eq!(g.at(0, 1).admit.remaining, 2);
        assert!(g.allowed(0));
        assert!(g.allowed(0));
        let refused = g.at(0, 1);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after(), S);
        assert!(!g.allowed(S - 1));
        assert!(g.allowed(S));
        assert!(!g.allowed(S));
    }

    #[test]
    fn cost_and_reset() {
        let q = Quota::gcra(4, Duration::from_secs(4)).build().unwrap();
        let mut g = Sim::new(q);
        let step = g.at(0, 3);
        assert!(step.allowed);
        assert_eq!(step.admit.remaining, 1);
        assert_eq!(step.admit.reset, 3 * S);
        let refused = g.at(0, 2);
        assert_eq!(refused.retry_after(), S);
        assert!(!g.at(S - 1, 2).allowed);
        assert!(g.at(S, 2).allowed);
    }

    #[test]
    fn min_interval_spaces_actions() {
        let q = Quota::min_interval(Duration::from_secs(3)).build().unwrap();
        let mut g = Sim::new(q);
        assert!(g.allowed(0));
        assert!(!g.allowed(S));
        assert_eq!(g.at(S, 1).retry_after(), 2 * S);
        assert!(g.allowed(3 * S));
        assert!(!g.allowed(5 * S));
        assert!(g.allowed(7 * S));
    }

    #[test]
    fn replenish_is_the_time_to_the_next_unit() {
        let q = Quota::gcra(10, Duration::from_secs(10))
            .burst(3)
            .build()
            .unwrap();
        let mut g = Sim::new(q);
        let step = g.at(0, 1);
        assert_eq!((step.admit.remaining, step.admit.replenish), (2, S));
        let step = g.at(S / 4, 2);
        assert_eq!((step.admit.remaining, step.admit.replenish), (0, 3 * S / 4));
        let refused = g.at(S / 2, 1);
        assert_eq!(refused.refuse.replenish, refused.retry_after());
    }
}
