//! Calendar quotas: periods of a local day, week, month or year, across
//! DST changes, the same in memory and on Redis, and their window in the
//! rate-limit fields through the layer.

#![cfg(feature = "gateway")]

use super::usage::{memory, redis_on, seen};
use crate::support;
use crate::support::redis as redis_support;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::HeaderName;
use tollgate::calendar::{Calendar, CalendarPeriod, Weekday};
use tollgate::key::HeaderKey;
use tollgate::layer::RateLimitLayer;
use tollgate::{Limiter, ManualClock, MemoryBackend, Quota, QuotaSet, Settle, Timestamp};

/// An instant written as RFC 3339 with its offset, in microseconds.
fn at(rfc3339: &str) -> Timestamp {
    let (date, time) = rfc3339.split_once('T').unwrap();
    let d: Vec<i64> = date.split('-').map(|n| n.parse().unwrap()).collect();
    let (clock, offset) = time.split_at(8);
    let c: Vec<i64> = clock.split(':').map(|n| n.parse().unwrap()).collect();
    let sign = if offset.starts_with('-') { -1 } else { 1 };
    let o: Vec<i64> = offset[1..].split(':').map(|n| n.parse().unwrap()).collect();
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + c[0] * 3_600 + c[1] * 60 + c[2] - sign * (o[0] * 3_600 + o[1] * 60);
    Timestamp::from_secs(secs as u64)
}

fn calendar_quota(limit: u64, period: CalendarPeriod, zone: &str) -> Quota {
    Quota::per_calendar(limit, Calendar::new(period, zone).unwrap())
        .build()
        .unwrap()
}

/// A month from the 15th in Seoul resets at 2026-12-15T00:00+09:00, and
/// the refusal before it says so.
#[tokio::test]
async fn a_seoul_month_from_the_15th_resets_on_december_15_at_midnight() {
    let quota = calendar_quota(3, CalendarPeriod::Month { starts_on: 15 }, "Asia/Seoul");
    let (limiter, clock) = memory(quota);
    clock.set(at("2026-12-14T23:59:00+09:00"));
    for _ in 0..3 {
        assert!(limiter.check("customer", 1).await.unwrap().allowed());
    }
    let refused = limiter.check("customer", 1).await.unwrap();
    assert!(!refused.allowed());
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(60)));
    clock.set(at("2026-12-14T23:59:59+09:00"));
    assert!(!limiter.check("customer", 1).await.unwrap().allowed());
    clock.set(at("2026-12-15T00:00:00+09:00"));
    let fresh = limiter.check("customer", 1).await.unwrap();
    assert!(fresh.allowed());
    assert_eq!(fresh.remaining(), 2);
    // The next reset: 15 January, 31 days on.
    assert_eq!(fresh.quotas()[0].reset(), Duration::from_secs(31 * 86_400));
}

/// A New York day lasts 23 hours on 8 March 2026 and 25 on 1 November.
#[tokio::test]
async fn new_york_days_last_23_and_25_hours_across_the_2026_changes() {
    let quota = calendar_quota(1, CalendarPeriod::Day, "America/New_York");
    let (limiter, clock) = memory(quota);
    clock.set(at("2026-03-08T00:00:00-05:00"));
    let first = limiter.check("k", 1).await.unwrap();
    assert_eq!(first.quotas()[0].reset(), Duration::from_secs(23 * 3_600));
    clock.set(at("2026-11-01T00:00:00-04:00"));
    let first = limiter.check("k", 1).await.unwrap();
    assert!(first.allowed());
    assert_eq!(first.quotas()[0].reset(), Duration::from_secs(25 * 3_600));
    let refused = limiter.check("k", 1).await.unwrap();
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(25 * 3_600)));
}

/// The same calendar traces (checks, reservations given back and settled,
/// across period boundaries and summer time) give the same decisions in
/// memory and on Redis, which gets the bounds from Rust.
#[tokio::test]
async fn calendar_traces_match_in_memory_and_on_redis() {
    let server = redis_support::RedisServer::start();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let cases = [
        (
            CalendarPeriod::Day,
            "America/New_York",
            "2026-03-07T20:00:00-05:00",
            3_600,
        ),
        (
            CalendarPeriod::Day,
            "America/New_York",
            "2026-10-31T20:00:00-04:00",
            3_600,
        ),
        (
            CalendarPeriod::Week {
                starts_on: Weekday::Sunday,
            },
            "Europe/Paris",
            "2026-10-20T00:00:00+02:00",
            6 * 3_600,
        ),
        (
            CalendarPeriod::Month { starts_on: 15 },
            "Asia/Seoul",
            "2026-12-10T00:00:00+09:00",
            7 * 3_600,
        ),
        (
            CalendarPeriod::Month { starts_on: 31 },
            "UTC",
            "2026-02-20T00:00:00+00:00",
            8 * 3_600,
        ),
        (
            CalendarPeriod::Year,
            "Pacific/Auckland",
            "2026-12-25T00:00:00+13:00",
            12 * 3_600,
        ),
    ];
    for (n, (period, zone, from, step_secs)) in cases.into_iter().enumerate() {
        let set = tollgate::QuotaSet::new(format!("cal-{n}"), [calendar_quota(20, period, zone)])
            .unwrap();
        let clock = ManualClock::new(at(from));
        let memory = Limiter::new(
            MemoryBackend::builder().clock(clock.clone()).build(),
            set.clone(),
        );
        let redis = Limiter::new(redis_on(&server, &clock), set);
        for step in 0..80 {
            let cost = 1 + next(4);
            let what = next(3);
            let (m, r) = (
                memory.reserve("k", cost).await.unwrap(),
                redis.reserve("k", cost).await.unwrap(),
            );
            assert_eq!(
                seen(m.decision()),
                seen(r.decision()),
                "{zone} {period:?} step {step}"
            );
            let how = match what {
                0 => Settle::Keep,
                1 => Settle::GiveBack,
                _ => Settle::Actual(next(8)),
            };
            let (m, r) = (m.settle(how).await.unwrap(), r.settle(how).await.unwrap());
            assert_eq!(
                m.as_ref().map(seen),
                r.as_ref().map(seen),
                "{zone} {period:?} step {step} {how:?}"
            );
            clock.advance(Duration::from_secs(next(step_secs)));
        }
    }
}

/// Through the layer, a calendar quota's `w` in `RateLimit-Policy` is the
/// length of the period now (this month's days, not the longest month's),
/// as the layer's system clock finds it; a plain quota's is its period.
#[tokio::test]
async fn the_layer_sends_a_calendar_quota_s_current_period_as_its_window() {
    let month = Calendar::new(CalendarPeriod::Month { starts_on: 1 }, "UTC").unwrap();
    let set = QuotaSet::new(
        "billing",
        [
            Quota::per_calendar(10_000, month.clone())
                .name("month")
                .build()
                .unwrap(),
            Quota::gcra(10, Duration::from_secs(60))
                .name("minute")
                .build()
                .unwrap(),
        ],
    )
    .unwrap();
    let limiter = Limiter::new(MemoryBackend::new(), set);
    let layer = RateLimitLayer::builder(
        limiter,
        HeaderKey::new(HeaderName::from_static("x-api-key")),
    )
    .build();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let addr = support::serve(app).await;
    let client = support::client();
    let window = || {
        let (start, end) = month
            .bounds(tollgate::Clock::now(&tollgate::SystemClock))
            .unwrap();
        (end.as_micros() - start.as_micros()) / 1_000_000
    };
    let before = window();
    let r = support::get(&client, addr, "/", &[("x-api-key", b"a")]).await;
    let after = window();
    assert_eq!(r.status, 200);
    let policy = r.headers["ratelimit-policy"].to_str().unwrap().to_owned();
    // At a month's turn, the request may have seen either month.
    let expected = |w: u64| format!("\"month\";q=10000;w={w}, \"minute\";q=10;w=60");
    assert!(
        policy == expected(before) || policy == expected(after),
        "{policy}: this month has {before} s"
    );
}
