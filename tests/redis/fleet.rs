//! A fleet sharing one Redis: several independent backends (each its own
//! pool and connection, as separate servers would have), many concurrent
//! tasks each, one key. Nothing refills during the test, so exactly the
//! quota is admitted, whatever the interleaving.

#![cfg(feature = "redis")]

use crate::support::redis as redis_support;

use std::time::Duration;

use redis_support::RedisServer;
use tollgate::{Algorithm, Limiter, ManualClock, Quota, QuotaSet, RedisBackend, Timestamp};

/// A set named "t": Redis refuses a set without a name, whose counters
/// could not be shared by a fleet.
fn set(quota: Quota) -> QuotaSet {
    QuotaSet::new("t", [quota]).unwrap()
}

/// Fixed windows are aligned to the epoch: ten-year windows (1970, 1980,
/// ... 2020, 2030) cannot roll over during the test.
const DECADE: Duration = Duration::from_secs(10 * 365 * 86_400);
const SERVERS: usize = 4;
const TASKS: usize = 16;
const ATTEMPTS: usize = 6;

/// Every server's tasks hammer `key`; returns how many were admitted.
async fn hammer(backends: &[RedisBackend], quotas: &QuotaSet, key: &str) -> u64 {
    let mut tasks = Vec::new();
    for backend in backends {
        let limiter = Limiter::new(backend.clone(), quotas.clone());
        for _ in 0..TASKS {
            let limiter = limiter.clone();
            let key = key.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..ATTEMPTS {
                    let d = limiter.check(&key, 1).await.expect("a decision");
                    admitted += u64::from(d.allowed());
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("a task panicked");
    }
    admitted
}

fn fleet(
    server: &RedisServer,
    prefix: &str,
    cache: bool,
    clocks: Option<&[ManualClock]>,
) -> Vec<RedisBackend> {
    (0..SERVERS)
        .map(|i| {
            // One of them built from a pool of the application's own.
            let b = if i == 0 {
                let pool = deadpool_redis::Config::from_url(server.url())
                    .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                    .unwrap();
                RedisBackend::from_pool(pool)
            } else {
                RedisBackend::from_url(server.url())
            };
            let b = b
                .prefix(prefix)
                .denial_cache(if cache { 10_000 } else { 0 })
                .timeout(Duration::from_secs(5));
            match clocks {
                Some(clocks) => b.clock(clocks[i].clone()),
                None => b,
            }
            .build()
            .unwrap()
        })
        .collect()
}

fn sets() -> Vec<(QuotaSet, u64)> {
    let mut sets: Vec<(QuotaSet, u64)> = Algorithm::ALL
        .into_iter()
        .map(|a| {
            let q = Quota::builder(a, 40, DECADE).build().unwrap();
            (QuotaSet::new(format!("fleet-{a}"), [q]).unwrap(), 40)
        })
        .collect();
    let counted = Quota::sliding_log(40, DECADE)
        .count_rejected(true)
        .build()
        .unwrap();
    sets.push((QuotaSet::new("fleet-counted", [counted]).unwrap(), 40));
    // Two quotas: the tighter one binds, and refusals spend nothing from
    // the other.
    let pair = [
        Quota::token_bucket(50, DECADE)
            .name("wide")
            .build()
            .unwrap(),
        Quota::sliding_window(30, DECADE)
            .name("tight")
            .build()
            .unwrap(),
    ];
    sets.push((QuotaSet::new("fleet-pair", pair).unwrap(), 30));
    sets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_admits_exactly_the_quota_for_every_algorithm() {
    let server = RedisServer::start();
    // Without the denial caches every attempt reaches Redis.
    let backends = fleet(&server, "uncached:", false, None);
    for (quotas, expected) in sets() {
        let admitted = hammer(&backends, &quotas, "shared").await;
        assert_eq!(admitted, expected, "{}", quotas.name());
    }
    let calls: u64 = backends.iter().map(|b| b.stats().calls).sum();
    assert_eq!(calls, (sets().len() * SERVERS * TASKS * ATTEMPTS) as u64);

    let backends = fleet(&server, "cached:", true, None);
    for (quotas, expected) in sets() {
        let admitted = hammer(&backends, &quotas, "shared").await;
        assert_eq!(admitted, expected, "{}", quotas.name());
    }
    // The refusals cost Redis little: most came from the denial caches
    // (never for the set that counts refusals).
    let hits: u64 = backends.iter().map(|b| b.stats().cache_hits).sum();
    assert!(hits > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_too_with_callers_clocks_seconds_apart() {
    // Test clocks stand for servers whose clocks disagree by up to 21 s;
    // with these periods that refills nothing, so the count stays exact.
    let server = RedisServer::start();
    let clocks: Vec<ManualClock> = (0..SERVERS as u64)
        .map(|i| ManualClock::new(Timestamp::from_secs(1_760_000_000 + 7 * i)))
        .collect();
    let backends = fleet(&server, "skewed:", false, Some(&clocks));
    for (quotas, expected) in sets() {
        let admitted = hammer(&backends, &quotas, "skewed").await;
        assert_eq!(admitted, expected, "{}", quotas.name());
    }
}

#[tokio::test]
async fn only_redis_time_keeps_a_fast_clock_from_minting_tokens() {
    // 10 per 10 s. With callers' clocks (test clocks here), a server whose
    // clock runs 10 s ahead finds the bucket refilled and admits 10 more:
    // the bug Spring Cloud Gateway fixed by moving to Redis TIME.
    let server = RedisServer::start();
    let quota = || {
        Quota::token_bucket(10, Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let behind = ManualClock::new(Timestamp::from_secs(1_760_000_000));
    let ahead = ManualClock::new(Timestamp::from_secs(1_760_000_010));
    let with_clock = |c: &ManualClock| {
        Limiter::new(
            RedisBackend::from_url(server.url())
                .prefix("skew:")
                .clock(c.clone())
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
            set(quota()),
        )
    };
    let (a, b) = (with_clock(&behind), with_clock(&ahead));
    assert!(a.check("k", 10).await.unwrap().allowed());
    assert!(
        b.check("k", 10).await.unwrap().allowed(),
        "the fast clock minted 10"
    );

    // The default backends take the time from Redis: no caller's clock is
    // read, so two servers cannot disagree about it.
    let redis_time = || {
        Limiter::new(
            RedisBackend::from_url(server.url())
                .prefix("redis-time:")
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
            set(quota()),
        )
    };
    let (a, b) = (redis_time(), redis_time());
    assert!(a.check("k", 10).await.unwrap().allowed());
    let refused = b.check("k", 10).await.unwrap();
    assert!(!refused.allowed());
    // Both see the same bucket: what `a` spent, `b` waits for.
    let wait = refused.retry_after().unwrap();
    assert!(wait > Duration::from_secs(9) && wait <= Duration::from_secs(10));
}
