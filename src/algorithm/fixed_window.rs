//! Fixed window counter: windows of `period` aligned to multiples of the
//! period since the Unix epoch (a one-minute window starts on the minute);
//! the counter resets at each boundary. Refused requests are not counted.
//!
//! Under one unit a microsecond (`capacity < period`, as in any limit
//! under a million a second), the window is one number, its end plus its
//! count ([`State::Word`]): the end is a multiple of the period and the
//! count is less than one, so the two never mix. The number is at or after
//! the window's end, its expiry, so a backend that sweeps by it never
//! forgets a live window (it keeps an expired one up to `count`
//! microseconds longer); and a backend can update it by compare-and-swap.

use super::Params;
use super::{Branch, Outcome, Spent, State, Update};

/// The stored counter, when it is not kept as one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// The window's first microsecond.
    pub start: u64,
    pub count: u64,
}

/// Whether the window is kept as its end plus its count: see the module's
/// docs.
#[inline]
pub(crate) fn kept_as_one_number(p: &Params) -> bool {
    // A calendar's window ends where the time zone's calendar says, not on
    // a multiple of the period.
    p.capacity < p.period.get() && p.calendar.is_none()
}

/// The end of the window that starts at `start`.
#[inline]
fn end_of(p: &Params, start: u64) -> u64 {
    match p.calendar {
        Some(c) => c.end_of(start),
        None => start.saturating_add(p.period.get()),
    }
}

/// The outcome of a request of `cost` at `now` on the stored `state` (see
/// [`count`]); an admission stores the form [`kept_as_one_number`] says.
#[inline]
pub(crate) fn check(state: Option<&State>, p: &Params, cost: u64, now: u64) -> Outcome {
    let counted = count(state, p, cost, now);
    let refuse = counted.branch(p, cost, false);
    if counted.allowed {
        Outcome::allow(0, counted.branch(p, cost, true), refuse)
    } else {
        Outcome::deny(counted.wait(), refuse)
    }
}

/// A request counted against the window that holds when it comes: all
/// that either of [`check`]'s branches is made of, so a quota in a set of
/// several keeps this (32 bytes, not an outcome's 128) and makes only the
/// branch the set's decision takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    /// The window that holds (a new one counts 0).
    window: Window,
    /// Microseconds from the request to the window's end: at least 1.
    pub end: u64,
    /// Whether the request fits in what the window has left.
    pub allowed: bool,
}

/// A request of `cost` at `now` counted on the stored `state`: a
/// [`Window`], or its end plus its count; either is read.
#[inline]
pub(crate) fn count(state: Option<&State>, p: &Params, cost: u64, now: u64) -> Counted {
    // A window newer than the clock (it stepped back) still holds. Starts
    // are multiples of the period, so a window ending after `now` starts
    // at or after the current one: the current start, a division, is only
    // worked out for a new window.
    let window = match state {
        Some(State::FixedWindow(w)) if end_of(p, w.start) > now => *w,
        // A word at or before `now` ends before it: no division to know.
        Some(&State::Word(end_and_count)) if end_and_count > now => {
            let count = end_and_count % p.period;
            let end = end_and_count - count;
            if end > now {
                Window {
                    start: end - p.period.get(),
                    count,
                }
            } else {
                new_window(p, now)
            }
        }
        _ => new_window(p, now),
    };
    Counted::of(window, end_of(p, window.start), p, cost, now)
}

/// The end of the window holding `now`, for a window kept as one number
/// (no calendar): its division made before the word is read, so that
/// [`count_word`] reads the count with a subtraction.
#[inline]
pub(crate) fn end_at(p: &Params, now: u64) -> u64 {
    (now - now % p.period).saturating_add(p.period.get())
}

/// [`count`] on a window kept as one number, `end` the end of the window
/// holding `now` ([`end_at`]): a word of that window (its end plus a count
/// under the period) is counted with a subtraction, any other word as
/// `count` counts it. In a swap's loop, that keeps the division out of the
/// time between the word's load and its swap, in which another thread
/// checking the same key takes the key's line away (on 16 cores, one hot
/// key read 0.89x GCRA's checks a second at 16 threads with the division
/// of the word there).
#[inline(always)]
pub(crate) fn count_word(word: u64, end: u64, p: &Params, cost: u64, now: u64) -> Counted {
    let period = p.period.get();
    match word.checked_sub(end) {
        Some(count) if count < period => {
            let window = Window {
                start: end - period,
                count,
            };
            Counted::of(window, end, p, cost, now)
        }
        _ => self::count(Some(&State::Word(word)), p, cost, now),
    }
}

/// The window that holds at `now`, with nothing counted yet.
#[inline]
fn new_window(p: &Params, now: u64) -> Window {
    let start = match p.calendar {
        Some(c) => c.at(now).0,
        None => now - now % p.period,
    };
    Window { start, count: 0 }
}

impl Counted {
    /// A request of `cost` at `now` counted in `window`, which ends at
    /// `end` (after `now`).
    #[inline(always)]
    fn of(window: Window, end: u64, p: &Params, cost: u64, now: u64) -> Counted {
        Counted {
            window,
            end: end - now,
            allowed: window.count + cost <= p.capacity,
        }
    }

    /// The window that holds, with what it has counted.
    #[inline]
    pub(crate) fn window(&self) -> Window {
        self.window
    }

    /// Microseconds until the same request would pass: none if it fits,
    /// else until the window's end, when the whole quota returns.
    #[inline]
    pub(crate) fn wait(&self) -> u64 {
        if self.allowed { 0 } else { self.end }
    }

    /// The window after an admission of `cost`, as the one number a window
    /// [`kept_as_one_number`] is stored as: its end plus its count.
    #[inline]
    pub(crate) fn word_after(&self, p: &Params, cost: u64) -> u64 {
        self.window.start + p.period.get() + self.window.count + cost
    }

    /// What the quota reports and stores if the request is `admitted`
    /// (only when it is [`allowed`](Self::allowed)) or not.
    #[inline]
    pub(crate) fn branch(&self, p: &Params, cost: u64, admitted: bool) -> Branch {
        let w = self.window;
        if !admitted {
            return Branch {
                remaining: p.capacity.saturating_sub(w.count),
                reset: if w.count == 0 { 0 } else { self.end },
                // The whole quota returns at the boundary, and nothing
                // before it.
                replenish: self.end,
                update: Update::Keep,
            };
        }
        Branch {
            remaining: p.capacity - (w.count + cost),
            reset: self.end,
            replenish: self.end,
            update: Update::Set(self.state_after(p, cost)),
        }
    }

    /// The state stored after an admission of `cost`, in the form
    /// [`kept_as_one_number`] says.
    #[inline]
    pub(crate) fn state_after(&self, p: &Params, cost: u64) -> State {
        if kept_as_one_number(p) {
            State::Word(self.word_after(p, cost))
        } else {
            State::FixedWindow(Window {
                count: self.window.count + cost,
                ..self.window
            })
        }
    }
}

/// Gives back `spent` (see [`super::give_back`]): units counted in the
/// window that still holds are uncounted; a window that has ended since
/// took them with it.
pub(crate) fn give_back(state: Option<&State>, p: &Params, spent: Spent, now: u64) -> Update {
    let start = new_window(p, spent.at).start;
    let end = end_of(p, start);
    if end <= now {
        return Update::Keep;
    }
    match state {
        Some(State::FixedWindow(w)) if w.start == start && w.count > 0 => {
            Update::Set(State::FixedWindow(Window {
                count: w.count.saturating_sub(spent.cost),
                ..*w
            }))
        }
        Some(&State::Word(end_and_count)) => {
            let count = end_and_count % p.period;
            if end_and_count - count != end || count == 0 {
                return Update::Keep;
            }
            Update::Set(State::Word(end + count.saturating_sub(spent.cost)))
        }
        _ => Update::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::{Window, check, count, count_word, end_at, kept_as_one_number};
    use crate::Quota;
    use crate::algorithm::testing::{S, Sim};
    use crate::algorithm::{State, Update};
    use std::time::Duration;

    #[test]
    fn a_window_and_its_end_plus_count_mean_the_same() {
        // 999 999 a second: the largest count, one below the period, still
        // reads back exactly. A million a second is kept as a window.
        let q = Quota::fixed_window(999_999, Duration::from_secs(1))
            .build()
            .unwrap();
        let p = &q.params;
        assert!(kept_as_one_number(p));
        let start = 1_760_000_000 * S;
        for count in [0, 1, 500_000, 999_998, 999_999] {
            let window = Window { start, count };
            let one_number = State::Word(start + S + count);
            for now in [start, start + 3, start + S - 1, start + S, start - 1] {
                let a = check(Some(&State::FixedWindow(window)), p, 1, now);
                let b = check(Some(&one_number), p, 1, now);
                assert_eq!(a, b, "count {count}, at {now}");
                if let Update::Set(State::Word(n)) = &a.admit.update {
                    assert_eq!(n % S, a.admit.remaining.abs_diff(999_999), "{n}");
                    assert!(*n >= start + S, "the number is never before the end");
                }
            }
        }
        let million = Quota::fixed_window(1_000_000, Duration::from_secs(1))
            .build()
            .unwrap();
        assert!(!kept_as_one_number(&million.params));
        let step = check(None, &million.params, 1, start);
        assert!(matches!(
            step.admit.update,
            Update::Set(State::FixedWindow(_))
        ));
    }

    proptest::proptest! {
        /// A word counted on the end of `now`'s window, worked out before
        /// it is read, counts as the word read alone does: a word of that
        /// window, of an earlier or later one, or no window's.
        #[test]
        fn a_word_counted_on_the_end_of_nows_window_is_the_word_counted(
            limit in 1u64..1_000,
            window in 0u64..4,
            count_in in 0u64..1_000,
            now in 1_000_000u64..4_000_000,
            cost in 0u64..50,
            garbage in proptest::prelude::any::<u64>(),
            forged in proptest::prelude::any::<bool>(),
        ) {
            let q = Quota::fixed_window(limit, Duration::from_secs(1)).build().unwrap();
            let p = &q.params;
            proptest::prop_assume!(kept_as_one_number(p));
            let word = if forged {
                garbage
            } else {
                (window + 1) * 1_000_000 + count_in % (limit + 1)
            };
            let (read, on_end) = (
                count(Some(&State::Word(word)), p, cost, now),
                count_word(word, end_at(p, now), p, cost, now),
            );
            proptest::prop_assert_eq!(read, on_end);
        }
    }

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
        assert_eq!(refused.retry_after(), 6 * S);
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
