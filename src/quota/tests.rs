use super::*;

use std::time::Duration;

const MIN: Duration = Duration::from_secs(60);

#[test]
fn names_clients_could_not_be_sent_are_refused() {
    let named = |n: &str| Quota::gcra(10, MIN).name(n.to_owned()).build();
    for bad in [
        "",
        "tab\there",
        "new\nline",
        "caf\u{e9}",
        "nul\0",
        &"x".repeat(65),
    ] {
        assert_eq!(
            named(bad),
            Err(QuotaError::InvalidName(bad.to_owned())),
            "{bad:?}"
        );
    }
    for good in ["per-minute", "a b \"c\" \\d ~", &"x".repeat(64)] {
        assert_eq!(
            named(good).map(|q| q.name().to_owned()),
            Ok(good.to_owned())
        );
    }
}

#[test]
fn invalid_quotas_are_refused_when_built() {
    assert_eq!(
        Quota::gcra(10, Duration::ZERO).build(),
        Err(QuotaError::ZeroPeriod)
    );
    assert_eq!(Quota::gcra(0, MIN).build(), Err(QuotaError::ZeroLimit));
    assert_eq!(
        Quota::token_bucket(5, MIN).burst(0).build(),
        Err(QuotaError::BurstBelowOne)
    );
    assert_eq!(
        Quota::fixed_window(5, MIN).burst(3).build(),
        Err(QuotaError::BurstNotApplicable(Algorithm::FixedWindow))
    );
    assert_eq!(
        Quota::gcra(5, MIN).count_rejected(true).build(),
        Err(QuotaError::CountRejectedNotApplicable(Algorithm::Gcra))
    );
    assert!(matches!(
        Quota::gcra(2_000_000, Duration::from_secs(1)).build(),
        Err(QuotaError::RateTooHigh { .. })
    ));
}

#[test]
fn unknown_algorithm_names_the_valid_ones() {
    let err = "token-bucket".parse::<Algorithm>().unwrap_err();
    let text = err.to_string();
    for a in Algorithm::ALL {
        assert!(text.contains(a.name()), "{text}");
    }
    assert_eq!("gcra".parse::<Algorithm>(), Ok(Algorithm::Gcra));
}

#[test]
fn soft_mode_raises_the_effective_capacity_only() {
    let q = Quota::fixed_window(10, MIN)
        .mode(Mode::Soft { percent: 20 })
        .build()
        .unwrap();
    assert_eq!(q.limit(), 10);
    assert_eq!(q.params.capacity, 12);
    assert_eq!(q.params.reported_capacity, 10);
}

#[test]
fn default_names_are_readable() {
    let q = Quota::gcra(5, Duration::from_millis(1500)).build().unwrap();
    assert_eq!(q.name(), "5-per-1500ms");
    let q = Quota::min_interval(Duration::from_secs(3)).build().unwrap();
    assert_eq!(q.name(), "min-interval-3s");
}

#[test]
fn large_daily_quotas_are_exact() {
    // A million a day reduces to 86 400 units per token, refilled one per µs.
    let q = Quota::token_bucket(1_000_000, Duration::from_secs(86_400))
        .build()
        .unwrap();
    assert_eq!((q.params.unit, q.params.refill), (86_400, 1));
}
