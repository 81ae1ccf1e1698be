//! Sliding window log: the timestamps of the admitted requests in the last
//! `period`, oldest first. A request passes when the live entries plus its
//! cost fit in the limit. At most `limit` entries are kept: older ones can
//! never change a decision, so memory is bounded by the limit, not by
//! traffic.
//!
//! With `count_rejected`, refused attempts are logged too (the variant of the
//! seeds and of ClassDojo): a client that keeps retrying stays limited.

use std::collections::VecDeque;

use super::Params;
use super::{Branch, Outcome, Spent, State, Update};

/// The position of `log`'s oldest entry still counted at `now` (the
/// length, when none is): the entries from there on are live.
fn first_live(log: &VecDeque<u64>, period: u64, now: u64) -> usize {
    log.partition_point(|&t| t + period <= now)
}

/// Microseconds until the oldest live entry of `log` (at `first`) expires
/// and frees a place; `otherwise` when no entry is live.
fn replenish(log: &VecDeque<u64>, first: usize, period: u64, now: u64, otherwise: u64) -> u64 {
    log.get(first)
        .map_or(otherwise, |t| (t + period).saturating_sub(now))
}

/// `alone`: see [`check`](super::check).
pub(crate) fn check(
    log: Option<&VecDeque<u64>>,
    p: &Params,
    cost: u64,
    now: u64,
    alone: bool,
) -> Outcome {
    let empty = VecDeque::new();
    let log = log.unwrap_or(&empty);
    let period = p.period.get();
    // One search for the live entries serves every number below.
    let first = first_live(log, period, now);
    let n = (log.len() - first) as u64;
    let newest = log.back().copied();
    let reset = |newest: Option<u64>| newest.map_or(0, |t| (t + period).saturating_sub(now));
    let append = Update::Log { now, count: cost };
    if n + cost <= p.capacity {
        let logged_at = now.max(newest.unwrap_or(0));
        let admit = Branch {
            remaining: p.capacity - n - cost,
            reset: reset(Some(logged_at)),
            replenish: replenish(log, first, period, now, logged_at + period - now),
            update: append,
        };
        let refuse = if alone {
            Branch::unread()
        } else {
            Branch {
                remaining: p.capacity - n,
                reset: reset(newest),
                replenish: replenish(log, first, period, now, period),
                update: Update::Keep,
            }
        };
        return Outcome::allow(0, admit, refuse);
    }
    // The request passes once enough of the oldest entries have expired for
    // the newest `capacity - cost` to be all that is left.
    let (refuse, wait) = if p.count_rejected {
        let mut after = log.clone();
        append_entries(&mut after, p, now, cost);
        let first = first_live(&after, period, now);
        let view = Branch {
            remaining: p.capacity.saturating_sub((after.len() - first) as u64),
            reset: reset(after.back().copied()),
            replenish: replenish(&after, first, period, now, period),
            update: append,
        };
        (view, oldest_blocking(&after, p, cost))
    } else {
        let view = Branch {
            remaining: p.capacity - n.min(p.capacity),
            reset: reset(newest),
            replenish: replenish(log, first, period, now, period),
            update: Update::Keep,
        };
        (view, oldest_blocking(log, p, cost))
    };
    Outcome::deny((wait + period).saturating_sub(now), refuse)
}

/// The entry whose expiry lets a request of `cost` pass.
fn oldest_blocking(log: &VecDeque<u64>, p: &Params, cost: u64) -> u64 {
    let keep = (p.capacity - cost) as usize;
    log.get(log.len().saturating_sub(keep + 1))
        .copied()
        .unwrap_or(0)
}

/// Logs `count` entries at `now` into a stored log.
pub(crate) fn append(log: &mut VecDeque<u64>, p: &Params, now: u64, count: u64) {
    log.drain(..first_live(log, p.period.get(), now));
    append_entries(log, p, now, count);
}

fn append_entries(log: &mut VecDeque<u64>, p: &Params, now: u64, count: u64) {
    // A clock that stepped back must not unsort the log: log at the newest
    // time seen instead, which only makes the entry last longer.
    let at = now.max(log.back().copied().unwrap_or(0));
    let cap = p.capacity as usize;
    let count = (count as usize).min(cap);
    let overflow = (log.len() + count).saturating_sub(cap);
    log.drain(..overflow);
    log.extend(std::iter::repeat_n(at, count));
}

/// Gives back `spent` (see [`super::give_back`]): up to `cost` entries
/// logged at the reservation's moment are taken out, while they still
/// count. Entries of that moment are alike, so which ones does not matter;
/// a reservation logged later (a clock that stepped back) finds none and
/// keeps its spend.
pub(crate) fn give_back(log: &VecDeque<u64>, p: &Params, spent: Spent, now: u64) -> Update {
    if spent.at.saturating_add(p.period.get()) <= now {
        return Update::Keep;
    }
    let from = log.partition_point(|&t| t < spent.at);
    let to = log.partition_point(|&t| t <= spent.at);
    let n = (to - from).min(usize::try_from(spent.cost).unwrap_or(usize::MAX));
    if n == 0 {
        return Update::Keep;
    }
    let mut after = log.clone();
    after.drain(to - n..to);
    Update::Set(State::SlidingLog(Box::new(after)))
}

#[cfg(test)]
mod tests {
    use crate::Quota;
    use crate::algorithm::State;
    use crate::algorithm::testing::{S, Sim};
    use std::time::Duration;

    #[test]
    fn seeds_example_with_rejected_attempts_logged() {
        // 2 per minute, rejected attempts kept: 0:12 and 0:24 pass, 0:36 is
        // rejected; at 1:25 only the 0:36 entry is live, so 1:25 passes.
        let q = Quota::sliding_log(2, Duration::from_secs(60))
            .count_rejected(true)
            .build()
            .unwrap();
        let mut l = Sim::new(q);
        assert!(l.allowed(12 * S));
        assert!(l.allowed(24 * S));
        let refused = l.at(36 * S, 1);
        assert!(!refused.allowed);
        // The 0:24 entry expires at 1:24 and frees a place.
        assert_eq!(refused.retry_after(), 48 * S);
        assert!(l.allowed(85 * S));
        let Some(State::SlidingLog(log)) = &l.state else {
            panic!("no log stored")
        };
        assert_eq!(Vec::from(log.as_ref().clone()), [36 * S, 85 * S]);
    }

    #[test]
    fn without_counting_rejections_the_oldest_admission_sets_the_retry() {
        let q = Quota::sliding_log(2, Duration::from_secs(60))
            .build()
            .unwrap();
        let mut l = Sim::new(q);
        assert!(l.allowed(12 * S));
        assert!(l.allowed(24 * S));
        let refused = l.at(36 * S, 1);
        assert_eq!(refused.retry_after(), 36 * S);
        assert!(!l.allowed(72 * S - 1));
        assert!(l.allowed(72 * S));
    }

    #[test]
    fn the_log_never_holds_more_than_the_limit() {
        let q = Quota::sliding_log(3, Duration::from_secs(1))
            .count_rejected(true)
            .build()
            .unwrap();
        let mut l = Sim::new(q);
        for t in 0..1000 {
            l.at(t, 2);
        }
        let Some(State::SlidingLog(log)) = &l.state else {
            panic!("no log stored")
        };
        assert!(log.len() <= 3);
    }

    #[test]
    fn cost_takes_several_places() {
        let q = Quota::sliding_log(5, Duration::from_secs(10))
            .build()
            .unwrap();
        let mut l = Sim::new(q);
        assert_eq!(l.at(0, 3).admit.remaining, 2);
        assert!(l.at(S, 2).allowed);
        let refused = l.at(2 * S, 3);
        // Three places free when the entries at 0 expire.
        assert_eq!(refused.retry_after(), 8 * S);
        assert!(l.at(10 * S, 3).allowed);
    }

    #[test]
    fn replenish_is_the_oldest_live_entry_expiring() {
        let q = Quota::sliding_log(3, Duration::from_secs(60))
            .build()
            .unwrap();
        let mut l = Sim::new(q);
        assert_eq!(l.at(12 * S, 1).admit.replenish, 60 * S);
        assert_eq!(l.at(24 * S, 1).admit.replenish, 48 * S);
        // Once 0:12 expires, 0:24 is the oldest.
        assert_eq!(l.at(80 * S, 1).admit.replenish, 4 * S);
    }
}
