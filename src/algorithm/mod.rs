//! The six algorithms, each a pure function of (stored state, quota, cost,
//! now) in its own file: no clock, no I/O. Backends load the state, call
//! [`check`], and store what the returned [`Outcome`] says.
//!
//! All arithmetic is on integer microseconds below 2^53 (see
//! [`EXACT_MAX`]) so the Redis scripts can mirror it
//! exactly.
//!
//! # Adding an algorithm
//!
//! Its file here (`check`, `give_back`, its state in one of [`State`]'s
//! shapes); its [`Algorithm`] variant (`kind.rs`: the name, whether it
//! has a burst); its arms in [`check`] and [`give_back`]; and its Lua twin
//! (`backend/redis/<name>.lua`, which registers its own `algorithms` and
//! `give_back_reserved` entries, included in `backend/redis/script.rs`).
//! The memory backend then decides it under its shard's write lock, and
//! the conformance traces (`tests/support/conformance.rs`) compare it with
//! the script once it is in [`Algorithm::ALL`]. A lock-free form is an
//! optimisation: a state of one or two numbers (`word.rs`, `pair.rs`) and
//! a `Path` of its own (`quota/quota.rs`).

pub(crate) mod charge;
pub(crate) mod fixed_window;
pub(crate) mod gcra;
mod kind;
pub(crate) mod leaky_bucket;
pub(crate) mod pair;
mod params;
pub(crate) mod sliding_log;
pub(crate) mod sliding_window;
pub(crate) mod token_bucket;
pub(crate) mod word;

use std::collections::VecDeque;

pub use kind::{Algorithm, Mode};
pub(crate) use params::{EXACT_MAX, Params};

/// What one key stores for one quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    TokenBucket(token_bucket::Bucket),
    /// A state that is one number, never before its expiry: GCRA's and
    /// the leaky bucket's theoretical arrival time; a token bucket's moment
    /// of being full again, when a token is whole microseconds; a fixed
    /// window's end plus its count, under one unit a microsecond.
    Word(u64),
    FixedWindow(fixed_window::Window),
    SlidingWindow(sliding_window::Counters),
    // Boxed so the log, the one unbounded-size state, does not make every
    // other state 40 bytes instead of 32.
    #[allow(clippy::box_collection)]
    SlidingLog(Box<VecDeque<u64>>),
}

impl State {
    /// The moment after which this state means the same as no state at all.
    #[inline]
    pub(crate) fn expires_at(&self, p: &Params) -> u64 {
        match self {
            State::TokenBucket(b) => b.full_at(p),
            State::Word(n) => *n,
            State::FixedWindow(w) => match p.calendar {
                Some(c) => c.end_of(w.start),
                None => w.start.saturating_add(p.period.get()),
            },
            State::SlidingWindow(c) => c.expires_at(p.period.get()),
            State::SlidingLog(log) => log.back().map_or(0, |t| t.saturating_add(p.period.get())),
        }
    }
}

/// The change a decision makes to the stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Update {
    /// Leave it as it is.
    Keep,
    /// Replace it.
    Set(State),
    /// Sliding log: forget what has expired, log `count` entries at `now`,
    /// keep the newest `capacity`.
    Log { now: u64, count: u64 },
}

impl Update {
    /// Applies the update to a stored state (`None`: nothing stored yet).
    /// Returns false when there is nothing to store.
    pub(crate) fn apply(self, slot: &mut Option<State>, p: &Params) -> bool {
        match (self, slot.as_mut()) {
            (Update::Keep, _) => false,
            (update, Some(state)) => {
                update.apply_to(state, p);
                true
            }
            (Update::Set(state), None) => {
                *slot = Some(state);
                true
            }
            (Update::Log { now, count }, None) => {
                let mut log = Box::default();
                sliding_log::append(&mut log, p, now, count);
                *slot = Some(State::SlidingLog(log));
                true
            }
        }
    }

    /// Applies the update to a state stored already, in place.
    #[inline]
    pub(crate) fn apply_to(self, state: &mut State, p: &Params) {
        match self {
            Update::Keep => {}
            Update::Set(new) => *state = new,
            Update::Log { now, count } => match state {
                State::SlidingLog(log) => sliding_log::append(log, p, now, count),
                other => {
                    let mut log = Box::default();
                    sliding_log::append(&mut log, p, now, count);
                    *other = State::SlidingLog(log);
                }
            },
        }
    }
}

/// What a quota reports, and how its state changes, in one of two futures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Branch {
    /// Units left (effective, before soft mode is taken off).
    pub remaining: u64,
    /// Microseconds until the quota is fully restored.
    pub reset: u64,
    /// Microseconds until more quota is available than `remaining`: the
    /// effective window of draft-11's `t`, within which no more than
    /// `remaining` units can be used.
    pub replenish: u64,
    pub update: Update,
}

impl Branch {
    /// A branch never read (the refusal branch of an admission that
    /// decides alone, the admission branch of a refusal): none of its
    /// numbers is computed.
    #[inline]
    pub(crate) fn unread() -> Branch {
        Branch {
            remaining: 0,
            reset: 0,
            replenish: 0,
            update: Update::Keep,
        }
    }
}

/// An algorithm's outcome for one request on one quota: whether it admits
/// it, and what to report and store in either case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub allowed: bool,
    /// Allowed: microseconds the admitted request waits for its turn (the
    /// leaky bucket's delay); refused: microseconds until the same request
    /// would pass. One field, as an outcome has only one of them: 8 bytes
    /// less keeps a set's check within the 128 bytes a move copies inline,
    /// without a call to `memcpy`.
    pub wait: u64,
    /// The state and report if the request is admitted.
    pub admit: Branch,
    /// The state and report if it is not (refused here, or by another quota).
    pub refuse: Branch,
}

impl Outcome {
    #[inline]
    pub(crate) fn allow(delay: u64, admit: Branch, refuse: Branch) -> Outcome {
        Outcome {
            allowed: true,
            wait: delay,
            admit,
            refuse,
        }
    }

    /// A refusal: its admission branch is never read, so nothing of it is
    /// computed or copied.
    #[inline]
    pub(crate) fn deny(retry_after: u64, refuse: Branch) -> Outcome {
        Outcome {
            allowed: false,
            wait: retry_after.max(1),
            admit: Branch::unread(),
            refuse,
        }
    }

    /// Microseconds until the same request would pass: 0 when allowed.
    #[inline]
    pub(crate) fn retry_after(&self) -> u64 {
        if self.allowed { 0 } else { self.wait }
    }

    /// Microseconds the admitted request waits for its turn: 0 when
    /// refused.
    #[cfg(test)]
    pub(crate) fn delay(&self) -> u64 {
        if self.allowed { self.wait } else { 0 }
    }
}

/// What a reservation spent on one quota, for [`give_back`]: `cost` units
/// at `at`, after which the quota was `until` full again (the reservation's
/// reset added to `at`). Past `until` the quota may have been full again
/// meanwhile, which would have absorbed what the reservation took: nothing
/// goes back then, so a give-back never returns units the quota made up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spent {
    pub cost: u64,
    pub at: u64,
    pub until: u64,
}

/// Gives back what a reservation spent on one quota, at `now`: the state as
/// if the reservation had not happened, as far as nothing since makes that
/// unknowable (a window that has rolled over gives nothing back), and never
/// more than a fresh key's. The Redis script's `give_back_reserved` is its
/// twin.
pub(crate) fn give_back(
    algorithm: Algorithm,
    state: Option<&State>,
    p: &Params,
    spent: Spent,
    now: u64,
) -> Update {
    match (algorithm, state) {
        (Algorithm::Gcra | Algorithm::LeakyBucket, Some(State::Word(t))) => {
            gcra::give_back(*t, p.interval, spent, now)
        }
        (Algorithm::TokenBucket, state) => token_bucket::give_back(state, p, spent, now),
        (Algorithm::FixedWindow, state) => fixed_window::give_back(state, p, spent, now),
        (Algorithm::SlidingWindow, Some(State::SlidingWindow(c))) => {
            sliding_window::give_back(c, p, spent)
        }
        (Algorithm::SlidingLog, Some(State::SlidingLog(log))) => {
            sliding_log::give_back(log, p, spent, now)
        }
        // Nothing stored (expired since), or another algorithm's state:
        // nothing of the reservation is left to give back.
        _ => Update::Keep,
    }
}

/// Runs `algorithm` on the stored state. A state of another algorithm (which
/// the backends never store under one quota) counts as no state. `alone`:
/// the quota decides alone, so when it admits, its refusal branch is never
/// read and need not be complete (its numbers may be left at 0).
#[inline]
pub(crate) fn check(
    algorithm: Algorithm,
    state: Option<&State>,
    p: &Params,
    cost: u64,
    now: u64,
    alone: bool,
) -> Outcome {
    match (algorithm, state) {
        (Algorithm::TokenBucket, state) => token_bucket::check(state, p, cost, now, alone),
        (Algorithm::Gcra, Some(State::Word(t))) => gcra::check(Some(*t), p, cost, now, alone),
        (Algorithm::Gcra, _) => gcra::check(None, p, cost, now, alone),
        (Algorithm::LeakyBucket, Some(State::Word(t))) => {
            leaky_bucket::check(Some(*t), p, cost, now, alone)
        }
        (Algorithm::LeakyBucket, _) => leaky_bucket::check(None, p, cost, now, alone),
        (Algorithm::FixedWindow, state) => fixed_window::check(state, p, cost, now),
        (Algorithm::SlidingWindow, Some(State::SlidingWindow(c))) => {
            sliding_window::check(Some(c), p, cost, now, alone)
        }
        (Algorithm::SlidingWindow, _) => sliding_window::check(None, p, cost, now, alone),
        (Algorithm::SlidingLog, Some(State::SlidingLog(l))) => {
            sliding_log::check(Some(l), p, cost, now, alone)
        }
        (Algorithm::SlidingLog, _) => sliding_log::check(None, p, cost, now, alone),
    }
}

/// [`gcra::arrive`] for a quota whose state is the arrival time `tat`
/// (`None`: nothing stored): GCRA, the leaky bucket (which delays), or a
/// token bucket kept as one (see [`token_bucket`]). Called for those only
/// ([`Path::Arrival`](crate::quota::Path)).
#[inline(always)]
pub(crate) fn arrive(
    algorithm: Algorithm,
    tat: Option<u64>,
    p: &Params,
    cost: u64,
    now: u64,
) -> gcra::Arrival {
    debug_assert!(
        matches!(algorithm, Algorithm::Gcra | Algorithm::LeakyBucket)
            || algorithm == Algorithm::TokenBucket && token_bucket::kept_as_arrival(p)
    );
    gcra::arrive(tat, p, cost, now, algorithm == Algorithm::LeakyBucket)
}

/// The arrival time a quota kept as one reads in its stored `state`, as
/// [`check`] reads it: a token bucket's level is the moment it is full
/// again, and a state of another algorithm counts as none.
#[inline]
pub(crate) fn arrival_time(algorithm: Algorithm, state: Option<&State>, p: &Params) -> Option<u64> {
    match (algorithm, state) {
        (Algorithm::TokenBucket, state) => token_bucket::full_at(state, p),
        (_, Some(State::Word(t))) => Some(*t),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Drives one quota through a sequence of requests on a manual timeline.

    use super::*;
    use crate::quota::Quota;

    pub(crate) struct Sim {
        pub quota: Quota,
        pub state: Option<State>,
    }

    pub(crate) const S: u64 = 1_000_000;

    impl Sim {
        pub(crate) fn new(quota: Quota) -> Self {
            Sim { quota, state: None }
        }

        /// Checks and commits as a backend would for a single quota.
        pub(crate) fn at(&mut self, now: u64, cost: u64) -> Outcome {
            let q = &self.quota;
            let step = check(
                q.algorithm(),
                self.state.as_ref(),
                &q.params,
                cost,
                now,
                false,
            );
            let update = if step.allowed {
                step.admit.update.clone()
            } else {
                step.refuse.update.clone()
            };
            update.apply(&mut self.state, &q.params);
            step
        }

        pub(crate) fn allowed(&mut self, now: u64) -> bool {
            self.at(now, 1).allowed
        }
    }
}

#[cfg(test)]
mod tests;
