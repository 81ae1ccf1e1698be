//! Random traces, seeded so that a failing one is replayed from its seed:
//! single checks, reservations settled later, and sets whose quotas count
//! requests or the cost.

#![allow(dead_code)]

use std::time::Duration;

use tollgate::{Algorithm, Backend, Counts, ManualClock, Mode, Quota, QuotaBuilder, QuotaSet};

use super::{S, T0, Twin, set};

/// A small deterministic generator (xorshift64*), so a failing trace is
/// reproduced from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

const PERIODS: [u64; 8] = [1_000, 7_777, 100_000, 999_999, S, 3_333_333, 10 * S, 60 * S];

fn random_quota(rng: &mut Rng, index: usize) -> Option<Quota> {
    random_builder(rng, index).build().ok()
}

fn random_builder(rng: &mut Rng, index: usize) -> QuotaBuilder {
    let algorithm = rng.pick(&Algorithm::ALL);
    let limit = if rng.chance(10) {
        1 + rng.below(500)
    } else {
        1 + rng.below(12)
    };
    let period = Duration::from_micros(rng.pick(&PERIODS));
    let mut b = Quota::builder(algorithm, limit, period).name(format!("q{index}"));
    if algorithm.has_burst() && rng.chance(50) {
        b = b.burst(1 + rng.below(2 * limit));
    }
    if algorithm == Algorithm::SlidingLog && rng.chance(50) {
        b = b.count_rejected(true);
    }
    match rng.below(10) {
        0 | 1 => b.mode(Mode::Shadow),
        2 | 3 => b.mode(Mode::Soft {
            percent: rng.below(60) as u16,
        }),
        4 | 5 => b.mode(Mode::Elastic {
            percent: rng.below(250) as u16,
        }),
        _ => b,
    }
}

fn random_set(rng: &mut Rng) -> QuotaSet {
    loop {
        let n = 1 + rng.below(3) as usize;
        let quotas: Vec<Quota> = (0..n).filter_map(|i| random_quota(rng, i)).collect();
        if let Ok(set) = QuotaSet::new("random", quotas) {
            return set;
        }
    }
}

pub async fn random_trace<B: Backend + Clone>(other: &B, clock: &ManualClock, seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let quotas = random_set(&mut rng);
    let shortest = quotas
        .quotas()
        .iter()
        .map(|q| q.period().as_micros() as u64)
        .min()
        .unwrap_or(S);
    let periods: Vec<u64> = quotas
        .quotas()
        .iter()
        .map(|q| q.period().as_micros() as u64)
        .collect();
    let max_cost = quotas
        .quotas()
        .iter()
        .map(Quota::max_cost)
        .min()
        .unwrap_or(1);
    let t = Twin::new(other, clock, quotas, &format!("r{seed}:"));
    let mut now = T0 + rng.below(1_000 * S);
    for _ in 0..60 {
        now = match rng.below(12) {
            0..=2 => now,
            3..=5 => now + rng.below(shortest / 4 + 1),
            6..=8 => now + rng.below(2 * shortest + 1),
            9 => now + rng.below(10 * shortest + 1),
            // On a window boundary of one of the quotas, or a microsecond
            // either side of it.
            _ => {
                let period = rng.pick(&periods);
                let boundary = (now / period + 1) * period;
                boundary + rng.below(3) - 1
            }
        };
        t.at(now);
        let key = rng.pick(&["a", "b", "{c}"]);
        let cost = match rng.below(20) {
            0 => 0,
            1..=13 => 1,
            _ => rng.below(max_cost + 2),
        };
        let commit = !rng.chance(10);
        let room = rng.chance(50);
        let _ = t.room(room).ask(key, cost, commit).await;
    }
}

/// 400 traces of 60 requests; `TOLLGATE_CONFORMANCE_TRACES=20000` for a
/// deeper run.
pub async fn random_traces_match<B: Backend + Clone>(other: &B, clock: &ManualClock) {
    let traces = std::env::var("TOLLGATE_CONFORMANCE_TRACES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    for seed in 0..traces {
        random_trace(other, clock, seed).await;
    }
}

/// Reservations of every algorithm, on one key: given back (what is left
/// is as before them), kept, dropped unsettled (kept), given back after the
/// window rolled over, and refused (nothing to give back); the same
/// decisions from both backends at every step.
pub async fn reservations_given_back_kept_and_dropped_match<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    for a in Algorithm::ALL {
        let quota = Quota::builder(a, 4, Duration::from_secs(10))
            .build()
            .unwrap();
        let t = Twin::new(other, clock, set([quota]), &format!("reserve-{a}:"));
        let base = T0 - T0 % (10 * S);
        t.at(base + 3 * S);
        let before = t.ask("k", 0, false).await.unwrap();
        let first = t.reserve("k", 1).await.unwrap();
        let kept = t.reserve("k", 2).await.unwrap();
        assert!(first.memory.decision().allowed(), "{a}");
        let left = t.give_back(first).await;
        assert_eq!(
            left.remaining(),
            before.remaining() - 2,
            "{a}: only the kept 2 spent"
        );
        kept.memory.keep();
        kept.other.keep();
        // Dropped unsettled: kept.
        drop(t.reserve("k", 1).await.unwrap());
        let after = t.ask("k", 0, false).await.unwrap();
        assert_eq!(
            after.remaining(),
            before.remaining() - 3,
            "{a}: a dropped one is kept"
        );
        // Refused: spent nothing, gives nothing back.
        let refused = t.reserve("k", 4).await.unwrap();
        assert!(!refused.memory.decision().allowed(), "{a}");
        t.give_back(refused).await;
        // Given back later, in the same window, then after it rolled over.
        t.at(base + 5 * S);
        let later = t.reserve("k", 1).await;
        t.at(base + 8 * S);
        if let Some(later) = later {
            t.give_back(later).await;
        }
        let late = t.reserve("k", 1).await;
        t.at(base + 12 * S);
        if let Some(late) = late {
            t.give_back(late).await;
        }
        t.check("k", 1).await;
        t.at(base + 40 * S);
        let stale = t.reserve("k", 3).await.unwrap();
        t.at(base + 95 * S);
        t.give_back(stale).await;
        t.ask("k", 4, false).await.unwrap();
    }
}

/// [`random_trace`]'s requests with reservations among them, settled later
/// (given back, kept, or dropped) with time passing between: 200 traces.
pub async fn random_give_back_traces_match<B: Backend + Clone>(other: &B, clock: &ManualClock) {
    for seed in 0..200 {
        random_give_back_trace(other, clock, seed).await;
    }
}

async fn random_give_back_trace<B: Backend + Clone>(other: &B, clock: &ManualClock, seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let quotas = random_set(&mut rng);
    let shortest = quotas
        .quotas()
        .iter()
        .map(|q| q.period().as_micros() as u64)
        .min()
        .unwrap_or(S);
    let max_cost = quotas
        .quotas()
        .iter()
        .map(Quota::max_cost)
        .min()
        .unwrap_or(1);
    let t = Twin::new(other, clock, quotas, &format!("g{seed}:"));
    let mut now = T0 + rng.below(1_000 * S);
    let mut held = Vec::new();
    for _ in 0..60 {
        now += match rng.below(4) {
            0 => 0,
            1 => rng.below(shortest / 4 + 1),
            2 => rng.below(2 * shortest + 1),
            _ => rng.below(5 * shortest + 1),
        };
        t.at(now);
        let key = rng.pick(&["a", "b"]);
        let cost = match rng.below(10) {
            0..=6 => 1,
            _ => rng.below(max_cost + 1),
        };
        match rng.below(10) {
            0..=3 => {
                if let Some(r) = t.reserve(key, cost).await {
                    held.push(r);
                }
            }
            4..=6 if !held.is_empty() => {
                let r = held.swap_remove(rng.below(held.len() as u64) as usize);
                if rng.chance(80) {
                    t.give_back(r).await;
                } else {
                    drop(r);
                }
            }
            _ => {
                let _ = t.room(false).ask(key, cost, !rng.chance(10)).await;
            }
        }
    }
    for r in held {
        t.give_back(r).await;
    }
}

/// "5 requests and 1 000 tokens a minute" in one set, for every pair of
/// algorithms: cheap requests run into the request quota, a big one into
/// the token quota; a request of cost 0 still counts; a settle gives back
/// or charges tokens only, and a reservation given back whole returns its
/// request too. The same decisions from both backends at every step.
pub async fn per_quota_costs_match<B: Backend + Clone>(other: &B, clock: &ManualClock) {
    for a in Algorithm::ALL {
        let requests = Quota::builder(a, 5, Duration::from_secs(60))
            .name("requests")
            .counts(Counts::Requests)
            .build()
            .unwrap();
        let tokens = Quota::builder(Algorithm::FixedWindow, 1_000, Duration::from_secs(60))
            .name("tokens")
            .build()
            .unwrap();
        let t = Twin::new(
            other,
            clock,
            set([requests, tokens]),
            &format!("units-{a}:"),
        );
        let base = T0 - T0 % (60 * S);
        t.at(base + S);
        for _ in 0..4 {
            assert!(t.check("cheap", 10).await.allowed(), "{a}");
        }
        // Free, yet a request.
        let free = t.check("cheap", 0).await;
        assert!(free.allowed(), "{a}");
        assert_eq!(free.quotas()[0].remaining(), 0, "{a}: five requests");
        assert_eq!(free.quotas()[1].remaining(), 960, "{a}: 40 tokens");
        let sixth = t.check("cheap", 10).await;
        assert!(!sixth.allowed(), "{a}");
        assert!(
            !sixth.quotas()[0].allowed(),
            "{a}: refused by the request quota"
        );
        assert!(sixth.quotas()[1].allowed(), "{a}");
        // Peeks: what is left, and whether a request would pass.
        assert!(t.ask("cheap", 0, false).await.unwrap().allowed(), "{a}");
        assert!(!t.ask("cheap", 1, false).await.unwrap().allowed(), "{a}");
        // A big one: refused by the token quota, no request spent.
        assert!(t.check("big", 900).await.allowed(), "{a}");
        let big = t.check("big", 200).await;
        assert!(!big.allowed(), "{a}");
        assert!(big.quotas()[0].allowed(), "{a}");
        assert!(
            !big.quotas()[1].allowed(),
            "{a}: refused by the token quota"
        );
        // More than the token quota ever holds: too costly, whatever the
        // request quota's limit.
        assert!(t.reserve("big", 1_001).await.is_none(), "{a}");
        // Settled below: tokens back, the request stays counted.
        let r = t.reserve("settle", 500).await.unwrap();
        let left = t.settle(r, 100).await.unwrap();
        assert_eq!(left.quotas()[0].remaining(), 4, "{a}");
        assert_eq!(left.quotas()[1].remaining(), 900, "{a}");
        // Settled above: tokens charged, no request.
        let r = t.reserve("settle", 100).await.unwrap();
        let left = t.settle(r, 400).await.unwrap();
        assert_eq!(left.quotas()[0].remaining(), 3, "{a}");
        assert_eq!(left.quotas()[1].remaining(), 500, "{a}");
        // Given back whole: the request and its tokens.
        let r = t.reserve("settle", 300).await.unwrap();
        t.give_back(r).await;
        let left = t.ask("settle", 0, false).await.unwrap();
        assert_eq!(left.quotas()[0].remaining(), 3, "{a}");
        assert_eq!(left.quotas()[1].remaining(), 500, "{a}");
        // A window later, all is back.
        t.at(base + 61 * S);
        t.check("cheap", 10).await;
        t.check("big", 10).await;
    }
}

/// Random sets of quotas counting requests or the cost, with checks,
/// peeks and reservations settled above, at or below their estimate,
/// given back or dropped: 200 traces.
pub async fn random_per_quota_cost_traces_match<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    for seed in 0..200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let quotas = loop {
            let n = 1 + rng.below(3) as usize;
            let quotas: Vec<Quota> = (0..n)
                .filter_map(|i| {
                    let counts = if rng.chance(50) {
                        Counts::Requests
                    } else {
                        Counts::Cost
                    };
                    random_builder(&mut rng, i).counts(counts).build().ok()
                })
                .collect();
            if let Ok(set) = QuotaSet::new("units", quotas) {
                break set;
            }
        };
        let shortest = quotas
            .quotas()
            .iter()
            .map(|q| q.period().as_micros() as u64)
            .min()
            .unwrap_or(S);
        let max_cost = quotas
            .quotas()
            .iter()
            .filter(|q| q.counts() == Counts::Cost)
            .map(Quota::max_cost)
            .min()
            .unwrap_or(20);
        let t = Twin::new(other, clock, quotas, &format!("u{seed}:"));
        let mut now = T0 + rng.below(1_000 * S);
        let mut held = Vec::new();
        for _ in 0..60 {
            now += match rng.below(4) {
                0 => 0,
                1 => rng.below(shortest / 4 + 1),
                2 => rng.below(2 * shortest + 1),
                _ => rng.below(5 * shortest + 1),
            };
            t.at(now);
            let key = rng.pick(&["a", "b"]);
            let cost = rng.below(max_cost.min(1 << 20) + 1);
            match rng.below(10) {
                0..=3 => {
                    if let Some(r) = t.reserve(key, cost).await {
                        held.push((r, cost));
                    }
                }
                4..=6 if !held.is_empty() => {
                    let (r, cost) = held.swap_remove(rng.below(held.len() as u64) as usize);
                    match rng.below(4) {
                        0 => {
                            t.give_back(r).await;
                        }
                        1 => drop(r),
                        // Below the estimate mostly; above it by a little:
                        // a debt of more than a few periods is refused by
                        // the Redis backend's check of the script's reply.
                        _ => {
                            let actual = if rng.chance(70) {
                                rng.below(cost + 1)
                            } else {
                                cost + rng.below(max_cost.min(1 << 20) / 4 + 1)
                            };
                            t.settle(r, actual).await;
                        }
                    }
                }
                _ => {
                    let _ = t.room(false).ask(key, cost, !rng.chance(10)).await;
                }
            }
        }
        for (r, _) in held {
            t.give_back(r).await;
        }
    }
}

/// An answer that took a hundred times its reservation leaves a debt far
/// longer than any wait the quota alone can report: the bucket algorithms
/// carry it (a window forgets it when it ends), in memory and in Redis
/// alike, and the next request's retry-after says how long it is.
pub async fn a_charge_far_past_the_limit_is_a_long_debt_alike<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    for a in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ] {
        let tokens = Quota::builder(a, 10, Duration::from_secs(1))
            .name("tokens")
            .build()
            .unwrap();
        let t = Twin::new(other, clock, set([tokens]), &format!("debt-{a}:"));
        t.at(T0);
        let r = t.reserve("llm", 10).await.unwrap();
        // A thousand units on a quota of ten a second: some 99 s of debt,
        // thirty times the three seconds the quota's own waits reach.
        let left = t.settle(r, 1_000).await.unwrap();
        assert!(!left.allowed(), "{a}: in debt");
        t.at(T0 + 2 * S);
        let next = t.check("llm", 1).await;
        assert!(!next.allowed(), "{a}: still in debt");
        let wait = next.retry_after().unwrap_or_default();
        assert!(wait > Duration::from_secs(60), "{a}: {wait:?}");
    }
}
