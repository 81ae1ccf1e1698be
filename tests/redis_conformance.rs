//! One behaviour, two backends: the same requests on the same timeline give
//! the same decisions (allowed, remaining, reset, retry-after, delay, per
//! quota) from `MemoryBackend` on a `ManualClock` and from `RedisBackend` on
//! a real Redis with the same clock as its test clock. The traces are in
//! `support/conformance.rs`, and each runs on every server of the matrix:
//! Redis 7.0, Redis 8.2 and Valkey 9.1 (see `support/redis.rs`).

#![cfg(feature = "redis")]

#[path = "support/conformance.rs"]
mod conformance;
#[path = "support/redis.rs"]
mod redis_support;

use std::time::Duration;

use conformance::T0;
use redis_support::{RedisServer, Server};
use tollgate::{Lease, ManualClock, RedisBackend, Timestamp};

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
