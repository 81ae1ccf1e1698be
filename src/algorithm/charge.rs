//! Charging units whatever is left: usage reported beyond a reservation
//! (an LLM answer that took more tokens than reserved), already served, so
//! it counts even past the limit. The quota is then in debt: it refuses
//! until the debt has returned, as long as its state can say so. The Redis
//! script's `forcing` mode is its twin.

use super::{Algorithm, Params, State, Update, fixed_window, sliding_window, token_bucket};

/// The furthest a debt reaches, in microseconds (2^40, some 12 days): an
/// arrival time past it would leave the exact range of the Redis script's
/// doubles. Its twin is `DEBT_HORIZON` in charge.lua.
pub(crate) const DEBT_HORIZON: u64 = 1 << 40;

/// The state after `cost` units are spent at `now` on `state`, however
/// few are left.
pub(crate) fn charge(
    algorithm: Algorithm,
    state: Option<&State>,
    p: &Params,
    cost: u64,
    now: u64,
) -> Update {
    if cost == 0 {
        return Update::Keep;
    }
    match algorithm {
        // The arrival time moves on by the units' intervals: the debt is
        // how far it is past now plus the burst, and waits that long.
        Algorithm::Gcra | Algorithm::LeakyBucket => {
            let tat = match state {
                Some(State::Word(t)) => *t,
                _ => 0,
            };
            let next = tat.max(now).saturating_add(cost.saturating_mul(p.interval));
            Update::Set(State::Word(next.min(now + DEBT_HORIZON)))
        }
        Algorithm::TokenBucket => {
            if token_bucket::kept_as_arrival(p) {
                let full_at = token_bucket::full_at(state, p).unwrap_or(0);
                let next = full_at.max(now).saturating_add(cost.saturating_mul(p.unit));
                return Update::Set(State::Word(next.min(now + DEBT_HORIZON)));
            }
            // A level below zero cannot be stored as a level: the bucket is
            // stored as measured later, when it has climbed back to
            // `level`, which the check reads as the same deficit exactly.
            let full = p.capacity * p.unit;
            let deficit = token_bucket::deficit(state, p, now).unwrap_or(0);
            let after = deficit
                .saturating_add(cost.saturating_mul(p.unit))
                .min(DEBT_HORIZON.saturating_mul(p.refill));
            if after <= full {
                return Update::Set(State::TokenBucket(token_bucket::Bucket {
                    level: full - after,
                    at: now,
                }));
            }
            let over = after - full;
            let later = over.div_ceil(p.refill);
            Update::Set(State::TokenBucket(token_bucket::Bucket {
                level: later * p.refill - over,
                at: now + later,
            }))
        }
        Algorithm::FixedWindow => {
            let window = fixed_window::count(state, p, 0, now).window();
            let (start, count) = (window.start, window.count.saturating_add(cost));
            if fixed_window::kept_as_one_number(p) {
                // The count must stay below the period to be read back
                // from end plus count; past the capacity it refuses the
                // same until the window ends, when a fixed window's debt
                // ends too.
                let end = start + p.period.get();
                Update::Set(State::Word(end + count.min(p.period.get() - 1)))
            } else {
                Update::Set(State::FixedWindow(fixed_window::Window { start, count }))
            }
        }
        Algorithm::SlidingWindow => {
            let period = p.period.get();
            let start = now - now % p.period;
            let c = match state {
                Some(State::SlidingWindow(c)) => *c,
                _ => sliding_window::Counters {
                    start,
                    prev: 0,
                    curr: 0,
                },
            };
            let c = if c.start >= start {
                c
            } else if c.start.saturating_add(period) == start {
                sliding_window::Counters {
                    start,
                    prev: c.curr,
                    curr: 0,
                }
            } else {
                sliding_window::Counters {
                    start,
                    prev: 0,
                    curr: 0,
                }
            };
            Update::Set(State::SlidingWindow(sliding_window::Counters {
                curr: c.curr.saturating_add(cost),
                ..c
            }))
        }
        // Each unit is an entry: a full log refuses until its entries
        // expire, so more than the capacity adds no wait, only memory.
        Algorithm::SlidingLog => Update::Log {
            now,
            count: cost.min(p.capacity),
        },
    }
}
