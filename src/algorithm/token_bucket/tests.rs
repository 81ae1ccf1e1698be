use super::{Bucket, check};
use crate::Quota;
use crate::algorithm::testing::{S, Sim};
use crate::algorithm::{Outcome, State, Update};
use std::time::Duration;

/// The bucket as the level and the moment it was measured, decided on
/// a clock that never steps back: the reference both forms must match.
/// Also the bucket after the request.
fn by_level(b: Option<Bucket>, q: &Quota, cost: u64, now: u64) -> ((bool, u64, [u64; 3]), Bucket) {
    let p = &q.params;
    let full = p.capacity * p.unit;
    let level = b.map_or(full, |b| full.min(b.level + (now - b.at) * p.refill));
    let need = cost * p.unit;
    let left = if level >= need { level - need } else { level };
    let report = [
        left / p.unit,
        (full - left).div_ceil(p.refill),
        ((left / p.unit + 1) * p.unit - left).div_ceil(p.refill),
    ];
    let retry = if level >= need {
        0
    } else {
        (need - level).div_ceil(p.refill).max(1)
    };
    let after = Bucket {
        level: left,
        at: now,
    };
    ((level >= need, retry, report), after)
}

/// What a caller reads of an outcome.
fn seen(o: &Outcome) -> (bool, u64, [u64; 3]) {
    let b = if o.allowed { &o.admit } else { &o.refuse };
    (
        o.allowed,
        o.retry_after(),
        [b.remaining, b.reset, b.replenish],
    )
}

#[test]
fn both_forms_decide_as_the_level_does_on_a_clock_that_never_steps_back() {
    // 100 a second is one unit a microsecond, kept as the moment the
    // bucket is full; 3 per 10 s and 7 a minute are not.
    let quotas = [
        Quota::token_bucket(100, Duration::from_secs(1)).burst(5),
        Quota::token_bucket(3, Duration::from_secs(10)).burst(4),
        Quota::token_bucket(7, Duration::from_secs(60)),
    ];
    for q in quotas {
        let q = q.build().unwrap();
        let one_number = super::kept_as_arrival(&q.params);
        let (mut state, mut level) = (None::<State>, None::<Bucket>);
        let mut now = 5 * S;
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut allowed = [0; 2];
        for i in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // About a token a step, two or so a request.
            now += x % (2 * q.params.period.get() / q.params.limit);
            let cost = 1 + x % 3;
            let o = check(state.as_ref(), &q.params, cost, now, false);
            let (expected, after) = by_level(level, &q, cost, now);
            assert_eq!(seen(&o), expected, "{q:?}, request {i}");
            allowed[usize::from(o.allowed)] += 1;
            if o.allowed {
                level = Some(after);
                match &o.admit.update {
                    Update::Set(State::Word(_)) => assert!(one_number, "{q:?}"),
                    Update::Set(State::TokenBucket(_)) => assert!(!one_number, "{q:?}"),
                    other => panic!("{other:?}"),
                }
                o.admit.update.clone().apply(&mut state, &q.params);
            }
        }
        assert!(allowed[0] > 100 && allowed[1] > 100, "{q:?}: {allowed:?}");
    }
}

#[test]
fn a_clock_behind_the_state_finds_the_bucket_further_from_full() {
    // A token about every second, two at most, in both forms: 2 per 2 s
    // (one unit a microsecond) and 2 per 2.000001 s (two units).
    for period in [2 * S, 2 * S + 1] {
        let q = Quota::token_bucket(2, Duration::from_micros(period))
            .build()
            .unwrap();
        let mut b = Sim::new(q);
        assert!(b.at(10 * S, 2).allowed);
        // Half a second earlier, the bucket is half a token further from
        // full than when it was emptied: a token comes 1.5 s later.
        let behind = b.at(10 * S - S / 2, 1);
        assert!(!behind.allowed);
        assert_eq!(behind.refuse.remaining, 0);
        assert!(
            behind.retry_after().abs_diff(S + S / 2) <= 1,
            "{period}: {behind:?}"
        );
        assert!(
            behind.refuse.reset.abs_diff(2 * S + S / 2) <= 2,
            "{period}: {behind:?}"
        );
        // A whole token later than that, one is there.
        assert!(b.allowed(11 * S + 1));
    }
}

#[test]
fn an_arrival_time_and_a_bucket_of_the_same_moment_mean_the_same() {
    // A state of either form, as a store may hold from before, is read.
    let q = Quota::token_bucket(10, Duration::from_secs(10))
        .build()
        .unwrap();
    let p = &q.params;
    let bucket = Bucket {
        level: 4 * p.unit,
        at: 20 * S,
    };
    let full_at = State::Word(bucket.full_at(p));
    for now in [20 * S, 21 * S + 3, 30 * S] {
        let a = check(Some(&State::TokenBucket(bucket)), p, 3, now, false);
        let b = check(Some(&full_at), p, 3, now, false);
        assert_eq!(a, b);
    }
}

#[test]
fn bursts_to_capacity_then_refills_continuously() {
    // 2 per second, burst 4.
    let q = Quota::token_bucket(2, Duration::from_secs(1))
        .burst(4)
        .build()
        .unwrap();
    let mut b = Sim::new(q);
    for _ in 0..4 {
        assert!(b.allowed(0));
    }
    let refused = b.at(0, 1);
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after(), S / 2);
    assert!(!b.allowed(S / 2 - 1));
    assert!(b.allowed(S / 2));
    // Full again two seconds after the last spend.
    let step = b.at(S / 2, 0);
    assert_eq!(step.admit.reset, 2 * S);
    assert!(b.at(3 * S, 4).allowed);
}

#[test]
fn cost_spends_several_tokens_and_a_refusal_spends_none() {
    let q = Quota::token_bucket(10, Duration::from_secs(10))
        .build()
        .unwrap();
    let mut b = Sim::new(q);
    assert_eq!(b.at(0, 7).admit.remaining, 3);
    let refused = b.at(0, 5);
    assert!(!refused.allowed);
    assert_eq!(refused.refuse.remaining, 3);
    // Two more tokens arrive after two seconds.
    assert_eq!(refused.retry_after(), 2 * S);
    assert!(b.at(2 * S, 5).allowed);
}

#[test]
fn fractional_rates_are_exact() {
    // 3 per 10 s: one token every 3.333... s, never rounded. A burst of
    // two leaves room for the fraction gained between samples.
    let q = Quota::token_bucket(3, Duration::from_secs(10))
        .burst(2)
        .build()
        .unwrap();
    let mut b = Sim::new(q);
    assert!(b.at(0, 2).allowed);
    let r = b.at(0, 1).retry_after();
    assert_eq!(r, 3_333_334);
    assert!(!b.allowed(r - 1));
    assert!(b.allowed(r));
    // The ninth token after r arrives exactly 30 s later.
    let mut admitted = 0;
    for t in (r..=r + 30 * S).step_by(1000) {
        admitted += u64::from(b.allowed(t));
    }
    assert_eq!(admitted, 9);
}

#[test]
fn replenish_is_the_time_to_the_next_whole_token() {
    // One token a second, ten at most.
    let q = Quota::token_bucket(10, Duration::from_secs(10))
        .build()
        .unwrap();
    let mut b = Sim::new(q);
    assert_eq!(b.at(0, 1).admit.replenish, S);
    let step = b.at(S / 2, 1);
    assert_eq!(step.admit.remaining, 8);
    assert_eq!(step.admit.replenish, S / 2);
    // A full bucket gains its next token one interval after a spend.
    assert_eq!(b.at(20 * S, 0).refuse.replenish, S);
}
