//! Traces that any backend must decide exactly as `MemoryBackend` does:
//! the same requests on the same timeline give the same decisions (allowed,
//! remaining, reset, retry-after, delay, per quota). Run against Redis by
//! `tests/redis/conformance.rs` and against a store written only with the
//! public API by `tests/engine/custom_backend.rs`.

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::time::Duration;

use tollgate::{
    Algorithm, Backend, Clock, Decision, Error, Limiter, ManualClock, MemoryBackend, Mode, Quota,
    QuotaSet, Reservation, Settle, Timestamp,
};

mod random;
// Not every test crate that includes the support module runs these.
#[allow(unused_imports)]
pub use random::*;

pub const S: u64 = 1_000_000;
/// An ordinary present-day time, so the Lua arithmetic works on the large
/// numbers it meets in production.
pub const T0: u64 = 1_760_000_000 * S;

/// The two backends behind one set of quotas, on one clock.
pub struct Twin<B: Backend> {
    clock: ManualClock,
    memory: Limiter<MemoryBackend<ManualClock>>,
    other: Limiter<B>,
    /// Keeps traces apart in one Redis.
    namespace: String,
    /// Whether the server has room for elastic quotas' extra.
    room: Cell<bool>,
    log: RefCell<Vec<String>>,
}

/// One reservation made on both backends.
pub struct Reserved<'a, B> {
    memory: Reservation<'a, MemoryBackend<ManualClock>>,
    other: Reservation<'a, B>,
}

impl<B: Backend + Clone> Twin<B> {
    pub fn new(other: &B, clock: &ManualClock, quotas: QuotaSet, namespace: &str) -> Twin<B> {
        Twin {
            clock: clock.clone(),
            memory: Limiter::new(
                MemoryBackend::builder().clock(clock.clone()).build(),
                quotas.clone(),
            ),
            other: Limiter::new(other.clone(), quotas),
            namespace: namespace.to_owned(),
            room: Cell::new(false),
            log: RefCell::new(Vec::new()),
        }
    }

    fn at(&self, micros: u64) -> &Self {
        self.clock.set(Timestamp::from_micros(micros));
        self
    }

    fn room(&self, room: bool) -> &Self {
        self.room.set(room);
        self
    }

    /// Asserts the backends agree on `what`, logged as `step`.
    fn agree(
        &self,
        step: String,
        memory: Result<Decision, String>,
        other: Result<Decision, String>,
    ) {
        self.log.borrow_mut().push(format!(
            "t={} {step} -> {memory:?}",
            self.clock.now().as_micros()
        ));
        if memory != other {
            panic!(
                "the backends disagree on trace {:?}\nquotas: {:#?}\nrequests:\n{}\nmemory: {memory:#?}\nother:  {other:#?}",
                self.namespace,
                self.memory.quotas(),
                self.log.borrow().join("\n")
            );
        }
    }

    /// Reserves on both backends, asserting they agree; `None` for a cost
    /// too high (refused by both alike).
    async fn reserve(&self, key: &str, cost: u64) -> Option<Reserved<'_, B>> {
        let key = format!("{}{key}", self.namespace);
        let memory = self.memory.reserve(&key, cost).await;
        let other = self.other.reserve(&key, cost).await;
        let (m, o) = (seen(&memory), seen(&other));
        self.agree(format!("reserve key={key:?} cost={cost}"), m, o);
        Some(Reserved {
            memory: memory.ok()?,
            other: other.ok()?,
        })
    }

    /// Gives a reservation back on both backends, asserting they agree on
    /// what is left.
    async fn give_back(&self, r: Reserved<'_, B>) -> Decision {
        let memory = plain(r.memory.give_back().await);
        let other = plain(r.other.give_back().await);
        self.agree("give back".to_owned(), memory.clone(), other);
        memory.expect("a decision")
    }

    /// Settles a reservation on both backends with its real cost,
    /// asserting they agree on what is left.
    async fn settle(&self, r: Reserved<'_, B>, actual: u64) -> Option<Decision> {
        let memory = r.memory.settle(Settle::Actual(actual)).await;
        let other = r.other.settle(Settle::Actual(actual)).await;
        let (memory, other) = (settled(memory), settled(other));
        self.agree(format!("settle actual={actual}"), memory.clone(), other);
        memory.ok()
    }

    /// Checks (or peeks) on both backends, asserts they agree, and returns
    /// the decision.
    async fn ask(&self, key: &str, cost: u64, commit: bool) -> Result<Decision, String> {
        let key = format!("{}{key}", self.namespace);
        let room = self.room.get();
        let (memory, other) = if commit {
            (
                self.memory.with_room(room).check(&key, cost).await,
                self.other.with_room(room).check(&key, cost).await,
            )
        } else {
            (
                self.memory.with_room(room).peek(&key, cost).await,
                self.other.with_room(room).peek(&key, cost).await,
            )
        };
        let memory = plain(memory);
        let other = plain(other);
        let step = format!("key={key:?} cost={cost} commit={commit} room={room}");
        self.agree(step, memory.clone(), other);
        memory
    }

    async fn check(&self, key: &str, cost: u64) -> Decision {
        self.ask(key, cost, true).await.expect("a decision")
    }

    async fn allowed(&self, key: &str) -> bool {
        self.check(key, 1).await.allowed()
    }
}

/// A reservation's decision, as [`plain`] reads a check's.
fn seen<B: Backend>(r: &Result<Reservation<'_, B>, Error>) -> Result<Decision, String> {
    match r {
        Ok(r) => Ok(r.decision().clone()),
        Err(Error::CostTooHigh { .. }) => Err("too costly".to_owned()),
        Err(e) => panic!("the backend failed: {e}"),
    }
}

/// A settle's answer, as [`plain`] reads a check's: "unchanged" when
/// nothing moved.
fn settled(r: Result<Option<Decision>, Error>) -> Result<Decision, String> {
    match r {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err("unchanged".to_owned()),
        Err(e) => plain(Err(e)),
    }
}

fn plain(r: Result<Decision, Error>) -> Result<Decision, String> {
    r.map_err(|e| match e {
        Error::CostTooHigh { .. } => e.to_string(),
        Error::Backend(e) => panic!("the backend failed: {e}"),
        other => panic!("unexpected error: {other}"),
    })
}

fn set(quotas: impl IntoIterator<Item = Quota>) -> QuotaSet {
    QuotaSet::new("conformance", quotas).expect("a valid set")
}

pub async fn seeds_fixed_window_boundary_burst<B: Backend + Clone>(other: &B, clock: &ManualClock) {
    // 5 per minute: 5 at 02:00:30-59 and 5 at 02:01:00-30 all pass.
    let minute = T0 - T0 % (60 * S);
    let t = Twin::new(
        other,
        clock,
        set([Quota::fixed_window(5, Duration::from_secs(60))
            .build()
            .unwrap()]),
        "fw:",
    );
    for i in 0..5 {
        assert!(t.at(minute + (30 + 7 * i) * S).allowed("k").await);
    }
    let refused = t.at(minute + 59 * S).check("k", 1).await;
    assert!(!refused.allowed());
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(1)));
    for i in 0..5 {
        assert!(t.at(minute + (60 + 7 * i) * S).allowed("k").await);
    }
}

pub async fn seeds_sliding_log_with_rejected_attempts_logged<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    let minute = T0 - T0 % (60 * S);
    let t = Twin::new(
        other,
        clock,
        set([Quota::sliding_log(2, Duration::from_secs(60))
            .count_rejected(true)
            .build()
            .unwrap()]),
        "log:",
    );
    assert!(t.at(minute + 12 * S).allowed("k").await);
    assert!(t.at(minute + 24 * S).allowed("k").await);
    let refused = t.at(minute + 36 * S).check("k", 1).await;
    assert!(!refused.allowed());
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(48)));
    // At 1:25 the entries of 0:12 and 0:24 have expired; 0:36 remains.
    assert!(t.at(minute + 85 * S).allowed("k").await);
}

pub async fn seeds_sliding_window_counter_examples<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    let minute = T0 - T0 % (60 * S);
    // 7 per minute: 5 in the previous minute, 3 in this one, 30% in:
    // 3 + 5 x 0.7 = 6.5, under 7: allowed.
    let t = Twin::new(
        other,
        clock,
        set([Quota::sliding_window(7, Duration::from_secs(60))
            .build()
            .unwrap()]),
        "sw7:",
    );
    t.at(minute + 10 * S).check("k", 5).await;
    for _ in 0..3 {
        assert!(t.at(minute + 72 * S).allowed("k").await);
    }
    let d = t.at(minute + 78 * S).check("k", 1).await;
    assert!(d.allowed());
    assert_eq!(d.remaining(), 0);

    // 10 per minute: 9 in the previous minute, and 25% into this one the 9
    // still weigh 6.75. The seeds' 5 in this minute cannot all have been
    // admitted by then, so take the 4 that can: 6.75 + 4 = 10.75, over 10.
    let t = Twin::new(
        other,
        clock,
        set([Quota::sliding_window(10, Duration::from_secs(60))
            .build()
            .unwrap()]),
        "sw10:",
    );
    t.at(minute + 10 * S).check("k", 9).await;
    for _ in 0..4 {
        assert!(t.at(minute + 74 * S).allowed("k").await);
    }
    let d = t.at(minute + 75 * S).check("k", 1).await;
    assert!(!d.allowed());
    assert_eq!(d.remaining(), 0);
}

pub async fn classdojo_push_notifications_and_the_peers_examples<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    // At most 10 a minute, and 3 s between two.
    let push = Twin::new(
        other,
        clock,
        set([
            Quota::sliding_log(10, Duration::from_secs(60))
                .build()
                .unwrap(),
            Quota::min_interval(Duration::from_secs(3)).build().unwrap(),
        ]),
        "push:",
    );
    let mut admitted = 0;
    for i in 0..60 {
        admitted += u64::from(push.at(T0 + i * S).allowed("teacher").await);
    }
    assert_eq!(admitted, 10);

    // Twitter: 300 tweets per 3 hours; Google Docs: 300 reads a minute.
    let tweets = Twin::new(
        other,
        clock,
        set([Quota::token_bucket(300, Duration::from_secs(3 * 3600))
            .build()
            .unwrap()]),
        "tweets:",
    );
    assert!(tweets.at(T0).check("u", 300).await.allowed());
    let refused = tweets.at(T0).check("u", 1).await;
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(36)));
    assert!(tweets.at(T0 + 36 * S).allowed("u").await);
    let reads = Twin::new(
        other,
        clock,
        set([Quota::gcra(300, Duration::from_secs(60)).build().unwrap()]),
        "reads:",
    );
    for i in 0..400 {
        reads.at(T0 + i * 1000).allowed("u").await;
    }

    // Soft throttling: 10% over; shadow: report only.
    let soft = Twin::new(
        other,
        clock,
        set([Quota::fixed_window(10, Duration::from_secs(60))
            .mode(Mode::Soft { percent: 10 })
            .build()
            .unwrap()]),
        "soft:",
    );
    let mut admitted = 0;
    for _ in 0..15 {
        admitted += u64::from(soft.at(T0).allowed("u").await);
    }
    assert_eq!(admitted, 11);
    let shadow = Twin::new(
        other,
        clock,
        set([
            Quota::gcra(2, Duration::from_secs(60))
                .name("would-limit")
                .mode(Mode::Shadow)
                .build()
                .unwrap(),
            Quota::fixed_window(100, Duration::from_secs(60))
                .build()
                .unwrap(),
        ]),
        "shadow:",
    );
    for i in 0..5 {
        let d = shadow.at(T0).check("u", 1).await;
        assert!(d.allowed());
        assert_eq!(d.exceeded(), i >= 2);
    }
}

pub async fn leaky_bucket_delays_and_refusals_match<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    let t = Twin::new(
        other,
        clock,
        set([Quota::leaky_bucket(2, Duration::from_secs(1))
            .burst(3)
            .build()
            .unwrap()]),
        "leaky:",
    );
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(t.at(T0).check("k", 1).await.delay());
    }
    assert_eq!(got, [0, 500, 1000].map(Duration::from_millis).to_vec());
    assert!(!t.at(T0).allowed("k").await);
    assert_eq!(
        t.at(T0 + S / 2).check("k", 1).await.delay(),
        Duration::from_secs(1)
    );
}

pub async fn a_clock_behind_the_state_is_decided_alike<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    // One unit of two spent at T0 + 10 s, then one asked for at 9.5 s (a
    // clock that stepped back, or a server whose clock runs behind), then
    // more later.
    let two = Duration::from_secs(2);
    let quotas = [
        Quota::token_bucket(2, two),
        // 2 per 2.000001 s: two units a microsecond, kept as a level.
        Quota::token_bucket(2, two + Duration::from_micros(1)),
        Quota::gcra(2, two),
        Quota::leaky_bucket(2, two),
        Quota::fixed_window(2, two),
        Quota::sliding_window(2, two),
        Quota::sliding_log(2, two),
    ];
    for (i, quota) in quotas.into_iter().enumerate() {
        let quota = quota.build().unwrap();
        let bucket = quota.algorithm() == Algorithm::TokenBucket;
        let t = Twin::new(other, clock, set([quota]), &format!("behind{i}:"));
        assert!(t.at(T0 + 10 * S).check("k", 1).await.allowed());
        let behind = t.at(T0 + 10 * S - S / 2).check("k", 1).await;
        if bucket {
            // Half a token further from full than it was at 10 s: half a
            // token short.
            assert!(!behind.allowed());
            let retry = behind.retry_after().unwrap().as_micros();
            assert!(retry.abs_diff(500_000) <= 1, "{retry}");
        }
        t.at(T0 + 11 * S - S / 4).check("k", 1).await;
        t.at(T0 + 12 * S + 1).check("k", 2).await;
    }
}

pub async fn many_requests_in_one_microsecond_are_all_logged<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    let t = Twin::new(
        other,
        clock,
        set([Quota::sliding_log(50, Duration::from_secs(1))
            .build()
            .unwrap()]),
        "same-us:",
    );
    let mut admitted = 0;
    for _ in 0..80 {
        admitted += u64::from(t.at(T0).allowed("k").await);
    }
    assert_eq!(admitted, 50);
    // Half a period later all 50 are still live; a period later none.
    assert!(!t.at(T0 + S / 2).allowed("k").await);
    assert_eq!(t.at(T0 + S).check("k", 50).await.remaining(), 0);
}

/// Rates above one per microsecond: GCRA refuses them at build (its ceiling),
/// and the token bucket and the windows count them exactly, the same in
/// both backends.
pub async fn a_billion_a_second_is_counted_exactly<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    const BILLION: u64 = 1_000_000_000;
    assert!(matches!(
        Quota::gcra(BILLION, Duration::from_secs(1)).build(),
        Err(tollgate::QuotaError::RateTooHigh { .. })
    ));
    let t = Twin::new(
        other,
        clock,
        set([Quota::token_bucket(BILLION, Duration::from_secs(1))
            .build()
            .unwrap()]),
        "billion-tb:",
    );
    assert_eq!(t.at(T0).check("k", BILLION - 5).await.remaining(), 5);
    assert!(!t.at(T0).check("k", 6).await.allowed());
    // A thousand tokens a microsecond.
    let refused = t.at(T0).check("k", 2_005).await;
    assert_eq!(refused.retry_after(), Some(Duration::from_micros(2)));
    assert_eq!(t.at(T0 + 2).check("k", 2_005).await.remaining(), 0);
    assert_eq!(t.at(T0 + 1_000).check("k", 0).await.remaining(), 998_000);
    for quota in [
        Quota::fixed_window(BILLION, Duration::from_secs(1)),
        Quota::sliding_window(BILLION, Duration::from_secs(1)),
    ] {
        let t = Twin::new(other, clock, set([quota.build().unwrap()]), "billion-w:");
        let start = T0 + 10 * S;
        assert_eq!(t.at(start).check("k", BILLION - 1).await.remaining(), 1);
        assert!(t.at(start + 1).allowed("k").await);
        assert!(!t.at(start + 2).allowed("k").await);
    }
}

pub async fn costs_peeks_and_too_costly_requests_match<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    for a in Algorithm::ALL {
        let t = Twin::new(
            other,
            clock,
            set([Quota::builder(a, 10, Duration::from_secs(10))
                .build()
                .unwrap()]),
            &format!("cost-{a}:"),
        );
        t.at(T0 + 3 * S);
        t.ask("k", 0, true).await.unwrap();
        t.ask("k", 4, false).await.unwrap();
        t.ask("k", 4, true).await.unwrap();
        t.ask("k", 7, true).await.unwrap();
        t.ask("k", 11, true).await.unwrap_err();
        t.at(T0 + 5 * S);
        t.ask("k", 6, false).await.unwrap();
        t.ask("k", 6, true).await.unwrap();
        t.ask("k", 0, true).await.unwrap();
        t.at(T0 + 20 * S);
        t.ask("k", 10, true).await.unwrap();
    }
}

/// An elastic quota of every algorithm, with room and without: up to the
/// ceiling with room, the limit without, and what was admitted over the
/// limit counted once room is gone; the same numbers from both backends.
pub async fn elastic_quotas_match_with_room_and_without<B: Backend + Clone>(
    other: &B,
    clock: &ManualClock,
) {
    for a in Algorithm::ALL {
        let quota = Quota::builder(a, 4, Duration::from_secs(10))
            .mode(Mode::Elastic { percent: 100 })
            .build()
            .unwrap();
        let t = Twin::new(other, clock, set([quota]), &format!("elastic-{a}:"));
        t.at(T0 + 3 * S).room(false);
        let mut admitted = 0;
        for _ in 0..6 {
            admitted += u64::from(t.allowed("k").await);
        }
        assert_eq!(admitted, 4, "{a} without room");
        let refused = t.check("k", 1).await;
        assert!(!refused.allowed(), "{a}");
        assert_eq!(refused.quotas()[0].limit(), 4, "{a}: the nominal limit");
        t.room(true);
        let mut admitted = 0;
        for _ in 0..6 {
            admitted += u64::from(t.allowed("k").await);
        }
        assert_eq!(admitted, 4, "{a} with room: the rest of the ceiling");
        // Past the limit with room: remaining shows 0, not the ceiling's.
        let full = t.ask("k", 0, false).await.unwrap();
        assert_eq!(full.remaining(), 0, "{a}");
        // Later: with room one more passes before the limit would have let it.
        t.at(T0 + 6 * S).room(false);
        t.check("k", 1).await;
        t.room(true);
        t.check("k", 1).await;
        t.at(T0 + 30 * S).room(false);
        t.check("k", 3).await;
        t.check("k", 2).await;
        t.room(true);
        t.check("k", 2).await;
        t.check("k", 8).await;
    }
}
