//! What the benchmarks compare alike: the three-quota set, and
//! tower_governor configured as `examples/bench_server.rs` serves it.
//!
//! Each target includes this file and uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use tollgate::{Quota, QuotaSet};
use tower_governor::GovernorLayer;
use tower_governor::governor::{GovernorConfig, GovernorConfigBuilder};
use tower_governor::key_extractor::PeerIpKeyExtractor;

/// 10 a minute, 2 per 3 s, a 1 s minimum interval (issue 11's case).
pub fn three_quotas() -> QuotaSet {
    QuotaSet::new(
        "three",
        [
            Quota::sliding_window(10, Duration::from_secs(60))
                .name("minute")
                .build()
                .expect("valid"),
            Quota::fixed_window(2, Duration::from_secs(3))
                .name("burst")
                .build()
                .expect("valid"),
            Quota::min_interval(Duration::from_secs(1))
                .name("interval")
                .build()
                .expect("valid"),
        ],
    )
    .expect("valid set")
}

/// The same three algorithms with limits a hot key never reaches: every
/// check admitted, as most are in service.
pub fn three_quotas_admitted() -> QuotaSet {
    QuotaSet::new(
        "three-admitted",
        [
            Quota::sliding_window(1_000_000_000, Duration::from_secs(60))
                .name("minute")
                .build()
                .expect("valid"),
            Quota::fixed_window(1_000_000_000, Duration::from_secs(3))
                .name("burst")
                .build()
                .expect("valid"),
            Quota::gcra(1_000_000, Duration::from_secs(1))
                .name("interval")
                .build()
                .expect("valid"),
        ],
    )
    .expect("valid set")
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
