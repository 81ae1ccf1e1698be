//! Two gateways on one real Redis: a change made on one's admin API is
//! applied by the other within the stated bound.

use http::{Method, StatusCode};
use support::gateway::RulesFile;
use support::redis::RedisServer;

use super::{FLEET_BOUND, RULES, TOKEN, blocked, call, request, start, within};
use crate::support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_two_gateways_agree_on_overrides_resets_and_blocks_within_the_bound() {
    let redis = RedisServer::start();
    let url = redis.url();
    let rules = RulesFile::new("admin-redis", RULES);
    let a = start(&rules, "ra", &["--redis", &url]);
    let b = start(&rules, "rb", &["--redis", &url]);
    // Borrowed, so the polling closures' futures can hold them.
    let (a, b) = (&a, &b);
    let t = Some(TOKEN);

    // Reset returns a spent key to a full quota on both.
    for _ in 0..3 {
        assert_eq!(request(&a.gw, "/x", "r1").await.status, StatusCode::OK);
    }
    assert_eq!(
        request(&a.gw, "/x", "r1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        request(&b.gw, "/x", "r1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let r = call(Method::DELETE, &a.url("/v1/rules/api/keys/r1"), t, None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.body);
    // Both serve it again: B once its denial cache has heard of the reset.
    within(FLEET_BOUND, || async move {
        request(&b.gw, "/x", "r1").await.status == StatusCode::OK
    })
    .await;
    assert_eq!(request(&a.gw, "/x", "r1").await.status, StatusCode::OK);

    // An override set on A is applied by B within the bound.
    let body = r#"{"quotas": [{"algorithm": "fixed_window", "limit": 1, "period": "1h"}]}"#;
    let o = call(
        Method::PUT,
        &a.url("/v1/rules/api/overrides/r2"),
        t,
        Some(body),
    )
    .await;
    assert_eq!(o.status, StatusCode::OK, "{}", o.body);
    let took = within(FLEET_BOUND, || async move {
        let seen = call(Method::GET, &b.url("/v1/rules/api/keys/r2"), t, None)
            .await
            .json();
        seen["overridden"] == true
    })
    .await;
    assert!(took < FLEET_BOUND);
    assert_eq!(request(&b.gw, "/x", "r2").await.status, StatusCode::OK);
    assert_eq!(
        request(&b.gw, "/x", "r2").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Its counters are the fleet's: A refuses too.
    assert_eq!(
        request(&a.gw, "/x", "r2").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let listed = call(Method::GET, &b.url("/v1/rules/api/overrides/r2"), t, None).await;
    assert_eq!(listed.status, StatusCode::OK);

    // A block set on A answers 429 on both; lifting it restores service.
    // (B is watched through its admin API: requests would spend the key's
    // quota until the block arrives.)
    let blk = call(
        Method::PUT,
        &a.url("/v1/rules/api/blocks/r3"),
        t,
        Some(r#"{"for": "10m"}"#),
    )
    .await;
    assert_eq!(blk.status, StatusCode::OK, "{}", blk.body);
    assert_eq!(
        request(&a.gw, "/x", "r3").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    within(FLEET_BOUND, || async move {
        !blocked(b, "api", "r3").await.is_null()
    })
    .await;
    let refused = request(&b.gw, "/x", "r3").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (590..=600).contains(&retry),
        "the block's Retry-After: {retry}"
    );
    let lift = call(Method::DELETE, &b.url("/v1/rules/api/blocks/r3"), t, None).await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT, "{}", lift.body);
    assert_eq!(request(&b.gw, "/x", "r3").await.status, StatusCode::OK);
    within(FLEET_BOUND, || async move {
        blocked(a, "api", "r3").await.is_null()
    })
    .await;
    assert_eq!(request(&a.gw, "/x", "r3").await.status, StatusCode::OK);

    // A penalty block made on A holds on B.
    assert_eq!(request(&a.gw, "/login", "p9").await.status, StatusCode::OK);
    assert_eq!(
        request(&a.gw, "/login", "p9").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        request(&a.gw, "/login", "p9").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    within(FLEET_BOUND, || async move {
        blocked(b, "login", "p9").await["penalty"] == true
    })
    .await;
    let boxed = request(&b.gw, "/login", "p9").await;
    assert_eq!(boxed.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = boxed.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 3_600, "the block's Retry-After: {retry}");
}
