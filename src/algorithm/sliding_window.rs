//! Sliding window counter (Cloudflare's method): the count of the previous
//! fixed window, weighted by the share of it still inside the rolling period,
//! plus the count of the current window. The weighted count is rounded down,
//! as the seeds and Cloudflare do: a request passes while the estimate before
//! it is below the limit.
//!
//! The weighting is the one computation done in floating point, in exactly
//! the operations the Redis script performs, so both give the same answer.

use super::Params;
use super::{Branch, Outcome, Spent, State, Update};

/// The stored counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    /// The current window's first microsecond.
    pub start: u64,
    pub prev: u64,
    pub curr: u64,
}

impl Counters {
    /// The moment after which nothing they count is in the estimate.
    #[inline]
    pub(crate) fn expires_at(&self, period: u64) -> u64 {
        self.start.saturating_add(2 * period)
    }
}

impl Counters {
    /// The counters as two numbers: their expiry, and both counts in
    /// [`count_bits`] bits each, the current count lowest; with those bits;
    /// `None` where a count does not fit.
    #[inline]
    pub(crate) fn to_pair(self, p: &Params) -> Option<(u64, u64, u32)> {
        let bits = count_bits(p);
        let fits = (self.prev | self.curr) >> bits == 0;
        let expiry = self.start.checked_add(p.period.get().checked_mul(2)?)?;
        fits.then_some((expiry, self.prev << bits | self.curr, bits))
    }

    /// The counters [`to_pair`](Counters::to_pair) made two numbers of,
    /// each count `bits` wide (1 to 32).
    #[inline]
    pub(crate) fn from_pair(expiry: u64, counts: u64, bits: u32, p: &Params) -> Option<Counters> {
        if !(1..=32).contains(&bits) {
            return None;
        }
        let (prev, curr) = Counters::split(counts, bits);
        Some(Counters {
            start: expiry.checked_sub(p.period.get().saturating_mul(2))?,
            prev,
            curr,
        })
    }

    /// The previous and the current count in `counts`' low bits, each
    /// `bits` wide (1 to 32), the current lowest; the bits above are not
    /// read.
    #[inline(always)]
    pub(crate) fn split(counts: u64, bits: u32) -> (u64, u64) {
        let count = u64::MAX >> (64 - bits);
        ((counts >> bits) & count, counts & count)
    }
}

/// The bits each count of a window of `p` takes as two numbers: as many as
/// its capacity, which no count passes, and at most 32 (a larger capacity
/// is kept so while its counts stay under 2^32).
#[inline]
pub(crate) fn count_bits(p: &Params) -> u32 {
    (64 - p.capacity.leading_zeros()).min(32)
}

/// `floor(prev * remaining_share / period)`, in the script's float arithmetic.
/// The quotient is never negative, so the cast's truncation is the floor,
/// without `f64::floor`'s call into libm (the default x86-64 target has no
/// rounding instruction). Each number is below 2^53 (`EXACT_MAX`), so it
/// converts through `i64` to the same float, in one instruction where an
/// unsigned conversion takes several; the quotient converts back likewise.
#[inline]
fn weigh(prev: u64, still_in: u64, period: u64) -> u64 {
    // Nothing to weigh (a key's first window, or one after a quiet one):
    // no float division.
    if prev == 0 {
        return 0;
    }
    let float = |n: u64| n as i64 as f64;
    // Truncation of a quotient at most `prev`: exact through `i64`.
    (float(prev) * float(still_in) / float(period)) as i64 as u64
}

/// The first offset `e` in `[from, period)` of a window at which `prev`,
/// weighted, is at most `room`.
fn first_fit(prev: u64, room: u64, from: u64, period: u64) -> Option<u64> {
    if prev == 0 || weigh(prev, period - from, period) <= room {
        return Some(from);
    }
    // Exactly: prev * (period - e) < (room + 1) * period.
    let bound = (u128::from(room) + 1) * u128::from(period);
    let max_still_in = bound.div_ceil(u128::from(prev)) - 1;
    let mut e = period.saturating_sub(max_still_in.min(u128::from(period)) as u64);
    // Settle float rounding at the edge, by a few microseconds at most.
    while e < period && weigh(prev, period - e, period) > room {
        e += 1;
    }
    while e > from && weigh(prev, period - (e - 1), period) <= room {
        e -= 1;
    }
    (e < period).then_some(e.max(from))
}

/// The first moment, as an offset from the start of `c`'s window (at least
/// `from`), at which the estimate is at most `room`: in this window as
/// `prev` fades, else in the next, where `curr` becomes the fading count,
/// else two windows on, when nothing counts.
fn fits_at(c: &Counters, room: u64, from: u64, period: u64) -> u64 {
    let this_window = (c.curr <= room)
        .then(|| first_fit(c.prev, room - c.curr, from, period))
        .flatten();
    match this_window {
        Some(e) => e,
        None => period + first_fit(c.curr, room, 0, period).unwrap_or(period),
    }
}

/// The offset from the start of `c`'s window (at least `elapsed`) at which
/// the estimate falls below `used` (or below `capacity`, when over it):
/// when more quota is available.
fn replenished_at(c: &Counters, used: u64, capacity: u64, elapsed: u64, period: u64) -> u64 {
    match used.min(capacity).checked_sub(1) {
        Some(room) => fits_at(c, room, elapsed, period),
        // Nothing used: the quota is whole until the window ends.
        None => period,
    }
}

/// The stored counters moved on to the window of `now`.
#[inline]
fn at_window(state: Option<&Counters>, period: u64, now: u64) -> Counters {
    // A stored window starts on a multiple of the period, so one that
    // ends after `now` is `now`'s or later: no division, in the common
    // case of a window still current.
    if let Some(c) = state
        && now < c.start.saturating_add(period)
    {
        return *c;
    }
    let current = now - now % period;
    match state {
        Some(c) if c.start >= current => *c,
        Some(c) if c.start + period == current => Counters {
            start: current,
            prev: c.curr,
            curr: 0,
        },
        _ => Counters {
            start: current,
            prev: 0,
            curr: 0,
        },
    }
}

/// The offset from the start of `c`'s window at which the quota is whole
/// again: the end of the next window (`curr` > 0) or of this one (`prev` >
/// 0); `None` when nothing counts.
fn whole_at(c: &Counters, period: u64) -> Option<u64> {
    if c.curr > 0 {
        Some(2 * period)
    } else if c.prev > 0 {
        Some(period)
    } else {
        None
    }
}

/// The counters moved on to the window of `now`, how far into it `now`
/// comes, and the weighted estimate there: what every decision starts
/// from.
struct Estimate {
    c: Counters,
    /// `None` when the clock is behind the stored window.
    elapsed: Option<u64>,
    used: u64,
}

#[inline]
fn estimate(state: Option<&Counters>, period: u64, now: u64) -> Estimate {
    estimate_of(at_window(state, period, now), period, now)
}

/// [`estimate`] of counters already moved on to the window of `now`.
#[inline]
fn estimate_of(c: Counters, period: u64, now: u64) -> Estimate {
    let elapsed = now.checked_sub(c.start);
    let used = weigh(c.prev, period - elapsed.unwrap_or(0), period) + c.curr;
    Estimate { c, elapsed, used }
}

/// An admission whose numbers are left to be derived when read
/// ([`Admitted::left`]): the counters after it, or `None` when `cost` does
/// not fit, or the clock is behind the stored window.
#[inline]
fn admission(e: &Estimate, capacity: u64, cost: u64) -> Option<Admitted> {
    let elapsed = e.elapsed?;
    (e.used + cost <= capacity).then(|| Admitted::of(&e.c, cost, elapsed))
}

/// An admission decided without weighing the previous window: its weight
/// is at most its count, so a request that fits beside both counts whole
/// fits beside the estimate. The float division is then made only near
/// the limit, and only if what the admission reports is read. `None`
/// when that bound does not fit, or the clock is behind the window.
#[inline]
pub(crate) fn admitted_unweighed(
    c: &Counters,
    p: &Params,
    cost: u64,
    now: u64,
) -> Option<Admitted> {
    let elapsed = now.checked_sub(c.start)?;
    fits_unweighed(c, p, cost).then(|| Admitted::of(c, cost, elapsed))
}

/// Whether `cost` fits beside both of `c`'s counts whole: the bound on
/// the estimate that [`admitted_unweighed`] admits on.
#[inline(always)]
pub(crate) fn fits_unweighed(c: &Counters, p: &Params, cost: u64) -> bool {
    c.prev.saturating_add(c.curr) < unweighed_room(p, cost)
}

/// The sum of both counts below which `cost` fits beside them whole (0
/// where it never does): [`fits_unweighed`]'s bound, for a loop that tries
/// one cost on counts read anew to compute once.
#[inline(always)]
pub(crate) fn unweighed_room(p: &Params, cost: u64) -> u64 {
    p.capacity.saturating_add(1).saturating_sub(cost)
}

/// An admission, whose numbers are left to be derived when read (in a set
/// of several, whichever way the set decides: see [`Admitted::before`]),
/// handed to `admitted`, or else [`check`]'s outcome, handed to `checked`,
/// from one estimate. Two closures, not a
/// returned enum: the outcome is written where the set keeps it, never
/// moved.
#[inline]
pub(crate) fn admit_or_check<T>(
    state: Option<&Counters>,
    p: &Params,
    cost: u64,
    now: u64,
    admitted: impl FnOnce(Admitted) -> T,
    checked: impl FnOnce(Outcome) -> T,
) -> T {
    let period = p.period.get();
    let c = at_window(state, period, now);
    if let Some(a) = admitted_unweighed(&c, p, cost, now) {
        return admitted(a);
    }
    let e = estimate_of(c, period, now);
    match admission(&e, p.capacity, cost) {
        Some(a) => admitted(a),
        None => checked(decide(&e, p, cost, now, false)),
    }
}

/// An admitted request's counters, kept so that what it reports is
/// computed only if read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Admitted {
    /// The counters after the request.
    pub counters: Counters,
    /// How far into their window the request came, in microseconds.
    pub elapsed: u64,
}

impl Admitted {
    /// `cost` admitted on the counters `c`, `elapsed` into their window.
    #[inline]
    pub(crate) fn of(c: &Counters, cost: u64, elapsed: u64) -> Admitted {
        Admitted {
            counters: Counters {
                curr: c.curr + cost,
                ..*c
            },
            elapsed,
        }
    }

    /// The counters as they were before the admission of `cost`, with what
    /// they report: the request was refused by another quota of its set.
    pub(crate) fn before(&self, cost: u64) -> Admitted {
        Admitted {
            counters: Counters {
                curr: self.counters.curr - cost,
                ..self.counters
            },
            ..*self
        }
    }

    /// The estimate after the request, what [`check`] calls `used`.
    pub(crate) fn used(&self, period: u64) -> u64 {
        let c = &self.counters;
        weigh(c.prev, period - self.elapsed, period) + c.curr
    }

    /// `(remaining, replenish)` as [`check`] reports them, for a quota of
    /// `limit` units reported (soft mode's margin off) and `period`.
    pub(crate) fn left(&self, limit: u64, period: u64) -> (u64, u64) {
        let used = self.used(period);
        // Admitted (or before an admission), so `used` is within the
        // capacity: its own bound.
        let at = replenished_at(&self.counters, used, used, self.elapsed, period);
        (limit.saturating_sub(used), at - self.elapsed)
    }

    /// The reset [`check`] reports: no search.
    pub(crate) fn reset(&self, period: u64) -> u64 {
        whole_at(&self.counters, period).map_or(0, |at| at - self.elapsed)
    }
}

/// The algorithm's outcome for `cost` at `now` on the stored counters.
#[inline]
pub(crate) fn check(
    state: Option<&Counters>,
    p: &Params,
    cost: u64,
    now: u64,
    alone: bool,
) -> Outcome {
    decide(&estimate(state, p.period.get(), now), p, cost, now, alone)
}

/// [`check`] from the estimate at `now`.
#[inline(always)]
fn decide(e: &Estimate, p: &Params, cost: u64, now: u64, alone: bool) -> Outcome {
    let period = p.period.get();
    let (c, used) = (e.c, e.used);
    let elapsed = e.elapsed.unwrap_or(0);
    // From the window's start, not from now, which a clock behind the
    // stored window puts before it.
    let reset = |c: &Counters| whole_at(c, period).map_or(0, |at| c.start + at - now);
    let replenish = |c: &Counters, used| {
        (c.start + replenished_at(c, used, p.capacity, elapsed, period)).saturating_sub(now)
    };
    let fits = used + cost <= p.capacity;
    let refuse = Branch {
        remaining: p.capacity.saturating_sub(used),
        reset: reset(&c),
        // A search, skipped when nobody will read it.
        replenish: if fits && alone {
            0
        } else {
            replenish(&c, used)
        },
        update: Update::Keep,
    };
    if fits {
        let after = Counters {
            curr: c.curr + cost,
            ..c
        };
        let admit = Branch {
            remaining: p.capacity - used - cost,
            reset: reset(&after),
            replenish: replenish(&after, used + cost),
            update: Update::Set(State::SlidingWindow(after)),
        };
        return Outcome::allow(0, admit, refuse);
    }
    // A refused cost of 1 on a full quota waits for the same moment the
    // refusal's replenish found (fits_at starts at now, so nothing was
    // clipped): no second search.
    let room = p.capacity - cost;
    let wait = if used.min(p.capacity).checked_sub(1) == Some(room) {
        refuse.replenish
    } else {
        c.start + fits_at(&c, room, elapsed, period) - now
    };
    Outcome::deny(wait, refuse)
}

/// Gives back `spent` (see [`super::give_back`]): units counted in the
/// stored current window are uncounted there, and in the previous one
/// there, where they still weigh; older ones weigh nothing already.
pub(crate) fn give_back(c: &Counters, p: &Params, spent: Spent) -> Update {
    let period = p.period.get();
    let start = spent.at - spent.at % p.period;
    let after = if c.start == start && c.curr > 0 {
        Counters {
            curr: c.curr.saturating_sub(spent.cost),
            ..*c
        }
    } else if c.start == start.saturating_add(period) && c.prev > 0 {
        Counters {
            prev: c.prev.saturating_sub(spent.cost),
            ..*c
        }
    } else {
        return Update::Keep;
    };
    Update::Set(State::SlidingWindow(after))
}

#[cfg(test)]
mod tests;
