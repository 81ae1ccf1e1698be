//! What the benchmarks compare alike: quotas that admit every check, the
//! three-quota set, and tower_governor configured as
//! `benches/http_server.rs` serves it.
//!
//! Each target includes this file and uses part of it.
#![allow(dead_code)]

use std::num::NonZeroU32;
use std::time::Duration;

use tollgate::{Algorithm, Quota, QuotaBuilder, QuotaSet};
use tower_governor::GovernorLayer;
use tower_governor::governor::{GovernorConfig, GovernorConfigBuilder};
use tower_governor::key_extractor::PeerIpKeyExtractor;

/// Units no benchmark spends: at 25 million checks a second, 10^12 last
/// eleven hours. A million a second alone would not do: a hot key checked
/// in a loop spends a burst of a million in under 50 ms, and from then on
/// 19 checks in 20 are refused, by governor as by tollgate, so the time
/// measured would be the refusal's.
pub const NEVER_SPENT: u64 = 1_000_000_000_000;

/// A quota of `algorithm` that admits, and so writes, every check a
/// benchmark makes: a million a second with a burst of [`NEVER_SPENT`];
/// for the windows, just under [`NEVER_SPENT`] per 10^6 s (under one a
/// microsecond, as real windows are). The sliding log, whose cost grows
/// with its length, is 100 per millisecond: a full log, mostly refusing.
pub fn admitting(algorithm: Algorithm) -> QuotaSet {
    let quota = match algorithm {
        Algorithm::SlidingLog => Quota::sliding_log(100, Duration::from_millis(1)),
        a if a.has_burst() => {
            Quota::builder(a, 1_000_000, Duration::from_secs(1)).burst(NEVER_SPENT)
        }
        a => Quota::builder(a, NEVER_SPENT - 1, Duration::from_secs(1_000_000)),
    };
    QuotaSet::single(quota.build().expect("valid quota"))
}

/// governor at a million a second with the largest burst it takes (4.3
/// billion: over two minutes of checks in a loop), so every check is
/// admitted.
pub fn governor_admitting() -> governor::DefaultKeyedRateLimiter<String> {
    let quota = governor::Quota::per_second(NonZeroU32::new(1_000_000).expect("non-zero"))
        .allow_burst(NonZeroU32::MAX);
    governor::RateLimiter::keyed(quota)
}

/// 10 a minute, 2 per 3 s, a 1 s minimum interval (BENCHMARKS.md's
/// three-quota case).
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
        Quota::gcra(1_000_000, Duration::from_secs(1)).burst(NEVER_SPENT),
    )
}

/// The same three algorithms as a flood meets them: every check refused by
/// the minimum interval (an hour) while the two windows, whose limits it
/// never reaches, would admit it. With the three-quota limits, which quota
/// refuses changes as the clock runs, and so does the cost of a check.
pub fn three_quotas_flood() -> QuotaSet {
    three(
        "three-flood",
        [1_000_000_000, 1_000_000_000],
        Quota::min_interval(Duration::from_secs(3600)),
    )
}

/// The same three algorithms with every check refused by all three: one
/// unit an hour each, spent by the first check.
pub fn three_quotas_refused() -> QuotaSet {
    let quotas = [
        Quota::sliding_window(1, Duration::from_secs(3600)).name("sliding"),
        Quota::fixed_window(1, Duration::from_secs(3600)).name("fixed"),
        Quota::min_interval(Duration::from_secs(3600)).name("interval"),
    ]
    .map(|q| q.build().expect("valid"));
    QuotaSet::new("three-refused", quotas).expect("valid set")
}

/// A sliding window a minute long, a fixed window of 3 s (their limits)
/// and a GCRA quota, named by what they limit.
fn three(set: &str, [minute, burst]: [u64; 2], interval: QuotaBuilder) -> QuotaSet {
    let quotas = [
        Quota::sliding_window(minute, Duration::from_secs(60)).name("minute"),
        Quota::fixed_window(burst, Duration::from_secs(3)).name("burst"),
        interval.name("interval"),
    ]
    .map(|q| q.build().expect("valid"));
    QuotaSet::new(set, quotas).expect("valid set")
}

/// tower_governor at a million a second per peer IP, headers on, with the
/// largest burst it takes, so a benchmark's loop never spends it (a burst
/// of a million lasts under a second of `oneshot` requests).
pub fn governor_layer() -> GovernorLayer<
    PeerIpKeyExtractor,
    governor::middleware::StateInformationMiddleware,
    axum::body::Body,
> {
    let config: GovernorConfig<_, _> = GovernorConfigBuilder::default()
        .per_nanosecond(1_000)
        .burst_size(u32::MAX)
        .use_headers()
        .finish()
        .expect("governor config");
    GovernorLayer::new(config)
}
