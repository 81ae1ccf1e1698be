//! Token bucket: `capacity` tokens, refilled continuously at `limit` per
//! `period`; a request spends `cost` tokens, a refused one spends nothing.
//!
//! The level is kept in exact fractions of a token: units of
//! `1/unit` token, `refill` units per microsecond (see `Params`), so no
//! rounding ever creates or loses a token.

use super::{Branch, Outcome, State, Update};
use crate::quota::Params;

/// The stored bucket.
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

#[inline]
/// `alone`: see [`check`](super::check); an admission then leaves its
/// refusal branch uncomputed, which saves four divisions.
pub(crate) fn check(
    state: Option<&Bucket>,
    p: &Params,
    cost: u64,
    now: u64,
    alone: bool,
) -> Outcome {
    let full = p.capacity * p.unit;
    let (level, at) = match state {
        None => (full, now),
        // A clock that stepped back refills nothing until it catches up.
        Some(b) => {
            let gained = now.saturating_sub(b.at).saturating_mul(p.refill);
            (full.min(b.level.saturating_add(gained)), b.at.max(now))
        }
    };
    let need = cost * p.unit;
    let time_to_fill = |level: u64| (full - level).div_ceil(p.refill) + (at - now);
    // The next whole token: from `level` up to the next multiple of a unit.
    let branch = |level: u64, update| Branch {
        remaining: level / p.unit,
        reset: time_to_fill(level),
        replenish: ((level / p.unit + 1) * p.unit - level).div_ceil(p.refill) + (at - now),
        update,
    };
    if level >= need {
        let left = level - need;
        let admit = branch(
            left,
            Update::Set(State::TokenBucket(Bucket { level: left, at })),
        );
        let refuse = if alone {
            Branch::unread()
        } else {
            branch(level, Update::Keep)
        };
        Outcome::allow(0, admit, refuse)
    } else {
        let refuse = branch(level, Update::Keep);
        Outcome::deny((need - level).div_ceil(p.refill) + (at - now), refuse)
    }
}

#[cfg(test)]
mod tests {
    use crate::Quota;
    use crate::algorithm::testing::{S, Sim};
    use std::time::Duration;

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
        assert_eq!(refused.retry_after, S / 2);
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
        assert_eq!(refused.retry_after, 2 * S);
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
        let r = b.at(0, 1).retry_after;
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
