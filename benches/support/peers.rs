//! What the benchmarks compare alike: the three-quota set, and
//! tower_governor configured as `examples/bench_server.rs` serves it.
//!
//! Each target includes this file and uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use tollgate::{Quota, QuotaBuilder, QuotaSet};
use tower_governor::GovernorLayer;
use tower_governor::governor::{GovernorConfig, GovernorConfigBuilder};
use tower_governor::key_extractor::PeerIpKeyExtractor;

/// 10 a minute, 2 per 3 s, a 1 s minimum interval (issue 11's case).
pub fn three_quotas() -> QuotaSet {
    three(
        "three",
        [10, 2],
        Quota::min_interval(Duration::from_secs(1)),
    )
}

/// The same three algorithms with limits a hot key never reaches: every
/// check admitted, as most are in service.
pub fn three_quotas_admitted() -> QuotaSet {
    three(
        "three-admitted",
        [1_000_000_000, 1_000_000_000],
        Quota::gcra(1_000_000, Duration::from_secs(1)),
    )
}

/// A sliding window a minute long, a fixed window of 3 s (their limits)
/// and a GCRA quota, named as the issue names them.
fn three(set: &str, [minute, burst]: [u64; 2], interval: QuotaBuilder) -> QuotaSet {
    let quotas = [
        Quota::sliding_window(minute, Duration::from_secs(60)).name("minute"),
        Quota::fixed_window(burst, Duration::from_secs(3)).name("burst"),
        interval.name("interval"),
    ]
    .map(|q| q.build().expect("valid"));
    QuotaSet::new(set, quotas).expect("valid set")
}

/// tower_governor at a million a second per peer IP, headers on: a limit
/// the benchmarks never reach.
pub fn governor_layer() -> GovernorLayer<
    PeerIpKeyExtractor,
    governor::middleware::StateInformationMiddleware,
    axum::body::Body,
> {
    let config: GovernorConfig<_, _> = GovernorConfigBuilder::default()
        .per_nanosecond(1_000)
        .burst_size(1_000_000)
        .use_headers()
        .finish()
        .expect("governor config");
    GovernorLayer::new(config)
}
