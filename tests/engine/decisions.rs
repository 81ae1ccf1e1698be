//! The decision engine through its public API, on a manual clock.

#[cfg(feature = "redis")]
use crate::support::redis as redis_support;

use std::time::Duration;

use tollgate::{
    Algorithm, Error, Limiter, ManualClock, MemoryBackend, Mode, Quota, QuotaSet, Timestamp,
};

const SEC: Duration = Duration::from_secs(1);

fn limiter(quotas: impl Into<QuotaSet>) -> (Limiter<MemoryBackend<ManualClock>>, ManualClock) {
    // Start on a minute boundary so window arithmetic is easy to read.
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_040));
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    (Limiter::new(backend, quotas), clock)
}

async fn allowed(l: &Limiter<MemoryBackend<ManualClock>>, key: &str) -> bool {
    l.check(key, 1).await.unwrap().allowed()
}

#[tokio::test]
async fn every_algorithm_admits_again_exactly_at_retry_after() {
    for algorithm in Algorithm::ALL {
        let quota = Quota::builder(algorithm, 3, 10 * SEC).build().unwrap();
        let (l, clock) = limiter(quota);
        clock.advance(Duration::from_millis(2_345));
        let refused = loop {
            let d = l.check("k", 1).await.unwrap();
            if !d.allowed() {
                break d;
            }
        };
        let wait = refused
            .retry_after()
            .expect("a refusal carries retry-after");
        assert!(wait > Duration::ZERO, "{algorithm}");
        clock.advance(wait - Duration::from_micros(1));
        assert!(
            !allowed(&l, "k").await,
            "{algorithm}: passed before retry-after"
        );
        clock.advance(Duration::from_micros(1));
        assert!(
            allowed(&l, "k").await,
            "{algorithm}: refused at retry-after"
        );
    }
}

#[tokio::test]
async fn keys_are_independent() {
    for algorithm in Algorithm::ALL {
        let (l, _) = limiter(Quota::builder(algorithm, 2, 60 * SEC).build().unwrap());
        assert!(l.check("a", 2).await.unwrap().allowed());
        assert!(!allowed(&l, "a").await, "{algorithm}");
        assert!(l.check("b", 2).await.unwrap().allowed(), "{algorithm}");
    }
}

#[tokio::test]
async fn decisions_report_limit_remaining_and_reset() {
    let (l, clock) = limiter(Quota::fixed_window(5, 60 * SEC).build().unwrap());
    clock.advance(20 * SEC);
    let d = l.check("k", 2).await.unwrap();
    let q = &d.quotas()[0];
    assert_eq!((q.limit(), q.remaining()), (5, 3));
    assert_eq!(q.reset(), 40 * SEC);
    assert_eq!(q.retry_after(), None);
    let refused = l.check("k", 4).await.unwrap();
    assert_eq!(refused.quotas()[0].remaining(), 3, "nothing was spent");
    assert_eq!(refused.retry_after(), Some(40 * SEC));
}

#[tokio::test]
async fn a_quota_refusing_spends_nothing_from_the_others() {
    // ClassDojo: 10 a minute AND 2 per 3 s.
    let set = QuotaSet::new(
        "push",
        [
            Quota::sliding_log(10, 60 * SEC).build().unwrap(),
            Quota::sliding_log(2, 3 * SEC).build().unwrap(),
        ],
    )
    .unwrap();
    let (l, clock) = limiter(set);
    assert!(allowed(&l, "t").await);
    assert!(allowed(&l, "t").await);
    for _ in 0..5 {
        let d = l.check("t", 1).await.unwrap();
        assert!(!d.allowed());
        assert_eq!(d.violated().collect::<Vec<_>>(), [1]);
        assert_eq!(
            d.quotas()[0].remaining(),
            8,
            "the minute quota was not spent"
        );
        assert_eq!(d.retry_after(), Some(3 * SEC));
    }
    // Over the minute: 2 every 3 s until the 10 are used.
    let mut admitted = 2;
    for _ in 0..30 {
        clock.advance(SEC);
        while allowed(&l, "t").await {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
    let d = l.check("t", 1).await.unwrap();
    assert_eq!(d.violated().collect::<Vec<_>>(), [0]);
}

#[tokio::test]
async fn minimum_interval_between_actions() {
    let set = QuotaSet::new(
        "push",
        [
            Quota::sliding_log(10, 60 * SEC).build().unwrap(),
            Quota::min_interval(3 * SEC).build().unwrap(),
        ],
    )
    .unwrap();
    let (l, clock) = limiter(set);
    assert!(allowed(&l, "t").await);
    clock.advance(2 * SEC);
    let d = l.check("t", 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(d.retry_after(), Some(SEC));
    clock.advance(SEC);
    assert!(allowed(&l, "t").await);
}

#[tokio::test]
async fn shadow_mode_never_refuses_but_reports() {
    let quota = Quota::gcra(2, 60 * SEC).mode(Mode::Shadow).build().unwrap();
    let (l, _) = limiter(quota);
    assert!(allowed(&l, "k").await);
    assert!(allowed(&l, "k").await);
    for _ in 0..3 {
        let d = l.check("k", 1).await.unwrap();
        assert!(d.allowed());
        assert!(d.exceeded());
        assert_eq!(d.quotas()[0].remaining(), 0);
        assert_eq!(d.quotas()[0].retry_after(), Some(30 * SEC));
    }
}

#[tokio::test]
async fn shadow_quota_beside_an_enforced_one() {
    let set = QuotaSet::new(
        "api",
        [
            Quota::fixed_window(3, 60 * SEC)
                .name("enforced")
                .build()
                .unwrap(),
            Quota::fixed_window(1, 60 * SEC)
                .name("trial")
                .mode(Mode::Shadow)
                .build()
                .unwrap(),
        ],
    )
    .unwrap();
    let (l, _) = limiter(set);
    let mut exceeded = 0;
    for _ in 0..3 {
        let d = l.check("k", 1).await.unwrap();
        assert!(d.allowed());
        exceeded += usize::from(d.exceeded());
    }
    assert_eq!(exceeded, 2, "the trial quota would have refused two");
    assert!(!allowed(&l, "k").await);
}

#[tokio::test]
async fn soft_mode_admits_the_margin_and_reports_the_nominal_limit() {
    let quota = Quota::fixed_window(10, 60 * SEC)
        .mode(Mode::Soft { percent: 20 })
        .build()
        .unwrap();
    let (l, _) = limiter(quota);
    let mut admitted = 0;
    while allowed(&l, "k").await {
        admitted += 1;
    }
    assert_eq!(admitted, 12);
    let d = l.check("k", 1).await.unwrap();
    assert_eq!((d.quotas()[0].limit(), d.quotas()[0].remaining()), (10, 0));
}

#[tokio::test]
async fn a_cost_no_quota_can_admit_is_an_error() {
    let (l, _) = limiter(Quota::token_bucket(5, SEC).burst(8).build().unwrap());
    match l.check("k", 9).await {
        Err(Error::CostTooHigh { cost, max, .. }) => assert_eq!((cost, max), (9, 8)),
        other => panic!("expected CostTooHigh, got {other:?}"),
    }
    assert!(l.check("k", 8).await.unwrap().allowed());
}

#[tokio::test]
async fn peek_spends_nothing() {
    for algorithm in Algorithm::ALL {
        let (l, _) = limiter(Quota::builder(algorithm, 2, 60 * SEC).build().unwrap());
        for _ in 0..5 {
            assert!(l.peek("k", 2).await.unwrap().allowed(), "{algorithm}");
        }
        assert!(l.check("k", 2).await.unwrap().allowed(), "{algorithm}");
        assert!(!l.peek("k", 1).await.unwrap().allowed(), "{algorithm}");
    }
}

#[tokio::test]
async fn leaky_bucket_delays_admitted_requests() {
    let (l, _) = limiter(Quota::leaky_bucket(4, SEC).build().unwrap());
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(l.check("k", 1).await.unwrap().delay());
    }
    assert_eq!(seen, [0, 250, 500, 750].map(Duration::from_millis).to_vec());
    assert!(!allowed(&l, "k").await, "the queue of four is full");
}

#[tokio::test]
async fn sliding_log_counting_rejections_keeps_retrying_clients_out() {
    let quota = Quota::sliding_log(2, 60 * SEC)
        .count_rejected(true)
        .build()
        .unwrap();
    let (l, clock) = limiter(quota);
    assert!(allowed(&l, "k").await);
    assert!(allowed(&l, "k").await);
    // Retrying every 10 s keeps the log full.
    for _ in 0..20 {
        clock.advance(10 * SEC);
        assert!(!allowed(&l, "k").await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_on_one_key_admit_exactly_the_limit() {
    for algorithm in Algorithm::ALL {
        // Time stands still: nothing refills while the tasks race.
        let (l, _) = limiter(Quota::builder(algorithm, 100, 60 * SEC).build().unwrap());
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move {
                    let mut admitted = 0u32;
                    for _ in 0..50 {
                        admitted += u32::from(l.check("hot", 1).await.unwrap().allowed());
                    }
                    admitted
                })
            })
            .collect();
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        assert_eq!(total, 100, "{algorithm}");
    }
}

/// GCRA and the leaky bucket decide a stored key under a read lock by
/// compare-and-swap: threads racing on one key must each see a distinct
/// arrival time, so every admission reports a different `remaining`.
#[test]
fn threads_racing_on_one_arrival_time_lose_no_update() {
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket] {
        let (l, _) = limiter(Quota::builder(algorithm, 4_000, 60 * SEC).build().unwrap());
        // Stored first, so every racing check takes the read-locked path.
        assert!(l.check_now("hot", 1).unwrap().unwrap().allowed());
        let start = std::sync::Barrier::new(4);
        let seen: Vec<Vec<u64>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        start.wait();
                        (0..2_000)
                            .filter_map(|_| {
                                let d = l.check_now("hot", 1).unwrap().unwrap();
                                d.allowed().then(|| d.quotas()[0].remaining())
                            })
                            .collect()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut remaining: Vec<u64> = seen.into_iter().flatten().collect();
        assert_eq!(
            remaining.len(),
            3_999,
            "{algorithm}: the limit less the first"
        );
        remaining.sort_unstable();
        remaining.dedup();
        assert_eq!(
            remaining.len(),
            3_999,
            "{algorithm}: two admissions shared a state"
        );
    }
}

/// A GCRA quota shared by a one-quota set (decided by compare-and-swap
/// under the read lock) and a two-quota set of the same name (decided under
/// the write lock) keeps one count: the write path sees every swap.
#[test]
fn a_quota_shared_by_the_lock_free_path_and_the_locked_path_keeps_one_count() {
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_040));
    let backend = MemoryBackend::builder().clock(clock).build();
    let gcra = Quota::gcra(6, 60 * SEC).name("api").build().unwrap();
    let roomy = Quota::fixed_window(1_000, 60 * SEC)
        .name("roomy")
        .build()
        .unwrap();
    let alone = Limiter::new(backend.clone(), QuotaSet::new("s", [gcra.clone()]).unwrap());
    let both = Limiter::new(backend, QuotaSet::new("s", [gcra, roomy]).unwrap());
    assert_eq!(alone.quotas().state_ids()[0], both.quotas().state_ids()[0]);
    let mut admitted = 0;
    for i in 0..12 {
        let limiter = if i % 2 == 0 { &alone } else { &both };
        admitted += u32::from(limiter.check_now("k", 1).unwrap().unwrap().allowed());
    }
    assert_eq!(admitted, 6, "one count of 6 across both paths");
}

#[tokio::test]
async fn memory_stays_within_the_key_bound() {
    let clock = ManualClock::new(Timestamp::from_secs(1_000));
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .max_keys(1_000)
        .shards(8)
        .build();
    let l = Limiter::new(backend.clone(), Quota::gcra(5, 60 * SEC).build().unwrap());
    for i in 0..20_000 {
        l.check(&format!("client-{i}"), 1).await.unwrap();
        assert!(backend.len() <= backend.capacity());
    }
    assert!(
        backend.len() >= 900,
        "evicts one at a time, not whole shards"
    );
}

/// 20 000 new API keys on one route used to evict the
/// login limit of a client who had spent it, so the client got a fresh one.
#[tokio::test]
async fn a_flood_of_keys_on_one_limit_does_not_reset_another() {
    let clock = ManualClock::new(Timestamp::from_secs(1_000));
    let backend = MemoryBackend::builder()
        .clock(clock.clone())
        .max_keys(1_000)
        .build();
    let login = Limiter::new(
        backend.clone(),
        QuotaSet::new("login", [Quota::sliding_log(3, 60 * SEC).build().unwrap()]).unwrap(),
    );
    let api = Limiter::new(
        backend.clone(),
        QuotaSet::new(
            "api",
            [Quota::fixed_window(1_000, 86_400 * SEC).build().unwrap()],
        )
        .unwrap(),
    );
    // A few clients use their logins, one of them all of it.
    for user in 0..20 {
        login.check(&format!("user-{user}"), 1).await.unwrap();
    }
    for _ in 0..2 {
        login.check("user-0", 1).await.unwrap();
    }
    assert!(!login.check("user-0", 1).await.unwrap().allowed());
    for i in 0..20_000 {
        clock.advance(Duration::from_micros(20));
        api.check(&format!("key-{i}"), 1).await.unwrap();
        assert!(backend.len() <= backend.capacity());
    }
    assert!(
        !login.check("user-0", 1).await.unwrap().allowed(),
        "the flood reset user-0's login limit"
    );
}

#[tokio::test]
async fn expired_state_is_reclaimed_without_a_cleanup_task() {
    let clock = ManualClock::new(Timestamp::from_secs(1_000));
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    let l = Limiter::new(backend.clone(), Quota::gcra(5, 10 * SEC).build().unwrap());
    for i in 0..5_000 {
        l.check(&format!("client-{i}"), 1).await.unwrap();
    }
    assert_eq!(backend.len(), 5_000);
    clock.advance(11 * SEC);
    // New traffic sweeps each shard it lands in.
    for i in 0..5_000 {
        l.check(&format!("later-{i}"), 1).await.unwrap();
    }
    assert_eq!(backend.len(), 5_000, "the first 5 000 states were swept");
}

#[tokio::test]
async fn a_shadow_quota_neither_lengthens_retry_after_nor_counts_as_violated() {
    let set = QuotaSet::new(
        "api",
        [
            Quota::fixed_window(1, 10 * SEC)
                .name("enforced")
                .build()
                .unwrap(),
            Quota::fixed_window(1, 60 * SEC)
                .name("trial")
                .mode(Mode::Shadow)
                .build()
                .unwrap(),
        ],
    )
    .unwrap();
    let (l, _) = limiter(set);
    assert!(allowed(&l, "k").await);
    let d = l.check("k", 1).await.unwrap();
    assert!(!d.allowed());
    assert_eq!(
        d.retry_after(),
        Some(10 * SEC),
        "the shadow quota's 60 s does not count"
    );
    assert_eq!(d.violated().collect::<Vec<_>>(), [0]);
    assert!(d.quotas()[1].shadow() && !d.quotas()[1].allowed());
    assert_eq!(d.quotas()[1].retry_after(), Some(60 * SEC));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_keys_at_once_stay_within_the_memory_bound() {
    let backend = MemoryBackend::builder().max_keys(2_000).shards(16).build();
    let l = Limiter::new(backend.clone(), Quota::gcra(5, 60 * SEC).build().unwrap());
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let l = l.clone();
            tokio::spawn(async move {
                for i in 0..5_000 {
                    l.check(&format!("task-{t}-client-{i}"), 1).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        backend.len() <= backend.capacity(),
        "{} > {}",
        backend.len(),
        backend.capacity()
    );
    assert!(backend.len() >= backend.capacity() * 9 / 10);
}

#[tokio::test]
async fn two_limiters_built_from_one_quota_count_apart() {
    // One backend, one quota, two routes: each limiter spends its own
    // counter, not the other's.
    let backend = MemoryBackend::new();
    let quota = Quota::gcra(2, 60 * SEC).build().unwrap();
    let login = Limiter::new(backend.clone(), quota.clone());
    let search = Limiter::new(backend.clone(), QuotaSet::single(quota));
    for _ in 0..2 {
        assert!(login.check("ip:192.0.2.7", 1).await.unwrap().allowed());
    }
    assert!(!login.check("ip:192.0.2.7", 1).await.unwrap().allowed());
    for _ in 0..2 {
        assert!(search.check("ip:192.0.2.7", 1).await.unwrap().allowed());
    }
    assert!(!search.check("ip:192.0.2.7", 1).await.unwrap().allowed());
    // A clone of a limiter is the same limiter.
    assert!(
        !login
            .clone()
            .check("ip:192.0.2.7", 1)
            .await
            .unwrap()
            .allowed()
    );
}

#[tokio::test]
async fn limiters_of_sets_of_one_name_share_counters_and_of_two_names_do_not() {
    let backend = MemoryBackend::new();
    let set =
        |name: &str| QuotaSet::new(name, [Quota::gcra(2, 60 * SEC).build().unwrap()]).unwrap();
    let a = Limiter::new(backend.clone(), set("api"));
    let b = Limiter::new(backend.clone(), set("api"));
    let other = Limiter::new(backend.clone(), set("admin"));
    assert!(a.check("k", 1).await.unwrap().allowed());
    assert!(b.check("k", 1).await.unwrap().allowed());
    assert!(!a.check("k", 1).await.unwrap().allowed());
    assert!(other.check("k", 1).await.unwrap().allowed());
}

#[test]
fn a_quota_alone_in_a_named_set_shows_the_set_name_unless_it_has_its_own() {
    let q = || Quota::gcra(5, 10 * SEC);
    let app = QuotaSet::new("app", [q().build().unwrap()]).unwrap();
    assert_eq!(app.quotas()[0].name(), "app");
    let named = QuotaSet::new("app", [q().name("burst").build().unwrap()]).unwrap();
    assert_eq!(named.quotas()[0].name(), "burst");
    // Several quotas keep their own names: they must stay distinct.
    let two = QuotaSet::new(
        "app",
        [
            q().build().unwrap(),
            Quota::min_interval(SEC).build().unwrap(),
        ],
    )
    .unwrap();
    assert_eq!(two.quotas()[0].name(), "5-per-10s");
    assert_eq!(two.quotas()[1].name(), "min-interval-1s");
    // A set name that cannot be sent in a header leaves the quota's own.
    let long = QuotaSet::new("x".repeat(65), [q().build().unwrap()]).unwrap();
    assert_eq!(long.quotas()[0].name(), "5-per-10s");
    // Without a set name, the set is called by its quota's.
    let alone = QuotaSet::single(q().build().unwrap());
    assert_eq!((alone.name(), alone.is_named()), ("5-per-10s", false));
}

#[cfg(feature = "redis")]
#[test]
fn redis_refuses_a_quota_without_a_set_name() {
    // No server needed: the refusal comes when the limiter is built.
    let backend = tollgate::RedisBackend::from_url("redis://127.0.0.1:1")
        .build()
        .unwrap();
    let quota = Quota::gcra(2, 60 * SEC).build().unwrap();
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Limiter::new(backend.clone(), quota.clone())
    }));
    let message = built.expect_err("an unnamed set on Redis is refused");
    let message = message
        .downcast_ref::<String>()
        .expect("a formatted message");
    assert!(message.contains("QuotaSet::new"), "{message}");
    assert!(message.contains("2-per-60s"), "{message}");
    // Named, it is accepted.
    let _ = Limiter::new(backend, QuotaSet::new("login", [quota]).unwrap());
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn on_redis_sets_of_one_name_share_counters_across_servers_and_of_two_do_not() {
    let server = redis_support::RedisServer::start();
    // Two backends stand for two servers of a fleet.
    let fleet = || {
        tollgate::RedisBackend::from_url(server.url())
            .build()
            .unwrap()
    };
    let set =
        |name: &str| QuotaSet::new(name, [Quota::gcra(2, 60 * SEC).build().unwrap()]).unwrap();
    let one = Limiter::new(fleet(), set("login"));
    let two = Limiter::new(fleet(), set("login"));
    let search = Limiter::new(fleet(), set("search"));
    assert!(one.check("k", 1).await.unwrap().allowed());
    assert!(two.check("k", 1).await.unwrap().allowed());
    assert!(!one.check("k", 1).await.unwrap().allowed());
    assert!(!two.check("k", 1).await.unwrap().allowed());
    assert!(search.check("k", 1).await.unwrap().allowed());
}

/// The spans of decisions a subscriber saw: each one's fields, as text.
#[derive(Clone, Default)]
struct Spans(std::sync::Arc<std::sync::Mutex<SpansSeen>>);

/// Each span's fields in the order opened, and where each live span's id
/// points (ids are reused once a span closes).
#[derive(Default)]
struct SpansSeen {
    fields: Vec<Vec<(String, String)>>,
    ids: std::collections::HashMap<u64, usize>,
}

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = vec![("name".to_owned(), attrs.metadata().name().to_owned())];
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        let index = spans.fields.len();
        spans.ids.insert(id.into_u64(), index);
        spans.fields.push(fields);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut spans = self.0.lock().unwrap();
        let index = spans.ids[&id.into_u64()];
        values.record(&mut Fields(&mut spans.fields[index]));
    }
}

fn field<'a>(span: &'a [(String, String)], name: &str) -> &'a str {
    span.iter()
        .rev()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}

#[test]
fn each_decision_has_a_span_with_its_set_key_hash_and_outcome() {
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    // The process's subscriber, not one for this thread: a callsite first
    // reached by another test, with no subscriber, would stay disabled.
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    {
        runtime.block_on(async {
            let set =
                QuotaSet::new("span-test", [Quota::gcra(1, 60 * SEC).build().unwrap()]).unwrap();
            let l = Limiter::new(MemoryBackend::new(), set);
            // Decided at once, then awaited, then a cost that can never pass.
            assert!(l.check_now("secret-api-key", 1).unwrap().unwrap().allowed());
            assert!(!l.check("secret-api-key", 1).await.unwrap().allowed());
            assert!(l.check("other", 5).await.is_err());
        })
    }
    // Other tests run at the same time: only this one's set counts.
    let seen = spans.0.lock().unwrap();
    let spans: Vec<_> = (seen.fields.iter())
        .filter(|span| field(span, "set") == "span-test")
        .collect();
    assert_eq!(spans.len(), 3);
    for (span, outcome) in spans.iter().zip(["allowed", "refused", "errored"]) {
        assert_eq!(field(span, "name"), "tollgate.decision");
        assert_eq!(field(span, "backend"), "memory");
        assert_eq!(field(span, "outcome"), outcome, "{span:?}");
        assert_eq!(field(span, "key_hash").len(), 16, "{span:?}");
        assert!(
            span.iter().all(|(_, v)| !v.contains("secret")),
            "the key itself is never in a span: {span:?}"
        );
    }
    assert_eq!(field(spans[0], "key_hash"), field(spans[1], "key_hash"));
    assert_ne!(field(spans[0], "key_hash"), field(spans[2], "key_hash"));
}

#[tokio::test]
async fn a_backend_chosen_by_url_decides_as_the_one_it_names() {
    use tollgate::Backend;
    use tollgate::backend::AnyBackend;
    let memory = AnyBackend::from_url("memory://").unwrap();
    assert_eq!((memory.name(), memory.shared()), ("memory", false));
    let l = Limiter::new(memory, Quota::gcra(1, 60 * SEC).build().unwrap());
    assert!(l.check_now("k", 1).unwrap().unwrap().allowed());
    assert!(!l.check("k", 1).await.unwrap().allowed());
    for url in [
        "http://example.com",
        "no scheme",
        "mysql://user:secret@host/db",
    ] {
        let error = AnyBackend::from_url(url).unwrap_err().to_string();
        assert!(error.contains("memory://"), "{error}");
        assert!(
            !error.contains("secret"),
            "the URL may hold a password: {error}"
        );
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_redis_url_makes_a_backend_a_fleet_shares() {
    use tollgate::Backend;
    use tollgate::backend::AnyBackend;
    let server = redis_support::RedisServer::start();
    let (a, b) = (
        AnyBackend::from_url(&server.url()).unwrap(),
        AnyBackend::from_url(&server.url()).unwrap(),
    );
    assert_eq!((a.name(), a.shared()), ("redis", true));
    let set = || QuotaSet::new("login", [Quota::gcra(1, 60 * SEC).build().unwrap()]).unwrap();
    let (la, lb) = (Limiter::new(a, set()), Limiter::new(b, set()));
    assert!(la.check("k", 1).await.unwrap().allowed());
    assert!(!lb.check("k", 1).await.unwrap().allowed());
}
