//! Draft-11's `RateLimit` fields through a real server, parsed with a real
//! RFC 9651 parser (`sfv`): `t` is the effective window for every algorithm,
//! never beyond `Retry-After` on a refusal, and `pk` hides the client key.

use crate::support;

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{HeaderName, StatusCode};
use sfv::{BareItem, List, ListEntry, Parser};
use support::{Reply, client, get as fetch, serve};
use tollgate::key::HeaderKey;
use tollgate::{
    Clock, HeaderStyle, Limiter, ManualClock, MemoryBackend, PartitionKey, Quota, QuotaSet,
    RateLimitLayer, Timestamp,
};

const SEC: Duration = Duration::from_secs(1);

/// One `RateLimit` item: name, `r`, `t` and `pk` (if any).
#[derive(Debug)]
struct Item {
    name: String,
    r: u64,
    t: u64,
    pk: Option<Vec<u8>>,
}

/// Parses every line of `name` as one RFC 9651 list.
fn list(reply: &Reply, name: &str) -> List {
    let lines: Vec<&str> = reply
        .headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    Parser::new(&lines.join(", "))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {lines:?}: {e}"))
}

fn items(reply: &Reply) -> Vec<Item> {
    list(reply, "ratelimit")
        .into_iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else {
                panic!("an inner list in RateLimit")
            };
            let param = |key: &str| {
                item.params
                    .iter()
                    .find(|(k, _)| k.as_str() == key)
                    .map(|(_, v)| v.clone())
            };
            let int = |key: &str| match param(key) {
                Some(BareItem::Integer(n)) => u64::try_from(i64::from(n)).unwrap(),
                other => panic!("{key}: {other:?}"),
            };
            Item {
                name: item.bare_item.as_string().unwrap().as_str().to_owned(),
                r: int("r"),
                t: int("t"),
                pk: param("pk").map(|v| v.as_byte_sequence().expect("pk is bytes").to_vec()),
            }
        })
        .collect()
}

/// The policy names `RateLimit-Policy` lists.
fn policies(reply: &Reply) -> Vec<String> {
    list(reply, "ratelimit-policy")
        .into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => item.bare_item.as_string().unwrap().as_str().to_owned(),
            ListEntry::InnerList(_) => panic!("an inner list in RateLimit-Policy"),
        })
        .collect()
}

fn retry_after(reply: &Reply) -> u64 {
    reply.header("retry-after").unwrap().parse().unwrap()
}

struct Fixture {
    limiter: Limiter<MemoryBackend<ManualClock>>,
    clock: ManualClock,
    addr: std::net::SocketAddr,
    client: support::HttpClient,
}

async fn fixture(quotas: impl Into<QuotaSet>) -> Fixture {
    // Just after a minute boundary, so fixed windows have known ends.
    let clock = ManualClock::new(Timestamp::from_secs(1_700_000_040));
    let backend = MemoryBackend::builder().clock(clock.clone()).build();
    let limiter = Limiter::new(backend, quotas);
    let layer = RateLimitLayer::new(
        limiter.clone(),
        HeaderKey::new(HeaderName::from_static("x-api-key")),
    );
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    Fixture {
        limiter,
        clock,
        addr,
        client: client(),
    }
}

impl Fixture {
    async fn get(&self) -> Reply {
        fetch(&self.client, self.addr, "/", &[("x-api-key", b"alice")]).await
    }

    /// What a look (cost 0) `secs` seconds on from now sees as remaining, the clock
    /// left where it was.
    async fn remaining_after(&self, secs: u64) -> u64 {
        let now = self.clock.now();
        self.clock.advance(Duration::from_secs(secs));
        let d = self.limiter.peek("key:alice", 0).await.unwrap();
        self.clock.set(now);
        d.remaining()
    }
}

/// Drives one quota to a refusal, checking at each response that `t` means
/// what draft-11 says: within `t` seconds no more than `r` becomes usable
/// (one second short of `t`, which is rounded up, a look sees at most
/// `r`), at `t` more is usable, and a refusal's `t` is its `Retry-After`.
async fn check_meaning(quota: Quota, steps: &[u64]) {
    let f = fixture(quota).await;
    let mut refused = false;
    for &step in steps {
        f.clock.advance(Duration::from_secs(step));
        let reply = f.get().await;
        let [item] = &items(&reply)[..] else {
            panic!("one quota, one item")
        };
        assert!(item.t >= 1, "{item:?}");
        assert!(f.remaining_after(item.t - 1).await <= item.r, "{item:?}");
        assert!(f.remaining_after(item.t).await > item.r, "{item:?}");
        if reply.status == StatusCode::TOO_MANY_REQUESTS {
            refused = true;
            assert_eq!(item.r, 0);
            assert_eq!(item.t, retry_after(&reply), "{item:?}");
        }
    }
    assert!(refused, "the steps must reach a refusal");
}

#[tokio::test]
async fn t_is_the_effective_window_for_every_algorithm() {
    let steps = [0, 0, 3, 0, 0, 0, 1, 0, 0];
    for quota in [
        Quota::gcra(6, 60 * SEC).burst(3),
        Quota::leaky_bucket(6, 60 * SEC).burst(1),
        Quota::token_bucket(6, 60 * SEC).burst(3),
        Quota::fixed_window(3, 60 * SEC),
        Quota::sliding_window(3, 60 * SEC),
        Quota::sliding_log(3, 60 * SEC),
    ] {
        check_meaning(quota.build().unwrap(), &steps).await;
    }
}

#[tokio::test]
async fn the_quickstart_case_t_agrees_with_retry_after() {
    // The quickstart's quota: 5 per 10 s, burst 5. Refused, it used to say
    // t=10 (until the bucket is full) with Retry-After: 2.
    let f = fixture(Quota::gcra(5, 10 * SEC).burst(5).build().unwrap()).await;
    for _ in 0..5 {
        assert_eq!(f.get().await.status, StatusCode::OK);
    }
    let refused = f.get().await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let item = &items(&refused)[0];
    assert_eq!((item.r, item.t), (0, 2));
    assert_eq!(retry_after(&refused), 2);
}

#[tokio::test]
async fn on_a_refusal_no_t_points_past_retry_after() {
    let set = QuotaSet::new(
        "api",
        [
            Quota::gcra(1, 2 * SEC).name("burst").build().unwrap(),
            Quota::fixed_window(100, 86_400 * SEC)
                .name("daily")
                .build()
                .unwrap(),
        ],
    )
    .unwrap();
    let f = fixture(set).await;
    let first = f.get().await;
    let daily = &items(&first)[1];
    assert_eq!(daily.name, "daily");
    assert!(
        daily.t > 3600,
        "admitted: the daily window's end, {daily:?}"
    );
    let refused = f.get().await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let wait = retry_after(&refused);
    assert_eq!(wait, 2);
    for item in items(&refused) {
        assert!(item.t <= wait, "{item:?}");
    }
    // RateLimit-Policy parses too, and names the same policies.
    assert_eq!(policies(&refused), ["burst", "daily"]);
}

#[tokio::test]
async fn pk_is_a_keyed_hash_never_the_key() {
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(10, 60 * SEC).build().unwrap(),
    );
    let key = HeaderKey::new(HeaderName::from_static("x-api-key"));
    let app = |pk: PartitionKey| {
        let layer = RateLimitLayer::builder(limiter.clone(), key.clone())
            .partition_key(pk)
            .build();
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer)
    };
    let shared = serve(app(PartitionKey::with_secret([7; 16]))).await;
    let same_secret = serve(app(PartitionKey::with_secret([7; 16]))).await;
    let random = serve(app(PartitionKey::random())).await;
    let c = client();
    let pk = |reply: Reply| items(&reply)[0].pk.clone().expect("pk sent");
    let alice = pk(fetch(&c, shared, "/", &[("x-api-key", b"alice")]).await);
    assert_eq!(alice.len(), 16);
    assert!(!alice.windows(5).any(|w| w == b"alice"));
    assert_eq!(
        alice,
        pk(fetch(&c, same_secret, "/", &[("x-api-key", b"alice")]).await)
    );
    assert_ne!(
        alice,
        pk(fetch(&c, shared, "/", &[("x-api-key", b"bob")]).await)
    );
    assert_ne!(
        alice,
        pk(fetch(&c, random, "/", &[("x-api-key", b"alice")]).await)
    );
}

#[tokio::test]
async fn draft6_and_legacy_keep_the_time_to_full_restore() {
    for (style, reset) in [
        (HeaderStyle::Draft6, "ratelimit-reset"),
        (HeaderStyle::Legacy, "x-ratelimit-reset"),
    ] {
        let limiter = Limiter::new(
            MemoryBackend::new(),
            Quota::gcra(6, 60 * SEC).burst(3).build().unwrap(),
        );
        let layer = RateLimitLayer::builder(
            limiter,
            HeaderKey::new(HeaderName::from_static("x-api-key")),
        )
        .header_style(style)
        .build();
        let addr = serve(
            Router::new()
                .route("/", get(|| async { "ok" }))
                .layer(layer),
        )
        .await;
        let c = client();
        fetch(&c, addr, "/", &[("x-api-key", b"a")]).await;
        let second = fetch(&c, addr, "/", &[("x-api-key", b"a")]).await;
        // Two spent, ten seconds each to return: full in 20 s (the next
        // unit would be 10 s).
        let secs: u64 = second.header(reset).unwrap().parse().unwrap();
        assert!((19..=20).contains(&secs), "{style:?}: {secs}");
    }
}

#[cfg(feature = "rules")]
#[tokio::test]
async fn a_rules_file_sends_the_same_pk_for_the_same_secret() {
    let rules = tollgate::rules::Rules::parse(
        r#"
partition_key: "07070707070707070707070707070707"
rules:
  - name: api
    key: header:x-api-key
    quotas:
      - { algorithm: gcra, limit: 10, period: 1m }
"#,
    )
    .unwrap();
    let by_rules = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::from_policy(rules)),
    )
    .await;
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(10, 60 * SEC).build().unwrap(),
    );
    let layer = RateLimitLayer::builder(
        limiter,
        HeaderKey::new(HeaderName::from_static("x-api-key")),
    )
    .partition_key(PartitionKey::with_secret([7; 16]))
    .build();
    let by_builder = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = client();
    let pk = |reply: Reply| items(&reply)[0].pk.clone().expect("pk sent");
    assert_eq!(
        pk(fetch(&c, by_rules, "/", &[("x-api-key", b"alice")]).await),
        pk(fetch(&c, by_builder, "/", &[("x-api-key", b"alice")]).await)
    );
    for bad in ["\"0707\"", "\"zz070707070707070707070707070707\""] {
        let file = format!(
            "partition_key: {bad}\nrules:\n  - name: x\n    key: global\n    quotas:\n      - {{ algorithm: gcra, limit: 1, period: 1s }}\n"
        );
        assert!(tollgate::rules::Rules::parse(&file).is_err(), "{bad}");
    }
}

#[tokio::test]
async fn a_queued_429_has_no_t_past_its_retry_after() {
    // A queue of 3 draining one per 20 s, and a daily quota: the second
    // request would wait 20 s; answered 429 at once instead, no t (the
    // daily one would say hours) may exceed that.
    let set = QuotaSet::new(
        "queued",
        [
            Quota::leaky_bucket(3, 60 * SEC)
                .name("queue")
                .build()
                .unwrap(),
            Quota::fixed_window(1000, 86_400 * SEC)
                .name("daily")
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
    .on_delay(tollgate::OnDelay::Reject)
    .build();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let c = client();
    assert_eq!(
        fetch(&c, addr, "/", &[("x-api-key", b"a")]).await.status,
        StatusCode::OK
    );
    let queued = fetch(&c, addr, "/", &[("x-api-key", b"a")]).await;
    assert_eq!(queued.status, StatusCode::TOO_MANY_REQUESTS);
    let wait = retry_after(&queued);
    assert!((19..=20).contains(&wait), "{wait}");
    for item in items(&queued) {
        assert!(item.t <= wait, "{item:?}");
    }
}

/// Two layers on one route: the IETF lists carry both layers' policies
/// (the outer one's appended), and the single-value styles show the outer
/// layer's numbers only.
#[tokio::test]
async fn nested_layers_append_their_policies_and_single_values_are_the_outer_ones() {
    let key = || HeaderKey::new(HeaderName::from_static("x-api-key"));
    let limiter = |name: &str, limit: u64| {
        let quota = Quota::gcra(limit, 60 * SEC).name(name).build().unwrap();
        Limiter::new(MemoryBackend::new(), quota)
    };
    let nested = |style: HeaderStyle| {
        let inner = RateLimitLayer::builder(limiter("route", 5), key())
            .header_style(style)
            .build();
        let outer = RateLimitLayer::builder(limiter("global", 100), key())
            .header_style(style)
            .build();
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(inner)
            .layer(outer)
    };
    let c = client();
    let ietf = serve(nested(HeaderStyle::Ietf)).await;
    let reply = fetch(&c, ietf, "/", &[("x-api-key", b"alice")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let seen: Vec<(String, u64)> = items(&reply).into_iter().map(|i| (i.name, i.r)).collect();
    assert_eq!(
        seen,
        [("route".to_owned(), 4), ("global".to_owned(), 99)],
        "inner first, outer appended"
    );
    assert_eq!(policies(&reply), ["route", "global"]);

    let legacy = serve(nested(HeaderStyle::Legacy)).await;
    let reply = fetch(&c, legacy, "/", &[("x-api-key", b"alice")]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.headers.get_all("x-ratelimit-limit").iter().count(), 1);
    assert_eq!(reply.header("x-ratelimit-limit"), Some("100"));
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("99"));
}
