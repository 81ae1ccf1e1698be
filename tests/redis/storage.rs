//! What the Redis backend leaves in Redis: keys that expire once their state
//! stops mattering, sliding logs of at most `limit` unique entries, nothing
//! written for refused requests, and few calls under a one-key flood thanks
//! to the denial cache (about one per retry-after interval).

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

const YEAR: Duration = Duration::from_secs(365 * 86_400);

fn backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::from_url(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Everything Redis holds under `key`, as text.
fn dump(server: &RedisServer, key: &str) -> String {
    match server.cli(&["TYPE", key]).as_str() {
        "string" => server.cli(&["GET", key]),
        "hash" => server.cli(&["HGETALL", key]),
        "zset" => server.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"]),
        "none" => String::new(),
        other => panic!("unexpected type {other}"),
    }
}

#[tokio::test]
async fn keys_expire_once_their_state_stops_mattering() {
    let server = RedisServer::start();
    let backend = backend(&server);
    let period = Duration::from_secs(1);
    let quotas = QuotaSet::new(
        "ttl",
        Algorithm::ALL.map(|a| Quota::builder(a, 4, period).name(a.name()).build().unwrap()),
    )
    .unwrap();
    let limiter = Limiter::new(backend.clone(), quotas);
    // The fixed window ends on a whole second of Redis's clock: checked in
    // its last milliseconds, its key could expire before its TTL is read.
    // Start in the first half of a second.
    let micros_into_second = || {
        let time = server.cli(&["TIME"]);
        time.lines().nth(1).unwrap().trim().parse::<u64>().unwrap()
    };
    while micros_into_second() > 500_000 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(limiter.check("k", 2).await.unwrap().allowed());
    let keys = backend.redis_keys("k", limiter.quotas());
    // All TTLs in one redis-cli run, so a busy machine cannot let the
    // shortest expire before it is read.
    let script: String = keys.iter().map(|k| format!("PTTL {k}\n")).collect();
    let ttls = server.cli_stdin(&script);
    let ttls: Vec<i64> = ttls.lines().map(|l| l.parse().unwrap()).collect();
    for ((pttl, key), a) in ttls.iter().zip(&keys).zip(Algorithm::ALL) {
        // A window keeps its state for its period (the sliding window for
        // two); the buckets until refilled: two of four units, half a period.
        let at_most = match a {
            Algorithm::SlidingWindow => 2000,
            Algorithm::FixedWindow | Algorithm::SlidingLog => 1000,
            _ => 500,
        };
        assert!(
            *pttl > 0 && *pttl <= at_most + 2,
            "{a}: PTTL {pttl} ms of {key}, expected at most {at_most} + 2"
        );
    }
    // Two periods later (the sliding window's horizon), nothing is left.
    tokio::time::sleep(2 * period + Duration::from_millis(100)).await;
    for (key, a) in keys.iter().zip(Algorithm::ALL) {
        assert_eq!(server.cli(&["EXISTS", key]), "0", "{a}: {key}");
    }
    assert_eq!(server.cli(&["DBSIZE"]), "0");
}

#[tokio::test]
async fn refused_requests_write_nothing_unless_counted() {
    let server = RedisServer::start();
    let backend = backend(&server);
    for a in Algorithm::ALL {
        let limiter = Limiter::new(
            backend.clone(),
            QuotaSet::new(
                format!("refused-{a}"),
                [Quota::builder(a, 3, YEAR).build().unwrap()],
            )
            .unwrap(),
        );
        assert!(limiter.check("k", 3).await.unwrap().allowed());
        let key = &backend.redis_keys("k", limiter.quotas())[0];
        let before = dump(&server, key);
        let ttl_before: i64 = server.cli(&["PTTL", key]).parse().unwrap();
        for _ in 0..5 {
            assert!(!limiter.check("k", 1).await.unwrap().allowed());
        }
        assert_eq!(dump(&server, key), before, "{a}");
        let ttl_after: i64 = server.cli(&["PTTL", key]).parse().unwrap();
        assert!(ttl_after <= ttl_before, "{a}: the expiry was pushed back");
    }
    // Counting refused attempts logs them, still at most `limit` entries.
    let limiter = Limiter::new(
        backend.clone(),
        QuotaSet::new(
            "counted",
            [Quota::sliding_log(3, YEAR)
                .count_rejected(true)
                .build()
                .unwrap()],
        )
        .unwrap(),
    );
    assert!(limiter.check("k", 3).await.unwrap().allowed());
    let key = &backend.redis_keys("k", limiter.quotas())[0];
    let before = dump(&server, key);
    assert!(!limiter.check("k", 1).await.unwrap().allowed());
    assert_ne!(dump(&server, key), before);
    assert_eq!(server.cli(&["ZCARD", key]), "3");
}

#[tokio::test]
async fn a_sliding_log_keeps_at_most_limit_unique_entries() {
    let server = RedisServer::start();
    // A clock that never moves: every request lands in the same microsecond.
    let clock = ManualClock::new(Timestamp::from_secs(1_760_000_000));
    let backend = RedisBackend::from_url(server.url())
        .clock(clock)
        .denial_cache(0)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let limiter = Limiter::new(
        backend.clone(),
        set(Quota::sliding_log(25, Duration::from_secs(60))
            .count_rejected(true)
            .build()
            .unwrap()),
    );
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += u32::from(limiter.check("k", 1).await.unwrap().allowed());
    }
    assert_eq!(admitted, 25);
    let key = &backend.redis_keys("k", limiter.quotas())[0];
    assert_eq!(server.cli(&["ZCARD", key]), "25");
    let scores = server.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"]);
    let lines: Vec<&str> = scores.lines().collect();
    let members: std::collections::HashSet<&str> = lines.iter().step_by(2).copied().collect();
    assert_eq!(members.len(), 25);
    assert!(
        lines
            .iter()
            .skip(1)
            .step_by(2)
            .all(|s| *s == "1760000000000000")
    );
}

/// One key flooded by 8 tasks; returns (admitted, EVALSHA + EVAL calls).
async fn flood(server: &RedisServer, backend: RedisBackend) -> (u64, u64) {
    let limiter = Limiter::new(backend, set(Quota::fixed_window(10, YEAR).build().unwrap()));
    // Load the script first, so the count below has no NOSCRIPT round trips.
    limiter.check("warm-up", 1).await.unwrap();
    server.cli(&["CONFIG", "RESETSTAT"]);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..250 {
                let d = limiter.check("flooder", 1).await.expect("a decision");
                if d.allowed() {
                    admitted += 1;
                } else {
                    assert_eq!(d.remaining(), 0);
                    assert!(d.retry_after().is_some_and(|r| r > Duration::ZERO));
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    let calls = server.command_calls("evalsha") + server.command_calls("eval");
    (admitted, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_denial_cache_spares_redis_a_flood() {
    let server = RedisServer::start();
    let cached = RedisBackend::from_url(server.url())
        .prefix("cached:")
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let (admitted, calls) = flood(&server, cached.clone()).await;
    eprintln!("with the cache: {calls} Redis calls, {:?}", cached.stats());
    assert_eq!(admitted, 10);
    // The 10 admissions, and the refusals already in flight (one per task at
    // most) when the first was cached.
    assert!(calls <= 10 + 8, "{calls} calls");
    assert!(cached.stats().cache_hits >= 2000 - calls);

    let uncached = RedisBackend::from_url(server.url())
        .prefix("uncached:")
        .denial_cache(0)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let (admitted, calls) = flood(&server, uncached.clone()).await;
    eprintln!("without: {calls} Redis calls, {:?}", uncached.stats());
    assert_eq!(admitted, 10);
    assert!(calls >= 2000, "{calls} calls");
    assert_eq!(uncached.stats().cache_hits, 0);
}

/// A flood that outlasts its denials: 16 tasks on one key of GCRA 20 a
/// second (one unit at a time, so a 50 ms retry-after), with leases off.
/// When a cached denial runs out, the tasks it held back share one call
/// (the key's call), so after the first moment Redis sees about one call
/// per interval: the admission, whose emptiness is cached in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_costs_one_call_per_retry_after_interval() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    const INTERVAL: Duration = Duration::from_millis(50);
    let server = RedisServer::start();
    let backend = backend(&server);
    let quota = Quota::gcra(20, Duration::from_secs(1)).burst(1);
    let limiter = Limiter::new(backend.clone(), set(quota.build().unwrap()));
    limiter.check("warm-up", 1).await.unwrap();
    let admitted = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_millis(100) + 10 * INTERVAL;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (limiter, admitted) = (limiter.clone(), Arc::clone(&admitted));
            tokio::spawn(async move {
                for _ in 0..10_000_000 {
                    if Instant::now() >= end {
                        break;
                    }
                    let d = limiter.check("flooder", 1).await.expect("a decision");
                    admitted.fetch_add(u64::from(d.allowed()), Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    // The first moment, when nothing is cached yet and every task asks
    // Redis at once, is left out of the count.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (calls, ok, from) = (
        backend.stats().calls,
        admitted.load(Ordering::Relaxed),
        Instant::now(),
    );
    for t in tasks {
        t.await.expect("a flooding task panicked");
    }
    let elapsed = from.elapsed();
    let calls = backend.stats().calls - calls;
    let ok = admitted.load(Ordering::Relaxed) - ok;
    let intervals = elapsed.as_secs_f64() / INTERVAL.as_secs_f64();
    eprintln!(
        "{calls} calls, {ok} admitted in {elapsed:?} ({intervals:.1} intervals): {:?}",
        backend.stats()
    );
    assert!(ok >= 5, "the flood is admitted once per interval: {ok}");
    assert!(
        calls as f64 <= intervals.ceil() + 2.0,
        "{calls} calls in {intervals:.1} intervals"
    );
    // A call out when the count starts may be admitted after it: the
    // difference can be -1.
    let refusals = calls.saturating_sub(ok);
    assert!(refusals <= 2, "{refusals} calls for refusals");
    assert_eq!(backend.stats().failures, 0);
}

#[tokio::test]
async fn a_cached_denial_reads_like_the_one_redis_gave() {
    let server = RedisServer::start();
    let backend = backend(&server);
    let quota = Quota::gcra(2, Duration::from_secs(10)).build().unwrap();
    let limiter = Limiter::new(backend.clone(), set(quota.clone()));
    // Redis's own answer, through a backend that caches nothing.
    let uncached = RedisBackend::from_url(server.url())
        .denial_cache(0)
        .build()
        .unwrap();
    let redis = Limiter::new(uncached, set(quota));
    // The admission that empties the quota is remembered as a denial.
    assert!(limiter.check("k", 2).await.unwrap().allowed());
    let from_redis = redis.check("k", 1).await.unwrap();
    assert!(!from_redis.allowed());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cached = limiter.check("k", 1).await.unwrap();
    assert_eq!(backend.stats().cache_hits, 1);
    assert_eq!(backend.stats().calls, 1, "refused without asking Redis");
    assert!(!cached.allowed());
    assert_eq!(cached.remaining(), from_redis.remaining());
    let (before, after) = (
        from_redis.retry_after().unwrap(),
        cached.retry_after().unwrap(),
    );
    assert!(after < before && after >= before - Duration::from_millis(500));
    // A cheaper request is not answered from the cache: a cost of 0 passes.
    assert!(limiter.check("k", 0).await.unwrap().allowed());
}

#[tokio::test]
async fn an_enforced_quotas_denial_is_not_served_to_its_shadow_twin() {
    let server = RedisServer::start();
    let backend = backend(&server);
    let quota = Quota::gcra(1, YEAR);
    // Same name and numbers, so the same state: only the mode differs.
    let enforced = Limiter::new(backend.clone(), set(quota.clone().build().unwrap()));
    let shadow = Limiter::new(
        backend.clone(),
        set(quota.mode(tollgate::Mode::Shadow).build().unwrap()),
    );
    // The admission empties the quota: both refusals come from the cache.
    assert!(enforced.check("k", 1).await.unwrap().allowed());
    assert!(!enforced.check("k", 1).await.unwrap().allowed());
    assert!(!enforced.check("k", 1).await.unwrap().allowed());
    assert_eq!(backend.stats().cache_hits, 2);
    let d = shadow.check("k", 1).await.unwrap();
    assert!(d.allowed() && d.exceeded());
}

/// What one client key costs in Redis, for the README: `MEMORY USAGE` of
/// each quota's key after an admission, with a 252-byte client key (the
/// size an API key header may reach), one quota of each algorithm; and a
/// sliding log's cost per entry once full. The bounds hold the README's
/// figures with room for allocator rounding.
#[tokio::test]
async fn a_keys_memory_per_quota_stays_within_the_documented_bounds() {
    let server = RedisServer::start();
    let backend = backend(&server);
    let client = format!("key:{}", "k".repeat(248));
    assert_eq!(client.len(), 252);
    let hour = Duration::from_secs(3600);
    let usage = |key: &str| -> u64 {
        let bytes = server.cli(&["MEMORY", "USAGE", key, "SAMPLES", "0"]);
        bytes.parse().expect("MEMORY USAGE's answer")
    };
    for algorithm in Algorithm::ALL {
        let quota = Quota::builder(algorithm, 100, hour).build().unwrap();
        let quotas = QuotaSet::new("m", [quota]).unwrap();
        let limiter = Limiter::new(backend.clone(), quotas.clone());
        assert!(limiter.check(&client, 1).await.unwrap().allowed());
        let key = &backend.redis_keys(&client, &quotas)[0];
        let bytes = usage(key);
        println!("{algorithm}: {bytes} bytes");
        assert!(bytes <= 450, "{algorithm}: {bytes} bytes");
        if algorithm == Algorithm::SlidingLog {
            for _ in 1..100 {
                assert!(limiter.check(&client, 1).await.unwrap().allowed());
            }
            let full = usage(key);
            let each = (full - bytes) / 99;
            println!("{algorithm} of 100 entries: {full} bytes, {each} a entry");
            assert!(each <= 80, "{each} bytes a log entry");
        }
    }
}
