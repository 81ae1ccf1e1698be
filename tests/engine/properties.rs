//! Properties that must hold for any request sequence.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Algorithm, Clock, Limiter, ManualClock, MemoryBackend, Quota, Timestamp};

const START: u64 = 1_700_000_000_000_000;

/// A request: how long after the previous one it comes (µs), and its cost.
fn requests() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec((0u64..400_000, 1u64..=3), 1..120)
}

fn algorithms() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

fn limiter(quota: Quota) -> (Limiter<MemoryBackend<ManualClock>>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_micros(START));
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    (Limiter::new(backend, quota), clock)
}

/// Runs the sequence, returning (time, cost) of each admitted request. For
/// the leaky bucket the time is when the request's turn comes.
fn admitted(quota: Quota, seq: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let (l, clock) = limiter(quota);
        let mut out = Vec::new();
        for &(gap, cost) in seq {
            clock.advance(Duration::from_micros(gap));
            let d = l.check("k", cost).await.unwrap();
            if d.allowed() {
                let served = clock.now().as_micros() + d.delay().as_micros() as u64;
                out.push((served, cost));
            }
        }
        out
    })
}

/// The most cost admitted in any interval `[t, t + len)`.
fn busiest(admitted: &[(u64, u64)], len: u64) -> u64 {
    let mut best = 0;
    for (i, &(t, _)) in admitted.iter().enumerate() {
        let sum: u64 = admitted[i..]
            .iter()
            .take_while(|&&(u, _)| u < t + len)
            .map(|&(_, c)| c)
            .sum();
        best = best.max(sum);
    }
    best
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The sliding log is exact: no rolling period admits more than the limit.
    #[test]
    fn sliding_log_never_exceeds_the_limit_in_any_rolling_period(
        limit in 1u64..8, period_ms in 100u64..2_000, seq in requests()
    ) {
        let period = period_ms * 1000;
        let q = Quota::sliding_log(limit, Duration::from_micros(period)).build().unwrap();
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(limit))).collect();
        prop_assert!(busiest(&admitted(q, &seq), period) <= limit);
    }

    /// Fixed and sliding windows never admit more than the limit within one
    /// aligned window.
    #[test]
    fn windows_never_exceed_the_limit_within_a_window(
        window in prop::sample::select(vec![Algorithm::FixedWindow, Algorithm::SlidingWindow]),
        limit in 1u64..8, period_ms in 100u64..2_000, seq in requests()
    ) {
        let period = period_ms * 1000;
        let q = Quota::builder(window, limit, Duration::from_micros(period)).build().unwrap();
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(limit))).collect();
        let got = admitted(q, &seq);
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        for (t, c) in got {
            *per_window.entry(t / period).or_default() += c;
        }
        prop_assert!(per_window.values().all(|&n| n <= limit), "{per_window:?}");
    }

    /// The rate algorithms admit at most the burst plus what the rate adds
    /// over the interval, whatever the interval.
    #[test]
    fn buckets_never_exceed_burst_plus_rate(
        algorithm in prop::sample::select(vec![Algorithm::TokenBucket, Algorithm::Gcra, Algorithm::LeakyBucket]),
        limit in 1u64..8, burst in 1u64..8, period_ms in 100u64..2_000, seq in requests()
    ) {
        let period = period_ms * 1000;
        let q = Quota::builder(algorithm, limit, Duration::from_micros(period)).burst(burst).build().unwrap();
        let seq: Vec<_> = seq.into_iter().map(|(g, c)| (g, c.min(burst))).collect();
        let got = admitted(q, &seq);
        for len in [1, period / 3, period, 3 * period] {
            let allowance = burst + (len * limit).div_ceil(period);
            prop_assert!(busiest(&got, len) <= allowance, "{len}: {got:?}");
        }
    }

    /// A leaky bucket serves requests one interval apart.
    #[test]
    fn leaky_bucket_output_is_evenly_spaced(
        limit in 1u64..8, burst in 1u64..8, period_ms in 100u64..2_000, seq in requests()
    ) {
        let period = period_ms * 1000;
        let q = Quota::leaky_bucket(limit, Duration::from_micros(period)).burst(burst).build().unwrap();
        let interval = period.div_ceil(limit);
        let seq: Vec<_> = seq.into_iter().map(|(g, _)| (g, 1)).collect();
        let got = admitted(q, &seq);
        for pair in got.windows(2) {
            prop_assert!(pair[1].0 >= pair[0].0 + interval, "{pair:?}");
        }
    }

    /// A refused request leaves the state as it was: a limiter that also
    /// received every refused request decides everything else exactly as one
    /// that never saw them.
    #[test]
    fn a_refused_request_changes_nothing(
        algorithm in algorithms(), limit in 1u64..6, period_ms in 100u64..2_000, seq in requests()
    ) {
        let period = Duration::from_millis(period_ms);
        let q = Quota::builder(algorithm, limit, period).build().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (with, clock_a) = limiter(q.clone());
            let (without, clock_b) = limiter(q);
            for &(gap, cost) in &seq {
                let cost = cost.min(limit);
                clock_a.advance(Duration::from_micros(gap));
                clock_b.advance(Duration::from_micros(gap));
                let a = with.check("k", cost).await.unwrap();
                if !a.allowed() {
                    // The twin peeks: it must agree, and still change nothing.
                    let b = without.peek("k", cost).await.unwrap();
                    prop_assert_eq!(a, b);
                    continue;
                }
                let b = without.check("k", cost).await.unwrap();
                prop_assert_eq!(a, b);
            }
            Ok(())
        })?;
    }

    /// Retry-after is exact for any history: one microsecond earlier is
    /// refused, at retry-after the request passes.
    #[test]
    fn retry_after_is_exact_after_any_history(
        algorithm in algorithms(), limit in 1u64..6, period_ms in 100u64..2_000, seq in requests()
    ) {
        let q = Quota::builder(algorithm, limit, Duration::from_millis(period_ms)).build().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (l, clock) = limiter(q);
            for &(gap, cost) in &seq {
                let cost = cost.min(limit);
                clock.advance(Duration::from_micros(gap));
                let d = l.check("k", cost).await.unwrap();
                if let Some(wait) = d.retry_after() {
                    let now = clock.now();
                    clock.advance(wait - Duration::from_micros(1));
                    prop_assert!(!l.peek("k", cost).await.unwrap().allowed(), "{algorithm} early");
                    clock.advance(Duration::from_micros(1));
                    prop_assert!(l.peek("k", cost).await.unwrap().allowed(), "{algorithm} at retry");
                    clock.set(now);
                }
            }
            Ok(())
        })?;
    }

    /// Reserving and then giving back leaves the quota as if the
    /// reservation had not happened, when nothing else came between them:
    /// a limiter that reserved and gave back decides the next request
    /// exactly as its twin that never reserved. So nothing is ever given
    /// back beyond what a fresh key has either.
    #[test]
    fn a_reservation_given_back_leaves_the_quota_as_if_never_made(
        algorithm in algorithms(), limit in 1u64..6, burst in 1u64..6,
        period_ms in 100u64..2_000, seq in requests(),
        cost in 1u64..=5, held_for in 0u64..4_000_000, next in 1u64..=5,
    ) {
        let period = Duration::from_millis(period_ms);
        let mut b = Quota::builder(algorithm, limit, period);
        if algorithm.has_burst() {
            b = b.burst(burst);
        }
        let q = b.build().unwrap();
        let q_fresh = q.clone();
        let most = q.max_cost();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let (with, clock_a) = limiter(q.clone());
            let (without, clock_b) = limiter(q);
            for &(gap, c) in &seq {
                let c = c.min(most);
                clock_a.advance(Duration::from_micros(gap));
                clock_b.advance(Duration::from_micros(gap));
                with.check("k", c).await.unwrap();
                without.check("k", c).await.unwrap();
            }
            let reservation = with.reserve("k", cost.min(most)).await.unwrap();
            let held_for = Duration::from_micros(held_for % (3 * period.as_micros() as u64));
            clock_a.advance(held_for);
            clock_b.advance(held_for);
            reservation.give_back().await.unwrap();
            let next = next.min(most);
            let a = with.peek("k", next).await.unwrap();
            let b = without.peek("k", next).await.unwrap();
            prop_assert_eq!(&a, &b);
            let left = with.peek("k", 0).await.unwrap().remaining();
            let fresh = limiter(q_fresh).0.peek("k", 0).await.unwrap().remaining();
            prop_assert!(left <= fresh, "{left} left, a fresh key {fresh}");
            Ok(())
        })?;
    }
}

/// Races `threads` threads of `per_thread` checks of `cost` on one key of
/// one limiter, the clock standing still, and returns how many were
/// admitted and what a peek at cost 0 says is left after.
fn raced(quota: Quota, threads: usize, per_thread: usize, cost: u64) -> (u64, u64) {
    let (l, _clock) = limiter(quota);
    let start = std::sync::Barrier::new(threads);
    let admitted: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let (l, start) = (&l, &start);
                s.spawn(move || {
                    start.wait();
                    (0..per_thread)
                        .map(|_| u64::from(l.check_now("k", cost).unwrap().unwrap().allowed()))
                        .sum::<u64>()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let left = l.check_now("k", 0).unwrap().unwrap().remaining();
    (admitted, left)
}

/// The quotas whose one-key state is updated without the shard's write
/// lock, or will be: each storage shape of each such algorithm.
fn lock_free_quotas() -> impl Strategy<Value = (Quota, u64)> {
    let second = Duration::from_secs(1);
    prop_oneof![
        (1u64..40).prop_map(move |n| (Quota::gcra(n, second).build().unwrap(), 1)),
        (1u64..40).prop_map(move |n| (Quota::leaky_bucket(n, second).build().unwrap(), 1)),
        // A token a whole number of microseconds: one number.
        (1u64..40).prop_map(move |n| (Quota::token_bucket(n, second).build().unwrap(), 1)),
        // Fractional refills: 3 per 10 s (3 units a microsecond, a token
        // 10^7), one number; 33 per 10 s, two.
        (1u64..40).prop_map(|n| {
            let q = Quota::token_bucket(3, Duration::from_secs(10)).burst(n);
            (q.build().unwrap(), 1)
        }),
        (1u64..40).prop_map(|n| {
            let q = Quota::token_bucket(33, Duration::from_secs(10)).burst(n);
            (q.build().unwrap(), 1)
        }),
        (1u64..40).prop_map(move |n| (Quota::fixed_window(n, second).build().unwrap(), 1)),
        // More than one unit a microsecond: a window's start and count.
        (1u64..40).prop_map(move |n| {
            (
                Quota::fixed_window(n * 1_000_000, second).build().unwrap(),
                1_000_000,
            )
        }),
        (1u64..40).prop_map(move |n| (Quota::sliding_window(n, second).build().unwrap(), 1)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Threads racing on one key lose no update: with the clock standing
    /// still they admit exactly what one thread alone admits, and the state
    /// after counts every admitted unit.
    #[test]
    fn racing_threads_on_one_key_lose_no_update(
        (quota, cost) in lock_free_quotas(), threads in 2usize..=4
    ) {
        let per_thread = 60;
        let alone = raced(quota.clone(), 1, threads * per_thread, cost);
        let together = raced(quota.clone(), threads, per_thread, cost);
        prop_assert_eq!(together, alone, "{:?}", quota);
        // Every unit of the burst is either admitted or left: none lost.
        prop_assert_eq!(alone.0 * cost + alone.1, quota.burst(), "{:?}", quota);
    }
}
