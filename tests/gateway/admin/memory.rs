//! The admin API on one gateway in memory: reset, inspect, overrides,
//! blocks, the penalty box and the top offenders.

use http::{Method, StatusCode};
use support::gateway::RulesFile;

use super::{RULES, TOKEN, call, request, start};
use crate::support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_reset_inspect_overrides_blocks_and_the_penalty_box_work_through_the_gateway() {
    let rules = RulesFile::new("admin-memory", RULES);
    let a = start(&rules, "memory", &["--log-raw-keys"]);
    let t = Some(TOKEN);
    for _ in 0..3 {
        assert_eq!(request(&a.gw, "/x", "k1").await.status, StatusCode::OK);
    }
    assert_eq!(
        request(&a.gw, "/x", "k1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Inspect: nothing left, spending nothing.
    let seen = call(Method::GET, &a.url("/v1/rules/api/keys/k1"), t, None)
        .await
        .json();
    assert_eq!(seen["key"], "key:k1");
    assert_eq!(seen["quotas"][0]["name"], "hourly");
    assert_eq!(seen["quotas"][0]["remaining"], 0);
    assert!(seen["quotas"][0]["retry_after_ms"].as_u64().unwrap() > 0);
    // Reset: a full quota again.
    let r = call(Method::DELETE, &a.url("/v1/rules/api/keys/k1"), t, None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let seen = call(Method::GET, &a.url("/v1/rules/api/keys/key%3Ak1"), t, None)
        .await
        .json();
    assert_eq!(seen["quotas"][0]["remaining"], 3);
    assert_eq!(request(&a.gw, "/x", "k1").await.status, StatusCode::OK);

    // An override: k2 gets one request an hour; deleting it restores the rule's.
    let body = r#"{"quotas": [{"algorithm": "fixed_window", "limit": 1, "period": "1h"}], "expires_in": "1d"}"#;
    let o = call(
        Method::PUT,
        &a.url("/v1/rules/api/overrides/k2"),
        t,
        Some(body),
    )
    .await;
    assert_eq!(o.status, StatusCode::OK, "{}", o.body);
    assert_eq!(o.json()["quotas"][0]["limit"], 1);
    assert!(o.json()["expires_at_ms"].as_u64().is_some());
    assert_eq!(request(&a.gw, "/x", "k2").await.status, StatusCode::OK);
    assert_eq!(
        request(&a.gw, "/x", "k2").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let list = call(Method::GET, &a.url("/v1/rules/api/overrides"), t, None)
        .await
        .json();
    assert_eq!(list["overrides"][0]["key"], "key:k2");
    let d = call(
        Method::DELETE,
        &a.url("/v1/rules/api/overrides/k2"),
        t,
        None,
    )
    .await;
    assert_eq!(d.status, StatusCode::NO_CONTENT);
    assert_eq!(request(&a.gw, "/x", "k2").await.status, StatusCode::OK);
    let gone = call(Method::GET, &a.url("/v1/rules/api/overrides/k2"), t, None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.headers["content-type"], "application/problem+json");
    // A bad override is refused with the parser's reason.
    let bad = r#"{"quotas": [{"algorithm": "fixed_window", "limit": 1, "period": "soon"}]}"#;
    let b = call(
        Method::PUT,
        &a.url("/v1/rules/api/overrides/k2"),
        t,
        Some(bad),
    )
    .await;
    assert_eq!(b.status, StatusCode::BAD_REQUEST, "{}", b.body);
    assert!(b.body.contains("soon"), "{}", b.body);

    // A block: 429 with its Retry-After; lifting it restores service.
    let blk = call(
        Method::PUT,
        &a.url("/v1/rules/api/blocks/k3"),
        t,
        Some(r#"{"for": "15m"}"#),
    )
    .await;
    assert_eq!(blk.status, StatusCode::OK, "{}", blk.body);
    let refused = request(&a.gw, "/x", "k3").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((890..=900).contains(&retry), "{retry}");
    let lift = call(Method::DELETE, &a.url("/v1/rules/api/blocks/k3"), t, None).await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT);
    assert_eq!(request(&a.gw, "/x", "k3").await.status, StatusCode::OK);

    // The penalty box: 1 an hour, 2 refusals within a minute block for two
    // hours.
    assert_eq!(request(&a.gw, "/login", "p1").await.status, StatusCode::OK);
    assert_eq!(
        request(&a.gw, "/login", "p1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        request(&a.gw, "/login", "p1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let boxed = request(&a.gw, "/login", "p1").await;
    assert_eq!(boxed.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = boxed.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        retry > 3_600,
        "the block's Retry-After, not the window's: {retry}"
    );
    let seen = call(Method::GET, &a.url("/v1/rules/login/keys/p1"), t, None)
        .await
        .json();
    assert_eq!(seen["blocked"]["penalty"], true, "{seen}");
    let lift = call(Method::DELETE, &a.url("/v1/rules/login/blocks/p1"), t, None).await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT);
    // Lifted, the key meets its quota again (spent, so the window's wait);
    // reset, it is served.
    let after = request(&a.gw, "/login", "p1").await;
    assert_eq!(after.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = after.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry <= 3_600, "{retry}");
    let r = call(Method::DELETE, &a.url("/v1/rules/login/keys/p1"), t, None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(request(&a.gw, "/login", "p1").await.status, StatusCode::OK);

    // Top offenders, raw keys as asked (--log-raw-keys).
    for _ in 0..20 {
        request(&a.gw, "/x", "heavy").await;
    }
    let top = call(Method::GET, &a.url("/v1/rules/api/top?n=1"), t, None)
        .await
        .json();
    assert_eq!(top["keys_shown"], "raw");
    assert_eq!(top["refused"]["keys"][0]["key"], "key:heavy", "{top}");
    assert_eq!(top["refused"]["keys"].as_array().unwrap().len(), 1);
    let bad_n = call(Method::GET, &a.url("/v1/rules/api/top?n=0"), t, None).await;
    assert_eq!(bad_n.status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_offenders_show_hashed_keys_unless_raw_keys_are_asked_for() {
    let rules = RulesFile::new("admin-top", RULES);
    let a = start(&rules, "top", &["--metrics-listen", "127.0.0.1:0"]);
    for _ in 0..6 {
        request(&a.gw, "/x", "sk_live_heavy").await;
    }
    let top = call(Method::GET, &a.url("/v1/rules/api/top"), Some(TOKEN), None).await;
    assert_eq!(top.status, StatusCode::OK);
    let json = top.json();
    assert_eq!(json["keys_shown"], "hashed");
    assert_eq!(json["refused"]["keys"][0]["count"], 3, "{json}");
    assert_eq!(json["admitted"]["keys"][0]["count"], 3, "{json}");
    assert!(!top.body.contains("sk_live_heavy"), "{}", top.body);
    // The gauge of the heaviest keys' counts, set by the call, labels
    // bounded (rule, kind, rank; never a key).
    let scraped = call(
        Method::GET,
        &format!("http://{}/metrics", a.gw.metrics_addr()),
        None,
        None,
    )
    .await;
    let line = (scraped.body.lines())
        .find(|l| {
            l.starts_with("tollgate_top_key_decisions{")
                && l.contains("rule=\"api\"")
                && l.contains("of=\"refused\"")
                && l.contains("rank=\"1\"")
        })
        .unwrap_or_else(|| panic!("no gauge in {}", scraped.body));
    assert!(line.ends_with(" 3"), "{line}");
    assert!(!scraped.body.contains("sk_live_heavy"));
}

/// Blocks `given` (percent-encoded) on `rule` through the admin API, checks
/// that the block is stored under `built` and refuses GET /x, lifts it,
/// and checks GET /x passes again.
async fn blocked_as(a: &super::Admin, rule: &str, given: &str, built: &str) {
    let t = Some(TOKEN);
    let path = format!("/v1/rules/{rule}/blocks/{given}");
    let blk = call(Method::PUT, &a.url(&path), t, Some(r#"{"for": "15m"}"#)).await;
    assert_eq!(blk.status, StatusCode::OK, "{given}: {}", blk.body);
    assert_eq!(blk.json()["key"], built, "{given}");
    assert_eq!(
        request(&a.gw, "/x", "any").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{given}"
    );
    let lift = call(Method::DELETE, &a.url(&path), t, None).await;
    assert_eq!(lift.status, StatusCode::NO_CONTENT, "{given}");
    assert_eq!(request(&a.gw, "/x", "any").await.status, StatusCode::OK);
}

/// A block on an address rule, given as a dual-stack server's log writes
/// an IPv4 client (`::ffff:127.0.0.1`), is the client's key: it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_given_as_a_mapped_address_applies_to_the_ipv4_client() {
    let rules = RulesFile::new(
        "admin-mapped",
        "rules:\n  - name: by-ip\n    key: peer_ip\n    quotas: [{ name: q, algorithm: gcra, limit: 100, period: 1m }]\n",
    );
    let a = start(&rules, "mapped", &[]);
    assert_eq!(request(&a.gw, "/x", "any").await.status, StatusCode::OK);
    for given in ["%3A%3Affff%3A127.0.0.1", "ip%3A%3A%3Affff%3A127.0.0.1"] {
        blocked_as(&a, "by-ip", given, "ip:127.0.0.1").await;
    }
    let bad = call(
        Method::PUT,
        &a.url("/v1/rules/by-ip/blocks/ip%3Anot-an-address"),
        Some(TOKEN),
        Some(r#"{"for": "15m"}"#),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);
}

/// A block on a route rule, given as an operator types it (`get /x`), is
/// the route's key (`route:GET /x`): it applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_given_as_a_route_in_lower_case_applies_to_the_route() {
    let rules = RulesFile::new(
        "admin-route",
        "rules:\n  - name: by-route\n    match: { path: /x }\n    key: route\n    quotas: [{ name: q, algorithm: gcra, limit: 100, period: 1m }]\n",
    );
    let a = start(&rules, "route", &[]);
    for given in ["get%20%2Fx", "route%3Aget%20%2Fx"] {
        blocked_as(&a, "by-route", given, "route:GET /x").await;
    }
}
