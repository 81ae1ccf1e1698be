//! One behaviour, two backends: the same requests on the same timeline give
//! the same decisions (allowed, remaining, reset, retry-after, delay, per
//! quota) from `MemoryBackend` on a `ManualClock` and from `RedisBackend` on
//! a real Redis with the same clock as its test clock. The traces are in
//! `support/conformance.rs`, and each runs on every server of the matrix:
//! Redis 7.0, Redis 8.2 and Valkey 9.1 (see `support/redis.rs`).

#![cfg(feature = "redis")]

use crate::support::conformance;
use crate::support::redis as redis_support;

use std::time::Duration;

use conformance::T0;
use redis_support::{RedisServer, Server};
use tollgate::{Lease, Limiter, ManualClock, Quota, QuotaSet, RedisBackend, Timestamp};

/// A Redis backend on `clock`, with nothing that could make it differ from
/// the memory backend: no denial cache, a timeout no loaded test machine
/// reaches.
fn redis_backend(server: &RedisServer, clock: &ManualClock, lease: Lease) -> RedisBackend {
    RedisBackend::from_url(server.url())
        .prefix("conformance:")
        .clock(clock.clone())
        .denial_cache(0)
        .lease(lease)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("build the Redis backend")
}

struct Fixture {
    _server: RedisServer,
    clock: ManualClock,
    redis: RedisBackend,
}

fn fixture(server: Server) -> Fixture {
    fixture_with(server, Lease::Off)
}

fn fixture_with(server: Server, lease: Lease) -> Fixture {
    server.check_version();
    let server = RedisServer::of(server);
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    let redis = redis_backend(&server, &clock, lease);
    Fixture {
        _server: server,
        clock,
        redis,
    }
}

/// One test per trace and server: `redis_7_0::random_traces_match`, ...
macro_rules! traces_on {
    ($server:expr; $($trace:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $trace() {
                let f = super::fixture($server);
                super::conformance::$trace(&f.redis, &f.clock).await;
            }
        )*

        /// Leases of at most one unit lease nothing beyond the request:
        /// the same decisions as without leases, on the same traces
        /// (sliding logs and leaky buckets included, which are then
        /// decided one request at a time anyway).
        #[tokio::test]
        async fn random_traces_match_with_leases_of_one_unit() {
            let f = super::fixture_with($server, super::Lease::Max(1));
            for seed in 0..200 {
                super::conformance::random_trace(&f.redis, &f.clock, seed).await;
            }
            assert_eq!(f.redis.stats().leases, 0);
            assert_eq!(f.redis.stats().lease_hits, 0);
        }
    };
}

macro_rules! every_trace {
    ($server:expr) => {
        traces_on!(
            $server;
            a_clock_behind_the_state_is_decided_alike,
            a_billion_a_second_is_counted_exactly,
            seeds_fixed_window_boundary_burst,
            seeds_sliding_log_with_rejected_attempts_logged,
            seeds_sliding_window_counter_examples,
            classdojo_push_notifications_and_the_peers_examples,
            leaky_bucket_delays_and_refusals_match,
            many_requests_in_one_microsecond_are_all_logged,
            costs_peeks_and_too_costly_requests_match,
            elastic_quotas_match_with_room_and_without,
            random_traces_match,
            reservations_given_back_kept_and_dropped_match,
            random_give_back_traces_match,
            per_quota_costs_match,
            random_per_quota_cost_traces_match,
            a_charge_far_past_the_limit_is_a_long_debt_alike,
        );
    };
}

mod redis_7_0 {
    every_trace!(super::Server::Redis7);
}

mod redis_8_2 {
    every_trace!(super::Server::Redis8);
}

mod valkey_9_1 {
    every_trace!(super::Server::Valkey9);
}

/// With leases, a unit reserved from the lease this process holds goes
/// back to that lease: a key whose reservations all go back never runs
/// out, Redis sees at most one lease's units spent, and the units given
/// back are spent from the lease again. Kept, the same reservations stop
/// at the limit.
#[tokio::test]
async fn reservations_from_a_lease_go_back_to_it() {
    let server = RedisServer::start();
    let leasing = RedisBackend::from_url(server.url())
        .prefix("lease-back:")
        .lease(Lease::Max(10))
        .lease_slice(Duration::from_secs(1))
        .lease_lifetime(Duration::from_secs(60))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let plain = RedisBackend::from_url(server.url())
        .prefix("lease-back:")
        .denial_cache(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    // One set name: both limiters count under it.
    let quota = || {
        let gcra = Quota::gcra(80, Duration::from_secs(3600)).build().unwrap();
        QuotaSet::new("lease-back", [gcra]).unwrap()
    };
    let limiter = Limiter::new(leasing.clone(), quota());
    let redis_view = Limiter::new(plain, quota());
    for i in 0..300 {
        let r = limiter.reserve("k", 1).await.unwrap();
        assert!(r.decision().allowed(), "reservation {i}");
        r.give_back().await.unwrap();
    }
    let stats = leasing.stats();
    assert!(stats.lease_hits > 200, "{stats:?}");
    assert!(stats.calls < 100, "{stats:?}");
    let left = redis_view.peek("k", 0).await.unwrap().remaining();
    assert!(
        left >= 70,
        "Redis sees {left} left: more than one lease spent"
    );
    let mut kept = 0;
    for _ in 0..200 {
        let r = limiter.reserve("k", 1).await.unwrap();
        if !r.decision().allowed() {
            break;
        }
        kept += 1;
        r.keep();
    }
    assert!((70..=80).contains(&kept), "{kept} kept");
}

/// While Redis cannot be reached, the fallback store reserves; what it
/// reserved goes back to it, not to Redis.
#[tokio::test]
async fn a_reservation_made_by_the_fallback_goes_back_to_it() {
    use tollgate::{MemoryBackend, OnFailure};
    let local = MemoryBackend::new();
    let unreachable = RedisBackend::from_url("redis://127.0.0.1:1")
        .on_failure(OnFailure::Fallback(local.clone()))
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    // One set name: the fallback's view and the limiter count under it.
    let quota = || {
        let window = Quota::fixed_window(3, Duration::from_secs(3600))
            .build()
            .unwrap();
        QuotaSet::new("fallback", [window]).unwrap()
    };
    let limiter = Limiter::new(unreachable, quota());
    let local_view = Limiter::new(local, quota());
    let first = limiter.reserve("k", 1).await.unwrap();
    let second = limiter.reserve("k", 1).await.unwrap();
    assert!(first.decision().allowed() && second.decision().allowed());
    assert_eq!(local_view.peek("k", 0).await.unwrap().remaining(), 1);
    let left = first.give_back().await.unwrap();
    assert_eq!(left.remaining(), 2);
    second.keep();
    assert_eq!(local_view.peek("k", 0).await.unwrap().remaining(), 2);
}
