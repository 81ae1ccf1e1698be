use super::*;
use crate::Quota;
use crate::backend::redis::lease::Lease;
use std::time::Duration;

fn gcra() -> QuotaSet {
    QuotaSet::single(Quota::gcra(5, Duration::from_secs(5)).build().unwrap())
}

/// A quota whose capacity does not bound the leases of these tests.
fn roomy() -> QuotaSet {
    QuotaSet::single(Quota::gcra(800, Duration::from_secs(5)).build().unwrap())
}

fn verdict(allowed: bool, remaining: u64, retry: u64) -> RawQuotaDecision {
    RawQuotaDecision {
        allowed,
        remaining,
        reset: retry * 2,
        retry_after: if allowed { 0 } else { retry },
        delay: 0,
        replenish: retry,
    }
}

/// Redis's answer: one quota's verdict, units spent, what frees next.
fn reply(v: RawQuotaDecision, spent: u64, next_free: u64) -> Reply {
    Reply {
        verdicts: smallvec::smallvec![v],
        next_free: smallvec::smallvec![next_free],
        spent,
        now: 0,
        lease_ends: 0,
    }
}

fn denied(hit: Option<Hit>) -> Decision {
    match hit {
        Some(Hit::Denial(d)) => d,
        _ => panic!("expected a cached denial"),
    }
}

#[test]
fn a_denial_holds_until_its_wait_is_over_for_costs_as_high() {
    let (cache, set) = (DenialCache::new(100, true), gcra());
    cache.settle(
        1,
        "k",
        &set,
        2,
        1_000,
        1_000,
        &reply(verdict(false, 1, 500), 0, 0),
        None,
    );
    let hit = denied(cache.get(1, "k", &set, 2, true, 1_200));
    assert!(!hit.allowed());
    assert_eq!(hit.retry_after(), Some(Duration::from_micros(300)));
    assert_eq!(hit.quotas()[0].reset(), Duration::from_micros(800));
    assert!(cache.get(1, "k", &set, 3, true, 1_200).is_some());
    assert!(
        cache.get(1, "k", &set, 1, true, 1_200).is_none(),
        "a cheaper request may pass"
    );
    assert!(
        cache.get(2, "k", &set, 2, true, 1_200).is_none(),
        "another set"
    );
    assert!(
        cache.get(1, "j", &set, 2, true, 1_200).is_none(),
        "another key"
    );
    assert!(cache.get(1, "k", &set, 2, true, 1_500).is_none());
    assert_eq!(cache.len(), 1, "kept a moment, for the key's call");
    assert!(
        cache
            .get(1, "k", &set, 2, true, 1_500 + AFTER_DENIAL)
            .is_none()
    );
    assert_eq!(cache.len(), 0, "expired entries are dropped when met");
}

#[test]
fn an_admission_that_empties_a_quota_refuses_until_its_next_unit() {
    let (cache, set) = (DenialCache::new(100, true), gcra());
    let d = cache.settle(
        1,
        "k",
        &set,
        1,
        0,
        0,
        &reply(verdict(true, 0, 0), 1, 700),
        None,
    );
    assert!(d.allowed(), "the admission itself passes");
    let hit = denied(cache.get(1, "k", &set, 1, true, 200));
    assert_eq!(hit.retry_after(), Some(Duration::from_micros(500)));
    assert_eq!(hit.remaining(), 0);
    assert!(cache.get(1, "k", &set, 1, true, 700).is_none());
    // Off, nothing is remembered.
    let off = DenialCache::new(100, false);
    off.settle(
        1,
        "k",
        &set,
        1,
        0,
        0,
        &reply(verdict(true, 0, 0), 1, 700),
        None,
    );
    assert!(off.get(1, "k", &set, 1, true, 200).is_none());
}

#[test]
fn a_lease_admits_here_until_spent_or_expired_then_a_denial_applies() {
    let (cache, set) = (DenialCache::new(100, true), roomy());
    let policy = super::super::lease::Policy::new(
        Lease::Max(10),
        Duration::from_micros(100),
        Duration::from_micros(1_000),
    )
    .unwrap();
    let (ask, turn) = cache.claim(1, "k", &set, 1, 0, Some(&policy), 50);
    assert_eq!(turn, Turn::Lead);
    assert_eq!((ask.want, ask.give_back), (1, None), "no history: the cost");
    let (second, turn) = cache.claim(1, "k", &set, 1, 10, Some(&policy), 50);
    assert_eq!(turn, Turn::Wait, "one lease call at a time");
    assert_eq!(second.want, 1);
    // Redis granted 4 units (1 for the request) and is now empty.
    let d = cache.settle(
        1,
        "k",
        &set,
        1,
        0,
        20,
        &reply(verdict(true, 0, 0), 4, 900),
        Some(&policy),
    );
    assert!(d.allowed());
    assert_eq!(d.remaining(), 3, "Redis's 0 plus the lease's 3");
    for left in [2, 1, 0] {
        match cache.get(1, "k", &set, 1, true, 30) {
            Some(Hit::Lease(d, _)) => assert_eq!(d.remaining(), left),
            _ => panic!("expected a lease hit"),
        }
    }
    assert!(
        cache
            .get(1, "k", &set, 1, false, 30)
            .map(|h| matches!(h, Hit::Denial(_)))
            .unwrap_or(false),
        "peeks never spend a lease"
    );
    denied(cache.get(1, "k", &set, 1, true, 40));
    // Once Redis has a unit again, the next lease is sized by the pace
    // of the last: 4 units in 920 us is less than one a slice.
    let (ask, turn) = cache.claim(1, "k", &set, 1, 920, Some(&policy), 50);
    assert_eq!(turn, Turn::Lead);
    assert_eq!(ask.want, 1);
    // A lease spent at 4 units in 40 us asks for 10 (100 us of it).
    cache.settle(
        1,
        "j",
        &set,
        1,
        0,
        0,
        &reply(verdict(true, 6, 0), 4, 0),
        Some(&policy),
    );
    for _ in 0..3 {
        assert!(matches!(
            cache.get(1, "j", &set, 1, true, 30),
            Some(Hit::Lease(..))
        ));
    }
    let (ask, _) = cache.claim(1, "j", &set, 1, 40, Some(&policy), 50);
    assert_eq!((ask.want, ask.give_back), (10, None));
}

#[test]
fn unspent_units_go_back_with_the_next_lease_call() {
    let (cache, set) = (DenialCache::new(100, true), roomy());
    let policy = super::super::lease::Policy::new(
        Lease::Max(10),
        Duration::from_micros(100),
        Duration::from_micros(1_000),
    )
    .unwrap();
    let mut granted = reply(verdict(true, 6, 0), 4, 0);
    granted.now = 77;
    cache.settle(1, "k", &set, 1, 0, 0, &granted, Some(&policy));
    // A request costing more than the 3 units held.
    assert!(cache.get(1, "k", &set, 5, true, 10).is_none());
    let (ask, _) = cache.claim(1, "k", &set, 5, 10, Some(&policy), 50);
    assert_eq!(ask.give_back, Some((3, 77)));
    assert!(ask.want >= 5);
}

#[test]
fn a_run_out_denial_gives_its_key_one_call_and_the_others_wait_for_it() {
    let (cache, set) = (DenialCache::new(100, true), gcra());
    let claim = |cost, now| cache.claim(1, "k", &set, cost, now, None, 50).1;
    assert_eq!(claim(1, 0), Turn::Alone, "a key with nothing cached");
    cache.settle(
        1,
        "k",
        &set,
        1,
        0,
        0,
        &reply(verdict(true, 0, 0), 1, 100),
        None,
    );
    assert_eq!(claim(0, 50), Turn::Alone, "a cheaper request, denial live");
    // Run out: the first request to find it makes the key's call.
    assert!(cache.get(1, "k", &set, 1, true, 120).is_none());
    assert_eq!(claim(1, 120), Turn::Lead);
    assert_eq!(claim(1, 121), Turn::Wait);
    assert_eq!(claim(1, 169), Turn::Wait);
    assert_eq!(claim(1, 170), Turn::Lead, "a call out too long is given up");
    // Its admission empties the quota again: the waiters are refused here.
    cache.settle(
        1,
        "k",
        &set,
        1,
        120,
        130,
        &reply(verdict(true, 0, 0), 1, 100),
        None,
    );
    cache.end_call(1, "k");
    denied(cache.get(1, "k", &set, 1, true, 131));
    // An admission that leaves units: the run-out denial is dropped, and
    // the key's requests go to Redis each on their own again.
    assert_eq!(claim(1, 240), Turn::Lead);
    cache.settle(
        1,
        "k",
        &set,
        1,
        240,
        250,
        &reply(verdict(true, 3, 0), 1, 0),
        None,
    );
    cache.end_call(1, "k");
    assert!(cache.get(1, "k", &set, 1, true, 251).is_none());
    assert_eq!(claim(1, 251), Turn::Alone);
    assert_eq!(cache.len(), 0);
}
