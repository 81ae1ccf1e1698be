use super::Counters;
use crate::Quota;
use crate::algorithm::State;
use crate::algorithm::testing::{S, Sim};
use std::time::Duration;

/// A minute-long quota whose window starting at 60 s holds `curr`, after
/// a window holding `prev`.
fn sim(limit: u64, prev: u64, curr: u64) -> Sim {
    let q = Quota::sliding_window(limit, Duration::from_secs(60))
        .build()
        .unwrap();
    let mut s = Sim::new(q);
    let start = 60 * S;
    s.state = Some(State::SlidingWindow(Counters { start, prev, curr }));
    s
}

#[test]
fn seeds_eleven_point_seventy_five_is_rejected() {
    // 10 per minute, 9 in the previous minute, 5 in this one, 25% in:
    // 9 x 0.75 + 5 = 11.75 > 10.
    let step = sim(10, 9, 5).at(75 * S, 1);
    assert!(!step.allowed);
    assert_eq!(step.refuse.remaining, 0);
}

#[test]
fn seeds_six_point_five_is_allowed() {
    // 7 per minute, previous 5, current 3, 30% in: 3 + 5 x 0.7 = 6.5 < 7.
    let step = sim(7, 5, 3).at(78 * S, 1);
    assert!(step.allowed);
    assert_eq!(step.admit.remaining, 0);
}

#[test]
fn retry_after_is_exact() {
    // 10 x (60 s - e) / 60 s must drop below 5: just after 30 s.
    let mut s = sim(10, 10, 5);
    let step = s.at(60 * S, 1);
    assert!(!step.allowed);
    assert_eq!(step.retry_after(), 30 * S + 1);
    assert!(!s.allowed(90 * S));
    assert!(s.allowed(90 * S + 1));
}

#[test]
fn retry_after_can_reach_into_the_next_window() {
    // The current window is full: the four move to the previous window,
    // where they weigh less than four from the first microsecond on.
    let mut s = sim(4, 0, 4);
    let step = s.at(70 * S, 1);
    assert_eq!(step.retry_after(), 50 * S + 1);
    assert!(!s.allowed(120 * S));
    assert!(s.allowed(120 * S + 1));
}

#[test]
fn counts_move_to_the_previous_window() {
    let mut s = sim(10, 0, 0);
    assert!(s.at(61 * S, 8).allowed);
    // 45 s into the next window, a quarter of the 8 still counts.
    let step = s.at(165 * S, 1);
    assert_eq!(step.admit.remaining, 10 - 2 - 1);
}

#[test]
fn replenish_is_when_the_estimate_falls() {
    // Eight in the window starting at 60 s weigh less than eight from
    // the first microsecond of the next window on.
    let mut s = sim(10, 0, 0);
    let step = s.at(61 * S, 8);
    assert_eq!(step.admit.replenish, 59 * S + 1);
    // 10 x (60 s - e) / 60 s falls below 10 just after the start.
    let step = sim(20, 10, 0).at(60 * S, 1);
    assert_eq!(step.admit.remaining, 9);
    assert_eq!(step.admit.replenish, 1);
}
