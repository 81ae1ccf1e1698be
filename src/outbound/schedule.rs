//! The arithmetic of waiting one's turn, shared by [`MemoryPace`](super::MemoryPace)
//! and mirrored by `pace.lua`: a GCRA whose tolerance is stretched by the
//! longest wait a caller accepts. A request is given the slot at which a
//! plain GCRA would first admit it, at once, and sleeps until then; the
//! next caller is scheduled after it, so callers are served in the order
//! they asked, and nobody is starved.
//!
//! All times are microseconds on the store's clock.

use std::time::Duration;

use crate::quota::{Algorithm, Quota};

/// What a key stores: its schedule, and the rate the provider cut it to.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Entry {
    /// The theoretical arrival time of the next unit (0: never used).
    pub tat: u64,
    /// The interval a unit the last cut set (0: no cut, the configured rate).
    pub cut_interval: u64,
    /// When that cut was made.
    pub cut_at: u64,
    /// The end of the last pause the provider asked for (0: none), told to
    /// every caller that asks until then, so that callers scheduled
    /// before it learn of it while they sleep.
    pub pause_until: u64,
}

/// The rate, burst and adaptation bounds of one pacer, in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Microseconds a unit at the configured rate (rounded up).
    pub interval: u64,
    /// Units that may go at once.
    pub burst: u64,
    /// The longest interval adaptation may reach (the slowest rate).
    pub max_interval: u64,
    /// The shortest interval adaptation may reach (the fastest rate).
    pub min_interval: u64,
    /// A cut multiplies the rate by this (0 < f <= 1; 1: no cuts).
    pub decrease: f64,
    /// Units a second the rate regains each second after a cut.
    pub increase: f64,
    /// Microseconds after which a cut is forgotten.
    pub forget: u64,
}

impl Plan {
    /// A plan at `quota`'s rate. GCRA and the token bucket keep their
    /// burst; the leaky bucket (whose burst is a queue, sent at the rate),
    /// the windows and the sliding log get a burst of 1, which sends at most
    /// `limit` in any period however the periods fall (a fixed window's
    /// own schedule would allow twice that across a boundary): stricter,
    /// which is safe for a limit a provider enforces.
    pub(crate) fn of(quota: &Quota) -> Plan {
        let period = u64::try_from(quota.period().as_micros()).unwrap_or(u64::MAX);
        let limit = quota.limit().max(1);
        let interval = period.div_ceil(limit).max(1);
        let burst = match quota.algorithm() {
            Algorithm::Gcra | Algorithm::TokenBucket => quota.burst(),
            _ => 1,
        }
        .max(1);
        Plan {
            interval,
            burst,
            max_interval: interval,
            min_interval: interval,
            decrease: 1.0,
            increase: 0.0,
            forget: 600_000_000,
        }
    }

    /// The interval in force at `now` for a key in state `e`: the
    /// configured one, or the last cut's, regaining `increase` units a
    /// second each second since, within the bounds.
    pub(crate) fn interval_at(&self, e: &Entry, now: u64) -> u64 {
        if e.cut_interval == 0 || now.saturating_sub(e.cut_at) >= self.forget {
            return self.interval;
        }
        let mut interval = e.cut_interval;
        if self.increase > 0.0 {
            let elapsed = now.saturating_sub(e.cut_at) as f64 / 1e6;
            let rate = 1e6 / e.cut_interval as f64 + self.increase * elapsed;
            interval = (1e6 / rate).ceil() as u64;
        }
        interval.clamp(self.min_interval, self.max_interval)
    }
}

/// What a request was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Its slot: go after `delay` microseconds; `interval` is the
    /// interval a unit it was scheduled at (giving back needs it).
    Go { delay: u64, interval: u64 },
    /// Its slot would come after `would_wait` microseconds, more than it
    /// accepts: nothing was reserved.
    TooLong { would_wait: u64 },
}

/// Schedules `cost` units at `now`, accepting a wait up to `max_wait`.
pub(crate) fn acquire(e: &mut Entry, plan: &Plan, cost: u64, now: u64, max_wait: u64) -> Turn {
    let interval = plan.interval_at(e, now);
    let tolerance = plan.burst.saturating_mul(interval);
    let start = e.tat.max(now);
    let next = start.saturating_add(cost.saturating_mul(interval));
    let delay = (next - now).saturating_sub(tolerance);
    if delay > max_wait {
        return Turn::TooLong { would_wait: delay };
    }
    e.tat = next;
    Turn::Go { delay, interval }
}

/// Gives back `cost` units scheduled at `interval` for a slot at `slot`,
/// if it has not come yet: the schedule moves back by their intervals,
/// never before `now`. Callers scheduled after it keep their slots; the
/// room freed goes to the next one to ask.
pub(crate) fn give_back(e: &mut Entry, cost: u64, interval: u64, slot: u64, now: u64) {
    if now >= slot {
        return;
    }
    e.tat = e.tat.saturating_sub(cost.saturating_mul(interval)).max(now);
}

/// What a provider said about a key, in the store's time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Told {
    /// Send nothing before this moment (0: no pause).
    pub pause_until: u64,
    /// A refusal (429): cut the rate, unless the request was scheduled
    /// before the last cut (then the cut already answered it).
    pub cut: bool,
    /// When the refused request was scheduled.
    pub scheduled_at: u64,
    /// The provider announced this interval a unit (0: nothing announced).
    pub announced: u64,
}

/// Applies what the provider said at `now`.
pub(crate) fn obey(e: &mut Entry, plan: &Plan, told: Told, now: u64) {
    if told.announced > 0 {
        e.cut_interval = told.announced.clamp(plan.min_interval, plan.max_interval);
        e.cut_at = now;
    }
    if told.cut && plan.decrease < 1.0 && (e.cut_interval == 0 || told.scheduled_at >= e.cut_at) {
        let current = plan.interval_at(e, now) as f64;
        e.cut_interval =
            ((current / plan.decrease).ceil() as u64).clamp(plan.min_interval, plan.max_interval);
        e.cut_at = now;
    }
    if told.pause_until > now {
        // The next unit's slot lands at the end of the pause, with no
        // burst saved up during it: the provider sees a paced restart.
        let tolerance = plan.burst.saturating_mul(plan.interval_at(e, now));
        e.tat = e.tat.max(told.pause_until.saturating_add(tolerance));
        e.pause_until = e.pause_until.max(told.pause_until);
    }
}

/// How long a key's entry matters after `now`: until its schedule has
/// passed, or its cut is forgotten.
pub(crate) fn lifetime(e: &Entry, plan: &Plan, now: u64) -> u64 {
    let schedule = e.tat.saturating_sub(now);
    if e.cut_interval == 0 {
        return schedule;
    }
    schedule.max((e.cut_at.saturating_add(plan.forget)).saturating_sub(now))
}

/// Microseconds in `d`, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rate: u64, burst: u64) -> Plan {
        let q = Quota::gcra(rate, Duration::from_secs(1))
            .burst(burst)
            .build()
            .unwrap();
        Plan::of(&q)
    }

    #[test]
    fn waiters_get_consecutive_slots() {
        let p = plan(10, 1);
        let mut e = Entry::default();
        let delays: Vec<_> = (0..4)
            .map(|_| match acquire(&mut e, &p, 1, 1_000, u64::MAX) {
                Turn::Go { delay, .. } => delay,
                Turn::TooLong { .. } => panic!("refused"),
            })
            .collect();
        assert_eq!(delays, [0, 100_000, 200_000, 300_000]);
    }

    #[test]
    fn too_long_reserves_nothing() {
        let p = plan(10, 1);
        let mut e = Entry::default();
        acquire(&mut e, &p, 1, 0, 0);
        let before = e;
        assert_eq!(
            acquire(&mut e, &p, 1, 0, 99_999),
            Turn::TooLong {
                would_wait: 100_000
            }
        );
        assert_eq!(e, before);
    }

    #[test]
    fn burst_goes_at_once_then_paced() {
        let p = plan(10, 3);
        let mut e = Entry::default();
        for _ in 0..3 {
            assert_eq!(
                acquire(&mut e, &p, 1, 0, 0),
                Turn::Go {
                    delay: 0,
                    interval: 100_000
                }
            );
        }
        assert_eq!(
            acquire(&mut e, &p, 1, 0, 1_000_000),
            Turn::Go {
                delay: 100_000,
                interval: 100_000
            }
        );
    }

    #[test]
    fn giving_back_an_unsent_slot_frees_it() {
        let p = plan(10, 1);
        let mut e = Entry::default();
        acquire(&mut e, &p, 1, 0, u64::MAX);
        acquire(&mut e, &p, 1, 0, u64::MAX); // slot at 100 ms
        give_back(&mut e, 1, 100_000, 100_000, 10);
        // The next caller gets the freed slot, at 100 ms, not 200 ms.
        assert_eq!(
            acquire(&mut e, &p, 1, 10, u64::MAX),
            Turn::Go {
                delay: 99_990,
                interval: 100_000
            }
        );
        // A slot already come is not given back.
        let tat = e.tat;
        give_back(&mut e, 1, 100_000, 100_000, 100_000);
        assert_eq!(e.tat, tat);
    }

    #[test]
    fn a_pause_moves_the_next_slot_past_it() {
        let p = plan(10, 5);
        let mut e = Entry::default();
        let told = Told {
            pause_until: 2_000_000,
            ..Told::default()
        };
        obey(&mut e, &p, told, 0);
        assert_eq!(
            acquire(&mut e, &p, 1, 0, u64::MAX),
            Turn::Go {
                delay: 2_100_000,
                interval: 100_000
            }
        );
    }

    #[test]
    fn one_cut_per_episode_within_bounds() {
        let mut p = plan(100, 1);
        p.decrease = 0.5;
        p.max_interval = 30_000;
        let mut e = Entry::default();
        let cut = |scheduled_at| Told {
            cut: true,
            scheduled_at,
            ..Told::default()
        };
        obey(&mut e, &p, cut(5), 10);
        assert_eq!(p.interval_at(&e, 10), 20_000);
        // Scheduled before that cut: already answered.
        obey(&mut e, &p, cut(9), 11);
        assert_eq!(p.interval_at(&e, 11), 20_000);
        // Scheduled after it: cut again, but not below the slowest rate.
        obey(&mut e, &p, cut(12), 13);
        assert_eq!(p.interval_at(&e, 13), 30_000);
    }

    #[test]
    fn the_rate_regains_additively_up_to_the_configured_one() {
        let mut p = plan(100, 1);
        p.decrease = 0.5;
        p.max_interval = 1_000_000;
        p.increase = 10.0;
        let mut e = Entry::default();
        obey(
            &mut e,
            &p,
            Told {
                cut: true,
                ..Told::default()
            },
            0,
        );
        assert_eq!(p.interval_at(&e, 0), 20_000); // 50/s
        assert_eq!(p.interval_at(&e, 1_000_000), 16_667); // 60/s
        assert_eq!(p.interval_at(&e, 60_000_000), 10_000); // capped at 100/s
    }

    #[test]
    fn windows_pace_with_a_burst_of_one() {
        let q = Quota::fixed_window(60, Duration::from_secs(60))
            .build()
            .unwrap();
        let p = Plan::of(&q);
        assert_eq!((p.interval, p.burst), (1_000_000, 1));
    }
}
