//! The set's evaluation checked against every quota's outcome computed in
//! full.

use super::checked::{Checked, resolve};
use super::*;
use crate::algorithm::{Outcome, fixed_window, sliding_window, token_bucket};
use crate::decision::QuotaDecision;
use crate::quota::{Mode, QuotaBuilder};
use std::time::Duration;

/// What a caller reads of a quota's decision, now and aged as a cached
/// answer is.
#[derive(Debug, PartialEq)]
struct Read {
    now: (bool, u64, Duration, Duration),
    retry_after: Option<Duration>,
    delay: Duration,
    aged: (u64, Duration),
}

fn read(q: &QuotaDecision) -> Read {
    let aged = q.aged(150_000);
    Read {
        now: (q.allowed(), q.remaining(), q.reset(), q.replenish()),
        retry_after: q.retry_after(),
        delay: q.delay(),
        aged: (aged.remaining(), aged.reset()),
    }
}

/// Asserts that two decisions of one quota read alike; returns whether
/// it admits.
fn read_alike(general: &Decision, derived: &Decision) -> bool {
    let ([g], [d]) = (general.quotas(), derived.quotas()) else {
        panic!("one quota each")
    };
    assert_eq!(read(g), read(d));
    assert_eq!(general, derived);
    g.allowed()
}

#[test]
fn an_arrival_time_reports_when_read_what_the_algorithm_computes() {
    // Each request is decided both ways on the same state: the decision
    // whose remaining and replenish are derived when read must report
    // what the general path computed, in every mode and on refusals.
    let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
    for mode in modes {
        // A token bucket of 4 per 3 s (6 in soft mode) refills one unit
        // a microsecond: it is kept as an arrival time too.
        let builders = [
            Quota::gcra(4, Duration::from_secs(2)),
            Quota::leaky_bucket(4, Duration::from_secs(2)),
            Quota::token_bucket(4, Duration::from_secs(3)),
        ];
        for builder in builders {
            let quota = builder.burst(3).mode(mode).build().unwrap();
            assert_eq!(quota.path, crate::quota::Path::Arrival);
            let set = QuotaSet::single(quota);
            let mut tat = None;
            let mut seen = [false; 2];
            for (i, cost) in [1, 1, 2, 1, 3, 1, 1, 2, 1, 1].into_iter().enumerate() {
                let now = 1_000_000 + i as u64 * 170_000;
                let state = tat.map(State::Word);
                let (general, update) = set.evaluate_one(state.as_ref(), cost, now, true, false);
                let checked = arrive(&set.quotas()[0], tat.unwrap_or(0), cost, now);
                let derived = arrival_decision(&set.quotas()[0], &checked);
                let same = match checked.allowed {
                    true => Update::Set(State::Word(checked.next)),
                    false => Update::Keep,
                };
                assert_eq!(update, same, "{mode:?}, request {i}");
                let g = read_alike(&general, &derived);
                seen[usize::from(g)] = true;
                if let Update::Set(State::Word(next)) = update {
                    tat = Some(next);
                }
            }
            assert_eq!(seen, [true, true], "admissions and refusals both checked");
        }
    }
}

#[test]
fn a_sliding_window_admission_reports_when_read_what_the_algorithm_computes() {
    // Each request is decided both ways on the same counters: an
    // admission whose numbers are derived when read must report what
    // the general path computed, in every mode, across windows, with a
    // previous window fading, and aged as a cached answer is.
    let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
    for mode in modes {
        let quota = Quota::sliding_window(6, Duration::from_secs(2))
            .mode(mode)
            .build()
            .unwrap();
        assert_eq!(quota.path, crate::quota::Path::SlidingWindow);
        let set = QuotaSet::single(quota);
        let mut counters = None;
        let (mut derived_admissions, mut refusals) = (0, 0);
        for i in 0..60u64 {
            // 0.25 s apart, crossing windows; a clock one step behind
            // every tenth request.
            let now = 4_000_000 + i * 250_000 - if i % 10 == 9 { 300_000 } else { 0 };
            let cost = [1, 2, 1, 3, 0][i as usize % 5];
            let state = counters.map(State::SlidingWindow);
            let (general, update) = set.evaluate_one(state.as_ref(), cost, now, true, false);
            let p = &set.quotas()[0].params;
            let admitted =
                sliding_window::admit_or_check(counters.as_ref(), p, cost, now, Some, |outcome| {
                    // The outcome checked from the same estimate decides
                    // as the general path does.
                    assert_eq!(
                        set.evaluate_outcome(outcome, true),
                        (general.clone(), update.clone())
                    );
                    None
                });
            match admitted {
                Some(admitted) => {
                    derived_admissions += 1;
                    read_alike(&general, &set.sliding_window_admitted(admitted));
                    assert_eq!(update, Update::Set(State::SlidingWindow(admitted.counters)));
                }
                // Only a refusal, or a clock behind the window, is left
                // to the general path.
                None => refusals += u64::from(general.exceeded()),
            }
            if let Update::Set(State::SlidingWindow(next)) = update {
                counters = Some(next);
            }
        }
        assert!(
            derived_admissions > 10 && refusals > 5,
            "{mode:?}: {derived_admissions}, {refusals}"
        );
    }
}

#[test]
fn a_token_bucket_checked_in_plain_numbers_reports_what_the_algorithm_computes() {
    // Buckets refilling 7 units a microsecond (`Path::BucketWord`) and
    // 7 000 001 (a token 10^6 units, `Path::Bucket`), each request decided
    // both ways on the same stored bucket, in every mode, with refusals, a
    // cost of 0 and a clock behind the bucket.
    let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
    let rates = [
        (7_000_000, crate::quota::Path::BucketWord),
        (7_000_001, crate::quota::Path::Bucket),
    ];
    for (mode, (per_second, path)) in modes.into_iter().flat_map(|m| rates.map(|r| (m, r))) {
        let quota = Quota::token_bucket(per_second, Duration::from_secs(1))
            .burst(20)
            .mode(mode)
            .build()
            .unwrap();
        assert_eq!(quota.path, path);
        let set = QuotaSet::single(quota);
        let p = &set.quotas()[0].params;
        let (mut state, mut refusals) = (None, 0);
        for i in 0..200u64 {
            let now = 1_000_000 + i * 2 - if i % 10 == 9 { 5 } else { 0 };
            let cost = [3, 1, 0, 5, 2][i as usize % 5];
            let (general, update) = set.evaluate_one(state.as_ref(), cost, now, true, false);
            let taken = token_bucket::take(state.as_ref(), p, cost, now);
            assert_eq!(set.bucket_decision(&taken), general, "{mode:?} at {i}");
            let stored = taken
                .admits(p)
                .then(|| State::TokenBucket(taken.bucket(p, now)));
            match update {
                Update::Set(next) => assert_eq!(stored, Some(next), "{mode:?} at {i}"),
                _ => assert_eq!(stored, None, "{mode:?} at {i}"),
            }
            refusals += u64::from(general.exceeded());
            state = stored.or(state);
        }
        assert!(refusals >= 10, "{mode:?}: {refusals}");
    }
}

#[test]
fn a_fixed_window_counted_apart_reports_what_the_algorithm_computes() {
    // Fixed windows of 5 a second (one number, `Path::Window`) and of 5
    // million (two, `Path::WindowPair`), each request decided both ways on
    // the same stored state, in every mode, across windows, with refusals,
    // a cost of 0 and a clock behind the window.
    let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
    let shapes = [
        (5, 1, crate::quota::Path::Window),
        (5_000_000, 1_000_000, crate::quota::Path::WindowPair),
    ];
    for ((limit, unit, path), mode) in shapes.into_iter().flat_map(|s| modes.map(|m| (s, m))) {
        let quota = Quota::fixed_window(limit, Duration::from_secs(1))
            .mode(mode)
            .build()
            .unwrap();
        assert_eq!(quota.path, path);
        let set = QuotaSet::single(quota);
        let p = &set.quotas()[0].params;
        let (mut state, mut refusals) = (None, 0);
        for i in 0..80u64 {
            let now = 7_000_000 + i * 100_000 - if i % 10 == 9 { 150_000 } else { 0 };
            let cost = [1, 2, 0, 3, 1][i as usize % 5] * unit;
            let (general, update) = set.evaluate_one(state.as_ref(), cost, now, true, false);
            let counted = fixed_window::count(state.as_ref(), p, cost, now);
            let at = format!("{limit} {mode:?} at {i}");
            assert_eq!(set.window_decision(&counted, cost), general, "{at}");
            let stored = counted.allowed.then(|| counted.state_after(p, cost));
            match update {
                Update::Set(next) => assert_eq!(stored, Some(next), "{at}"),
                _ => assert_eq!(stored, None, "{at}"),
            }
            refusals += u64::from(general.exceeded());
            state = stored.or(state);
        }
        assert!(refusals >= 10, "{limit} {mode:?}: {refusals}");
    }
}

/// A set decided with every quota's outcome computed in full, both
/// branches: the reference for the numbers a set derives when read.
fn decided_in_full(
    set: &QuotaSet,
    states: &mut [Option<QuotaState>],
    cost: u64,
    now: u64,
) -> Decision {
    let mut outcomes: Vec<Outcome> = (0..set.quotas().len())
        .map(|i| states.with(i, |s| set.quotas()[i].check(s, cost, now, false, false)))
        .collect();
    let allowed = set.admits(outcomes.iter().map(|o| o.allowed));
    let mut decisions = Vec::new();
    for (i, (outcome, q)) in outcomes.iter_mut().zip(set.quotas()).enumerate() {
        let (raw, update) = resolve(outcome, allowed, true);
        states.store(i, update, &q.params);
        decisions.push(raw.decision(q));
    }
    Decision::new(allowed, decisions.into_iter())
}

/// Decides 120 requests on `set` both ways, as `evaluate` does and in
/// full, asserting that they agree on the states stored and on what
/// every quota reports, read now and aged; with a clock stepping back
/// every tenth request. Costs are 0 to 3 times `unit`. Returns how often
/// the first quota admitted with the set, admitted but was refused by
/// another quota, and refused.
fn decided_both_ways(set: &QuotaSet, unit: u64, label: &str) -> [u32; 3] {
    let mut states: Vec<Option<QuotaState>> = vec![None; set.quotas().len()];
    let mut seen = [0; 3];
    for i in 0..120u64 {
        let now = 4_000_000 + i * 125_000 - if i % 10 == 9 { 300_000 } else { 0 };
        let cost = [1, 2, 1, 3, 0][i as usize % 5] * unit;
        let mut expected_states = states.clone();
        let expected = decided_in_full(set, &mut expected_states, cost, now);
        let at = Timestamp::from_micros(now);
        let decision = set.evaluate(states.as_mut_slice(), cost, at, true, false);
        assert_eq!(states, expected_states, "{label}, request {i}");
        assert_eq!(decision.allowed(), expected.allowed());
        for (d, e) in decision.quotas().iter().zip(expected.quotas()) {
            assert_eq!(read(d), read(e), "{label}, request {i}");
        }
        assert_eq!(decision, expected);
        let first = &decision.quotas()[0];
        seen[match (first.allowed(), decision.allowed()) {
            (true, true) => 0,
            (true, false) => 1,
            (false, _) => 2,
        }] += 1;
    }
    seen
}

#[test]
fn a_sliding_window_in_a_set_reports_when_read_what_the_algorithm_computes() {
    // A sliding window beside a quota that refuses some of what the
    // window admits: the window reports from its counters after the
    // admission, or as they were when another quota refuses, and must
    // read as the full computation does, in every mode, across windows,
    // with a clock stepping back, and aged as a cached answer is.
    let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
    for mode in modes {
        let window = Quota::sliding_window(5, Duration::from_secs(2))
            .name("window")
            .mode(mode)
            .build()
            .unwrap();
        let interval = Quota::min_interval(Duration::from_millis(250))
            .name("interval")
            .build()
            .unwrap();
        let set = QuotaSet::new("pair", [window, interval]).unwrap();
        let seen = decided_both_ways(&set, 1, &format!("{mode:?}"));
        assert!(seen.iter().all(|&n| n > 5), "{mode:?}: {seen:?}");
    }
}

#[test]
fn a_fixed_window_in_a_set_reports_what_its_full_outcome_does() {
    // A set keeps a fixed window's count, not its outcome, and makes
    // only the branch the set takes: it must report and store what the
    // full outcome does, for a window kept as one number (5 per 2 s)
    // and one that is not (more than one a microsecond), in every mode.
    let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
    for mode in modes {
        for (limit, unit) in [(5, 1), (5_000_000, 1_000_000)] {
            let window = Quota::fixed_window(limit, Duration::from_secs(2))
                .name("window")
                .mode(mode)
                .build()
                .unwrap();
            // Refuses some of what the window admits: 4 units a second,
            // 3 at once. (At 4 000 000 a second, its check is kept whole,
            // beside the window's count.)
            let spacing = Quota::token_bucket(4 * unit, Duration::from_secs(1))
                .burst(3 * unit)
                .name("spacing")
                .build()
                .unwrap();
            let set = QuotaSet::new("pair", [window, spacing]).unwrap();
            let label = format!("{mode:?}, limit {limit}");
            let seen = decided_both_ways(&set, unit, &label);
            assert!(seen.iter().all(|&n| n > 5), "{label}: {seen:?}");
        }
    }
}

#[test]
fn a_sets_check_is_small() {
    // A set moves each check into its list; a whole outcome is kept
    // aside (see `Checked`).
    assert!(std::mem::size_of::<Checked>() <= 48);
    assert_eq!(std::mem::size_of::<Outcome>(), 128);
}

#[test]
fn sets_refuse_duplicates_and_emptiness() {
    let q = Quota::gcra(1, Duration::from_secs(1)).build().unwrap();
    assert_eq!(QuotaSet::new("x", []), Err(QuotaSetError::Empty));
    assert!(matches!(
        QuotaSet::new("x", [q.clone(), q]),
        Err(QuotaSetError::DuplicateName(_))
    ));
}

#[test]
fn state_ids_ignore_the_mode_but_not_the_numbers() {
    let base = Quota::gcra(5, Duration::from_secs(1));
    let set = |name: &str, quota: QuotaBuilder| QuotaSet::new(name, [quota.build().unwrap()]);
    let enforce = set("api", base.clone()).unwrap();
    let shadow = set("api", base.clone().mode(Mode::Shadow)).unwrap();
    let bigger = set("api", Quota::gcra(6, Duration::from_secs(1))).unwrap();
    let other_set = set("other", base.clone()).unwrap();
    assert_eq!(enforce.state_ids(), shadow.state_ids());
    assert_ne!(enforce.state_ids(), bigger.state_ids());
    assert_ne!(enforce.state_ids(), other_set.state_ids());
    // A set without a name is only its own (and its clones').
    let unnamed = QuotaSet::single(base.clone().build().unwrap());
    assert_eq!(unnamed.clone().state_ids(), unnamed.state_ids());
    assert_ne!(
        QuotaSet::single(base.build().unwrap()).state_ids(),
        unnamed.state_ids()
    );
}
