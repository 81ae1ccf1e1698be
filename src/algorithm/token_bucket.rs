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
//! decides it as it decides an arrival time. With 2 to 31 units refilled a
//! microsecond, a backend keeps it as one number too: that moment on a
//! clock of `refill` ticks a microsecond (see `word.rs`).

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
    #[inline]
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
    #[inline]
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
/// stored number by `word::token_bucket_spent` or
/// `pair::BucketClock::spent`); the divisions of what it reports
/// ([`Taken::outcome`]) are made once the swap holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    deficit: u64,
    after: u64,
}

/// [`Taken`] for `cost` at `now` on the stored `state`.
#[inline]
pub(crate) fn take(state: Option<&State>, p: &Params, cost: u64, now: u64) -> Taken {
    Taken::of(deficit(state, p, now).unwrap_or(0), cost * p.unit)
}

impl Taken {
    /// `units` taken from a bucket lacking `deficit` units.
    #[inline]
    pub(crate) fn of(deficit: u64, units: u64) -> Taken {
        Taken {
            deficit,
            after: deficit.saturating_add(units),
        }
    }

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

    /// What the bucket lacking `deficit` units reports:
    /// `[remaining, reset, replenish]`.
    #[inline]
    fn numbers(p: &Params, deficit: u64) -> [u64; 3] {
        let (remaining, replenish) = left(deficit, p.capacity, p.unit, p.refill);
        [remaining, reset(deficit, p.refill), replenish]
    }

    /// What the bucket lacks of full after the request, in `1/unit`
    /// tokens.
    #[inline]
    pub(crate) fn after(&self) -> u64 {
        self.after
    }

    /// What a bucket decided alone reports, without the [`Outcome`] that
    /// [`outcome`](Self::outcome) builds: whether it admits, the wait of a
    /// refusal (0 for an admission), and the numbers of the branch that
    /// holds.
    #[inline]
    pub(crate) fn reported(&self, p: &Params) -> (bool, u64, [u64; 3]) {
        if self.admits(p) {
            (true, 0, Taken::numbers(p, self.after))
        } else {
            (false, self.wait(p), Taken::numbers(p, self.deficit))
        }
    }

    /// A refusal's wait: until the units it lacks are refilled.
    #[inline]
    fn wait(&self, p: &Params) -> u64 {
        (self.after - p.capacity * p.unit).div_ceil(p.refill)
    }

    /// The outcome [`check`] reports: see there for `alone`.
    #[inline]
    pub(crate) fn outcome(&self, p: &Params, now: u64, alone: bool) -> Outcome {
        let branch = |deficit: u64, update| {
            let [remaining, reset, replenish] = Taken::numbers(p, deficit);
            Branch {
                remaining,
                reset,
                replenish,
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
            Outcome::deny(self.wait(p), branch(self.deficit, Update::Keep))
        }
    }
}

/// `(remaining, replenish)` of a bucket of `capacity` tokens lacking
/// `deficit` units (`unit` a token, `refill` a microsecond): the whole
/// tokens left, and the microseconds until one more is. A deficit past
/// full is a level below zero: no token until it climbs back to one.
#[inline]
pub(crate) fn left(deficit: u64, capacity: u64, unit: u64, refill: u64) -> (u64, u64) {
    let full = capacity * unit;
    let remaining = full.saturating_sub(deficit) / unit;
    let next_token = ((remaining + 1) * unit).saturating_add(deficit) - full;
    (remaining, next_token.div_ceil(refill))
}

/// Microseconds until a bucket lacking `deficit` units is full.
#[inline]
pub(crate) fn reset(deficit: u64, refill: u64) -> u64 {
    deficit.div_ceil(refill)
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
mod tests;
