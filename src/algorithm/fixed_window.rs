//! Fixed window counter: windows of `period` aligned to multiples of the
//! period since the Unix epoch (a one-minute window starts on the minute);
//! the counter resets at each boundary. Refused requests are not counted.

use super::{Branch, Outcome, State, Update};
use crate::quota::Params;

/// The stored counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// The window's first microsecond.
    pub start: u64,
    pub count: u64,
}

#[inline]
pub(crate) fn check(state: Option<&Window>, p: &Params, cost: u64, now: u64) -> Outcome {
    let current = now - now % p.period;
    // A window newer than the clock (it stepped back) still holds.
    let w = match state {
        Some(w) if w.start >= current => *w,
        _ => Window {
            start: current,
            count: 0,
        },
    };
    let end = w.start + p.period - now;
    let refuse = Branch {
        remaining: p.capacity.saturating_sub(w.count),
        reset: if w.count == 0 { 0 } else { end },
        // The whole quota returns at the boundary, and nothing before it.
        replenish: end,
        update: Update::Keep,
    };
    if w.count + cost <= p.capacity {
        let count = w.count + cost;
        let admit = Branch {
            remaining: p.capacity - count,
            reset: end,
            replenish: end,
            update: Update::Set(State::FixedWindow(Window { count, ..w })),
        };
        Outcome::allow(0, admit, refuse)
    } else {
        Outcome::deny(end, refuse)
    }
}

#[cfg(test)]
mod tests {
    use crate::Quota;
    use crate::algorithm::testing::{S, Sim};
    use std::time::Duration;

    #[test]
    fn boundary_burst_admits_twice_the_limit_in_one_rolling_minute() {
        // The seeds' example: 5 per minute, 5 at 02:00:30-59 and 5 at
        // 02:01:00-30, all admitted.
        let q = Quota::fixed_window(5, Duration::from_secs(60))
            .build()
            .unwrap();
        let mut w = Sim::new(q);
        let t0 = 120 * S;
        for i in 0..5 {
            assert!(w.allowed(t0 + (30 + 7 * i) * S));
        }
        assert!(!w.allowed(t0 + 59 * S));
        for i in 0..5 {
            assert!(w.allowed(t0 + (60 + 7 * i) * S));
        }
    }

    #[test]
    fn retry_after_is_the_next_boundary() {
        let q = Quota::fixed_window(2, Duration::from_secs(10))
            .build()
            .unwrap();
        let mut w = Sim::new(q);
        assert!(w.at(3 * S, 2).allowed);
        let refused = w.at(4 * S, 1);
        assert_eq!(refused.retry_after, 6 * S);
        assert_eq!(refused.refuse.reset, 6 * S);
        assert!(!w.allowed(10 * S - 1));
        assert!(w.allowed(10 * S));
    }

    #[test]
    fn replenish_is_the_window_end() {
        let q = Quota::fixed_window(2, Duration::from_secs(10))
            .build()
            .unwrap();
        let mut w = Sim::new(q);
        assert_eq!(w.at(3 * S, 1).admit.replenish, 7 * S);
        assert_eq!(w.at(4 * S, 5).refuse.replenish, 6 * S);
    }
}
