//! The reference's matching (nesting, overrides at each level, whitelisting,
//! wildcards, `replaces`, shadow and quota modes), its addends and
//! draft-11 fields, and tollgate's costs, over gRPC.

use serde_json::{Value, json};

use super::support::envoy::{Rls, grpc_calls};
use super::support::process::TempDir;
use super::{DAY, HOUR, call, code, limit, remaining};

/// The reference's configuration shapes, with day and hour units so that
/// no window ends during a test.
const REFERENCE: &str = r#"
domain: shop
descriptors:
  # A value with no limit, whose children have one: by key alone, and a
  # more specific one by key and value.
  - key: tenant
    value: acme
    descriptors:
      - key: plan
        rate_limit: { unit: hour, requests_per_unit: 5 }
      - key: plan
        value: gold
        rate_limit: { unit: hour, requests_per_unit: 10 }
  # A key alone, overridden for one value, whitelisted for another.
  - key: client
    rate_limit: { unit: day, requests_per_unit: 20 }
  - key: client
    value: partner
    rate_limit: { unit: day, requests_per_unit: 30 }
  - key: client
    value: internal
  # Blocked, unlimited, named, shadow, wildcards.
  - key: blocked
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: true }
  - key: legacy
    rate_limit: { name: legacy_limit, unit: day, requests_per_unit: 1 }
  - key: modern
    rate_limit:
      unit: day
      requests_per_unit: 50
      replaces: [{ name: legacy_limit }]
  - key: trial
    shadow_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: path
    value: /api/*
    rate_limit: { unit: day, requests_per_unit: 7 }
  - key: path
    value: /v*/users/*
    rate_limit: { unit: day, requests_per_unit: 8 }
  - key: tight
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: other
    rate_limit: { unit: day, requests_per_unit: 3 }
  - key: bucket
    value: shared-*
    share_threshold: true
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: bucket
    value: own-*
    rate_limit: { unit: day, requests_per_unit: 2 }
  - key: soft
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 1 }
  - key: roomy
    quota_mode: true
    rate_limit: { unit: day, requests_per_unit: 100 }
"#;

#[test]
fn reference_matching_over_grpc() {
    let dir = TempDir::new("matching");
    let config = dir.write("config.yaml", REFERENCE);
    let rls = Rls::start(&config, &["--algorithm", "fixed_window"]);
    let calls = vec![
        call("shop", &[("tenant", "acme"), ("plan", "silver")]),
        call("shop", &[("tenant", "acme"), ("plan", "gold")]),
        call("shop", &[("tenant", "acme")]),
        call(
            "shop",
            &[("tenant", "acme"), ("plan", "gold"), ("extra", "x")],
        ),
        call("shop", &[("client", "anyone")]),
        call("shop", &[("client", "partner")]),
        call("shop", &[("client", "internal")]),
        call("shop", &[("blocked", "x")]),
        call("shop", &[("free", "x")]),
        call("shop", &[("path", "/api/orders")]),
        call("shop", &[("path", "/v2/users/9")]),
        call("shop", &[("path", "/other")]),
        call("nowhere", &[("client", "x")]),
        json!({"domain": "", "descriptors": [{"entries": [["client", "x"]]}]}),
        json!({"domain": "shop", "descriptors": []}),
    ];
    let a = grpc_calls(rls.addr, &calls);
    // Key alone, then key and value, at the second level.
    assert_eq!(limit(&a[0], 0), Some((5, HOUR)), "{}", a[0]);
    assert_eq!(remaining(&a[0], 0), 4);
    assert_eq!(limit(&a[1], 0), Some((10, HOUR)));
    assert_eq!(remaining(&a[1], 0), 9);
    // A level with no limit, and a descriptor deeper than the tree: none.
    for i in [2, 3] {
        assert_eq!(code(&a[i], 0), "OK");
        assert_eq!(limit(&a[i], 0), None, "{}", a[i]);
    }
    assert_eq!(limit(&a[4], 0), Some((20, DAY)));
    assert_eq!(limit(&a[5], 0), Some((30, DAY)));
    assert_eq!(limit(&a[6], 0), None, "whitelisted value");
    assert_eq!(a[7]["overall"], "OVER_LIMIT", "requests_per_unit 0 blocks");
    assert_eq!(code(&a[7], 0), "OVER_LIMIT");
    assert_eq!(a[8]["overall"], "OK");
    assert_eq!(remaining(&a[8], 0), u64::from(u32::MAX), "unlimited");
    assert_eq!(limit(&a[8], 0), None);
    assert_eq!(limit(&a[9], 0), Some((7, DAY)), "trailing wildcard");
    assert_eq!(
        limit(&a[10], 0),
        Some((8, DAY)),
        "wildcards inside the value"
    );
    assert_eq!(limit(&a[11], 0), None, "no wildcard matches");
    assert_eq!(a[12]["overall"], "OK", "an unknown domain is not limited");
    assert_eq!(a[13]["error"], "INVALID_ARGUMENT");
    assert_eq!(a[14]["error"], "INVALID_ARGUMENT");
}

#[test]
fn wildcards_share_a_counter_only_with_share_threshold_and_quota_mode_refuses_only_together() {
    let dir = TempDir::new("share");
    let config = dir.write("config.yaml", REFERENCE);
    let rls = Rls::start(&config, &["--algorithm", "fixed_window"]);
    let soft_and_roomy = json!({"domain": "shop", "descriptors": [
        {"entries": [["soft", "s"]]}, {"entries": [["roomy", "r"]]}]});
    let calls = vec![
        call("shop", &[("bucket", "shared-a")]),
        call("shop", &[("bucket", "shared-b")]),
        call("shop", &[("bucket", "shared-c")]), // 2: the pattern's count is spent
        call("shop", &[("bucket", "own-a")]),
        call("shop", &[("bucket", "own-b")]),
        call("shop", &[("bucket", "own-c")]), // 5: each value counts alone
        call("shop", &[("soft", "s")]),
        soft_and_roomy, // 7: one quota-mode limit is over, not every one
        call("shop", &[("soft", "s")]), // 8: the only quota-mode limit, over
    ];
    let a = grpc_calls(rls.addr, &calls);
    assert_eq!(remaining(&a[1], 0), 0, "{}", a[1]);
    assert_eq!(a[2]["overall"], "OVER_LIMIT", "{}", a[2]);
    for answer in &a[3..6] {
        assert_eq!(remaining(answer, 0), 1, "{answer}");
    }
    assert_eq!(a[6]["overall"], "OK");
    assert_eq!(code(&a[7], 0), "OVER_LIMIT", "{}", a[7]);
    assert_eq!(code(&a[7], 1), "OK");
    assert_eq!(
        a[7]["overall"], "OK",
        "quota mode refuses only when every one is over"
    );
    assert_eq!(a[8]["overall"], "OVER_LIMIT", "{}", a[8]);
}

#[test]
fn limits_refuse_with_draft_11_fields_and_addends_as_the_reference() {
    let dir = TempDir::new("limits");
    let config = dir.write("config.yaml", REFERENCE);
    let rls = Rls::start(&config, &["--algorithm", "fixed_window"]);
    let tight = call("shop", &[("tight", "t")]);
    let mut zero = tight.clone();
    zero["descriptors"][0]["hits_addend"] = json!(0);
    let both = json!({"domain": "shop", "descriptors": [
        {"entries": [["other", "o"]]}, {"entries": [["tight", "t"]]}]});
    let override_limit = json!({"domain": "shop", "descriptors": [
        {"entries": [["anything", "a"]], "limit": [2, HOUR]}]});
    let calls = vec![
        zero.clone(),                    // 0: checks, spends nothing
        tight.clone(),                   // 1: 1 left
        tight.clone(),                   // 2: 0 left
        tight.clone(),                   // 3: over
        both.clone(),                    // 4: over, spends nothing
        call("shop", &[("other", "o")]), // 5: 2 left after
        json!({"domain": "shop", "hits_addend": 2, "descriptors": [{"entries": [["other", "p"]]}]}),
        override_limit.clone(),          // 7
        override_limit.clone(),          // 8
        override_limit,                  // 9: over
        call("shop", &[("trial", "x")]), // 10
        call("shop", &[("trial", "x")]), // 11: shadow: OK
        json!({"domain": "shop", "descriptors": [
            {"entries": [["legacy", "l"]]}, {"entries": [["modern", "m"]]}]}), // 12
        json!({"domain": "shop", "descriptors": [
            {"entries": [["legacy", "l"]]}, {"entries": [["modern", "m"]]}]}), // 13
    ];
    let a = grpc_calls(rls.addr, &calls);
    assert_eq!(
        remaining(&a[0], 0),
        2,
        "hits_addend 0 spends nothing: {}",
        a[0]
    );
    assert_eq!(remaining(&a[1], 0), 1);
    assert_eq!(remaining(&a[2], 0), 0);
    assert_eq!(a[2]["overall"], "OK");
    assert_eq!(a[3]["overall"], "OVER_LIMIT");
    assert_eq!(code(&a[3], 0), "OVER_LIMIT");
    let reset = a[3]["statuses"][0]["reset"].as_u64().unwrap();
    assert!((1..=86_400).contains(&reset), "reset {reset}");
    let headers = &a[3]["headers"];
    assert_eq!(headers["ratelimit-policy"], "\"shop.tight\";q=2;w=86400");
    assert!(
        headers["ratelimit"]
            .as_str()
            .unwrap()
            .starts_with("\"shop.tight\";r=0;t="),
        "{headers}"
    );
    let retry: u64 = headers["retry-after"].as_str().unwrap().parse().unwrap();
    assert!((1..=86_400).contains(&retry));
    // Both descriptors decided together: the refused call spent nothing.
    assert_eq!(a[4]["overall"], "OVER_LIMIT");
    assert_eq!(code(&a[4], 0), "OK");
    assert_eq!(code(&a[4], 1), "OVER_LIMIT");
    assert_eq!(
        remaining(&a[5], 0),
        2,
        "the refused call spent from none: {}",
        a[5]
    );
    assert_eq!(
        remaining(&a[6], 0),
        1,
        "the request's hits_addend: {}",
        a[6]
    );
    assert_eq!(limit(&a[7], 0), Some((2, HOUR)), "a request's own limit");
    assert_eq!(code(&a[8], 0), "OK");
    assert_eq!(code(&a[9], 0), "OVER_LIMIT");
    assert_eq!(code(&a[11], 0), "OK", "shadow mode never refuses");
    assert_eq!(a[11]["overall"], "OK");
    assert_eq!(remaining(&a[11], 0), 0);
    // `modern` replaces `legacy_limit`: the legacy limit of 1 a day is not
    // applied, twice.
    for i in [12, 13] {
        assert_eq!(a[i]["overall"], "OK", "{}", a[i]);
        assert_eq!(limit(&a[i], 0), None);
        assert_eq!(limit(&a[i], 1), Some((50, DAY)));
    }
}

/// tollgate's `cost:`: each hit spends `cost` units of `requests_per_unit`,
/// with Envoy's addends (the per-request cost, as an LLM gateway sends its
/// tokens) multiplying it.
const COSTS: &str = r#"
domain: api
descriptors:
  - key: user
    rate_limit: { unit: day, requests_per_unit: 10, cost: 3 }
  - key: model
    value: big
    rate_limit: { unit: day, requests_per_unit: 100, cost: 10, algorithm: token_bucket }
"#;

#[test]
fn costs_multiply_the_hits_of_every_addend() {
    let dir = TempDir::new("costs");
    let config = dir.write("config.yaml", COSTS);
    let rls = Rls::start(&config, &["--algorithm", "fixed_window"]);
    let user = |name: &str| call("api", &[("user", name)]);
    let with_request_hits = |name: &str, hits: u64| {
        let mut c = user(name);
        c["hits_addend"] = json!(hits);
        c
    };
    let with_descriptor_hits = |mut c: Value, hits: u64| {
        c["descriptors"][0]["hits_addend"] = json!(hits);
        c
    };
    let big = call("api", &[("model", "big")]);
    let calls = vec![
        user("u"),                                // 0: 3 of 10
        with_request_hits("u", 2),                // 1: 6 more, 1 left
        user("u"),                                // 2: 3 > 1: over
        with_descriptor_hits(user("u"), 0),       // 3: checks, spends nothing
        with_request_hits("v", 4),                // 4: 12 can never pass
        user("v"),                                // 5: 3 of 10
        with_descriptor_hits(user("w"), 1 << 62), // 6: no overflow, over
        with_descriptor_hits(big.clone(), 7),     // 7: 70 of 100
        with_descriptor_hits(big, 4),             // 8: 40 > 30: over
    ];
    let a = grpc_calls(rls.addr, &calls);
    assert_eq!(remaining(&a[0], 0), 7, "{}", a[0]);
    assert_eq!(limit(&a[0], 0), Some((10, DAY)), "the limit as written");
    assert_eq!(
        a[0]["headers"]["ratelimit-policy"],
        "\"api.user\";q=10;w=86400"
    );
    assert_eq!(remaining(&a[1], 0), 1, "{}", a[1]);
    assert_eq!(a[1]["overall"], "OK");
    assert_eq!(a[2]["overall"], "OVER_LIMIT", "{}", a[2]);
    assert_eq!(a[3]["overall"], "OK", "{}", a[3]);
    assert_eq!(remaining(&a[3], 0), 1, "the refused call spent nothing");
    assert_eq!(a[4]["overall"], "OVER_LIMIT", "{}", a[4]);
    assert_eq!(remaining(&a[5], 0), 7, "{}", a[5]);
    assert_eq!(a[6]["overall"], "OVER_LIMIT", "{}", a[6]);
    assert_eq!(a[7]["overall"], "OK", "{}", a[7]);
    assert_eq!(remaining(&a[7], 0), 30);
    assert_eq!(a[8]["overall"], "OVER_LIMIT", "{}", a[8]);
}
