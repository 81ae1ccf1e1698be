//! Concurrency slots shared through a real Redis.

use super::load::{elastic_rate, elastic_rate_trace};
use super::redis_support::RedisServer;
use super::*;
use tollgate::backend::{Acquired, RedisSlots, Slot, SlotStore};

async fn take(slots: &RedisSlots, key: &str, limit: u64) -> Acquired {
    slots.acquire(key, limit).await.unwrap()
}

fn granted(a: Acquired) -> Slot {
    match a {
        Acquired::Granted { slot, .. } => slot,
        Acquired::Full { in_use } => panic!("full at {in_use}"),
    }
}

#[tokio::test]
async fn two_servers_share_one_limit_through_the_layer() {
    let redis = RedisServer::start();
    let gate = Gate::default();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        // Generous timeouts: a slow first connection on a busy machine
        // must not let a request through unlimited.
        let slots = RedisSlots::from_url(&redis.url(), "t:")
            .unwrap()
            .timeout(BOUND);
        let quota = ConcurrencyQuota::new(2).unwrap().store(slots);
        let layer = builder()
            .concurrency(quota)
            .timeout(BOUND)
            .on_backend_error(tollgate::OnBackendError::Reject)
            .build();
        addrs.push(server(&gate, layer).await);
    }
    let c = client();
    let a1 = hold(&c, addrs[0], &gate, "/held", "a").await;
    let a2 = hold(&c, addrs[1], &gate, "/held", "a").await;
    for &addr in &addrs {
        assert_concurrency_refusal(&send(&c, addr, "/", "a").await, "concurrent");
    }
    assert_eq!(send(&c, addrs[0], "/", "b").await.status, StatusCode::OK);
    gate.open(2);
    assert_eq!(finish(vec![a1, a2]).await, [StatusCode::OK; 2]);
    // Given back by a task after the response: bounded wait.
    until_ok(&c, addrs[1], "a").await;
}

#[tokio::test]
async fn an_elastic_rate_quota_on_redis_admits_over_its_limit_only_while_idle() {
    let redis = RedisServer::start();
    let backend = tollgate::RedisBackend::from_url(redis.url())
        .timeout(BOUND)
        .build()
        .unwrap();
    let gate = Gate::default();
    let load = MeasuredLoad::new(4, Duration::from_secs(60));
    let layer = elastic_rate(backend).measure_load(load.clone()).build();
    let addr = server(&gate, layer).await;
    elastic_rate_trace(&gate, addr, &load).await;
}

/// Two servers built from one rules file on one Redis: the rule's
/// concurrency limit is the fleet's, and both decide on the async path
/// (a Redis backend without leases cannot decide without waiting).
#[cfg(feature = "rules")]
#[tokio::test]
async fn two_rules_servers_share_one_concurrency_limit_in_redis() {
    let redis = RedisServer::start();
    let text = format!(
        "backend: {{ redis: {{ url: \"{}\", timeout: 5s }} }}\n\
         on_backend_error: reject\n\
         timeout: 5s\n\
         rules:\n  - name: held\n    key: header:x-key\n    quotas: [{{ algorithm: gcra, limit: 1000, period: 1s }}]\n    concurrency: {{ limit: 2 }}\n",
        redis.url()
    );
    let gate = Gate::default();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let rules = tollgate::rules::Rules::parse(&text).unwrap();
        addrs.push(server(&gate, RateLimitLayer::from_policy(rules)).await);
    }
    let c = client();
    let a1 = hold(&c, addrs[0], &gate, "/held", "a").await;
    let a2 = hold(&c, addrs[1], &gate, "/held", "a").await;
    for &addr in &addrs {
        assert_concurrency_refusal(&send(&c, addr, "/", "a").await, "concurrent");
    }
    assert_eq!(send(&c, addrs[1], "/", "b").await.status, StatusCode::OK);
    gate.open(2);
    assert_eq!(finish(vec![a1, a2]).await, [StatusCode::OK; 2]);
    until_ok(&c, addrs[0], "a").await;
}

#[tokio::test]
async fn a_dead_servers_slots_come_free_within_their_lifetime() {
    let redis = RedisServer::start();
    let lifetime = Duration::from_millis(300);
    let url = redis.url();
    // The server that dies: its own runtime, shut down with its slots
    // still held, so nothing gives them back or refreshes them.
    let taken = Instant::now();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let slots = RedisSlots::from_url(&url, "t:")
                .unwrap()
                .lifetime(lifetime)
                .timeout(BOUND);
            for _ in 0..2 {
                std::mem::forget(granted(take(&slots, "k", 2).await));
            }
        });
        drop(rt);
    })
    .join()
    .unwrap();

    let survivor = RedisSlots::from_url(&redis.url(), "t:")
        .unwrap()
        .lifetime(lifetime);
    assert!(matches!(
        take(&survivor, "k", 2).await,
        Acquired::Full { in_use: 2 }
    ));
    // A live holder keeps its slot past the lifetime by refreshing it.
    let kept = granted(take(&survivor, "live", 1).await);
    let slot = loop {
        match take(&survivor, "k", 2).await {
            Acquired::Granted { slot, .. } => break slot,
            Acquired::Full { .. } => {
                assert!(taken.elapsed() < lifetime * 3, "never freed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let freed = taken.elapsed();
    assert!(
        freed >= lifetime - Duration::from_millis(50),
        "freed early: {freed:?}"
    );
    tokio::time::sleep(lifetime).await;
    assert!(
        matches!(
            take(&survivor, "live", 1).await,
            Acquired::Full { in_use: 1 }
        ),
        "a refreshed slot outlives its lifetime"
    );
    drop((kept, slot));
}
