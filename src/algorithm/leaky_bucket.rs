//! Leaky bucket as a queue: requests drain at `limit` per `period`, one every
//! interval. An admitted request is given the moment its turn comes, as a
//! delay, so what leaves the bucket is evenly spaced; a request that would
//! overfill the queue (`capacity` places) is refused.
//!
//! Its bookkeeping is GCRA's: the TAT is when the queue will be empty. What
//! differs is the delay. A queue of one place (`burst(1)`) never delays: it
//! refuses instead, for callers that cannot wait.

use super::Outcome;
use super::Params;
use super::gcra;

#[inline]
pub(crate) fn check(tat: Option<u64>, p: &Params, cost: u64, now: u64, alone: bool) -> Outcome {
    gcra::outcome(tat, p, cost, now, alone, true)
}

#[cfg(test)]
mod tests {
    use crate::Quota;
    use crate::algorithm::testing::{S, Sim};
    use std::time::Duration;

    #[test]
    fn admitted_requests_are_spaced_by_their_delays() {
        // Drains 2 per second, holds 3.
        let q = Quota::leaky_bucket(2, Duration::from_secs(1))
            .burst(3)
            .build()
            .unwrap();
        let mut l = Sim::new(q);
        let delays: Vec<u64> = (0..3).map(|_| l.at(0, 1).delay()).collect();
        assert_eq!(delays, [0, S / 2, S]);
        let full = l.at(0, 1);
        assert!(!full.allowed);
        assert_eq!(full.retry_after(), S / 2);
        let next = l.at(S / 2, 1);
        assert!(next.allowed);
        assert_eq!(next.delay(), S);
    }

    #[test]
    fn a_queue_of_one_never_delays() {
        let q = Quota::leaky_bucket(1, Duration::from_secs(1))
            .burst(1)
            .build()
            .unwrap();
        let mut l = Sim::new(q);
        assert_eq!(l.at(0, 1).delay(), 0);
        assert!(!l.allowed(S / 2));
        let step = l.at(S, 1);
        assert!(step.allowed);
        assert_eq!(step.delay(), 0);
    }
}
