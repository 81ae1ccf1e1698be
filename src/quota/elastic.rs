//! Elastic mode: one quota, two capacities, one state.

use super::quota::Quota;
use crate::algorithm::{self, Outcome, State};

impl Quota {
    /// Runs the quota's algorithm on its stored state. `room` says whether
    /// the server has room for an elastic quota's extra; other quotas ignore
    /// it.
    ///
    /// The state is always kept for the ceiling. Without room, a request
    /// passes only if the ceiling would admit its cost plus the margin: on
    /// the same state that is exactly the nominal check for the counters and
    /// GCRA's arrival time, and for a token bucket it counts tokens above
    /// the nominal burst as spent. Its retry-after is then when that larger
    /// cost fits (a period when it never can: a cost over the nominal
    /// capacity passes only with room). The Redis script does the same
    /// (decide.lua).
    #[inline]
    pub(crate) fn check(
        &self,
        state: Option<&State>,
        cost: u64,
        now: u64,
        room: bool,
        alone: bool,
    ) -> Outcome {
        let p = &self.params;
        if p.elastic_margin == 0 {
            return algorithm::check(self.algorithm, state, p, cost, now, alone);
        }
        self.check_elastic(state, cost, now, room)
    }

    /// [`check`](Self::check) for an elastic quota: kept out of line, so the
    /// other quotas' checks inline one algorithm call.
    #[inline(never)]
    fn check_elastic(&self, state: Option<&State>, cost: u64, now: u64, room: bool) -> Outcome {
        let p = &self.params;
        // Its refusal branch may be what an admission turns into.
        let outcome = algorithm::check(self.algorithm, state, p, cost, now, false);
        let margin = p.elastic_margin;
        if room || !outcome.allowed {
            return outcome;
        }
        let strict = cost.saturating_add(margin);
        // The algorithms never see a cost over the capacity. Such a request
        // fits only with room; try again after a period.
        if strict > p.capacity {
            return Outcome::deny(p.period.get(), outcome.refuse);
        }
        let strict = algorithm::check(self.algorithm, state, p, strict, now, false);
        if strict.allowed {
            outcome
        } else {
            Outcome::deny(strict.retry_after(), outcome.refuse)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::algorithm::State;
    use crate::algorithm::testing::S;
    use crate::quota::{Algorithm, Mode, Quota};

    /// Checks and commits one request, as a backend does for one quota.
    fn step(q: &Quota, state: &mut Option<State>, now: u64, room: bool) -> bool {
        let outcome = q.check(state.as_ref(), 1, now, room, false);
        let branch = if outcome.allowed {
            outcome.admit
        } else {
            outcome.refuse
        };
        branch.update.apply(state, &q.params);
        outcome.allowed
    }

    fn elastic(algorithm: Algorithm) -> Quota {
        Quota::builder(algorithm, 4, Duration::from_secs(10))
            .mode(Mode::Elastic { percent: 100 })
            .build()
            .unwrap()
    }

    #[test]
    fn elastic_quotas_admit_to_the_ceiling_only_with_room() {
        for a in Algorithm::ALL {
            let q = elastic(a);
            assert_eq!((q.limit(), q.params.capacity, q.max_cost()), (4, 8, 8));
            // Without room: the limit, as an enforced quota.
            let mut state = None;
            let admitted = (0..10).filter(|_| step(&q, &mut state, 0, false)).count();
            assert_eq!(admitted, 4, "{a} without room");
            // With room: up to the ceiling.
            let mut state = None;
            let admitted = (0..10).filter(|_| step(&q, &mut state, 0, true)).count();
            assert_eq!(admitted, 8, "{a} with room");
            // What was admitted over the limit counts once room is gone.
            assert!(!step(&q, &mut state, 0, false), "{a} after the extra");
        }
    }

    #[test]
    fn without_room_the_extra_counts_as_spent() {
        // GCRA, 4 per 10 s (one unit per 2.5 s), ceiling 8.
        let q = elastic(Algorithm::Gcra);
        let mut state = None;
        for _ in 0..6 {
            assert!(step(&q, &mut state, 0, true));
        }
        // Six used, two over the limit: without room the next passes once
        // three units have returned (7.5 s), as the retry-after says.
        let refused = q.check(state.as_ref(), 1, 0, false, false);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after(), 15 * S / 2);
        assert!(!step(&q, &mut state, 15 * S / 2 - 1, false));
        assert!(step(&q, &mut state, 15 * S / 2, false));

        // A token bucket the same: tokens over the nominal burst are extra.
        let q = elastic(Algorithm::TokenBucket);
        let mut state = None;
        for _ in 0..3 {
            assert!(step(&q, &mut state, 0, true));
        }
        // Five tokens left of eight, one above the margin of four.
        assert!(step(&q, &mut state, 0, false));
        assert!(!step(&q, &mut state, 0, false));
        assert!(step(&q, &mut state, 0, true));
    }

    #[test]
    fn quotas_of_other_modes_ignore_room() {
        let q = Quota::gcra(2, Duration::from_secs(10)).build().unwrap();
        let mut state = None;
        let admitted = (0..5).filter(|_| step(&q, &mut state, 0, true)).count();
        assert_eq!(admitted, 2);
    }
}
