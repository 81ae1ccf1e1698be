//! `tollgate rls`, Envoy's rate limit service: driven over gRPC by a client
//! that is not tollgate's (Python grpcio), and by a real Envoy with its HTTP
//! rate limit filter, on memory and on real Redis servers.

#![cfg(feature = "gateway")]

mod support;

/// A real Envoy in front of the service, and the service on real Redis
/// servers.
#[path = "rls/servers.rs"]
mod servers;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::envoy::{Rls, grpc_calls};
use support::process::TempDir;

/// A call of one descriptor of `entries` in `domain`.
fn call(domain: &str, entries: &[(&str, &str)]) -> Value {
    json!({"domain": domain, "descriptors": [{"entries": entries}]})
}

fn code(answer: &Value, i: usize) -> &str {
    answer["statuses"][i]["code"].as_str().unwrap()
}

fn remaining(answer: &Value, i: usize) -> u64 {
    answer["statuses"][i]["remaining"].as_u64().unwrap()
}

/// `[requests_per_unit, unit]` of descriptor `i`'s limit, or `None`.
fn limit(answer: &Value, i: usize) -> Option<(u64, u64)> {
    let l = &answer["statuses"][i]["limit"];
    (!l.is_null()).then(|| (l[0].as_u64().unwrap(), l[1].as_u64().unwrap()))
}

const HOUR: u64 = 3;
const DAY: u64 = 4;

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

/// Runs `tollgate rls --check` on `files` in one directory; the error.
fn check_error(files: &[(&str, &str)]) -> String {
    let dir = TempDir::new("check");
    for (name, text) in files {
        dir.write(name, text);
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["rls", "--check", "--config"])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{files:?} was accepted");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn invalid_files_are_refused_with_file_line_and_column() {
    let cases: &[(&str, &str)] = &[
        (
            "domain: d\ndescriptors:\n  - key: k\n    ratelimit: { unit: day }\n",
            "unknown field `ratelimit`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "duplicate descriptor composite key 'd.k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
            "invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { name: me, unit: day, requests_per_unit: 1, replaces: [{ name: me }] }\n",
            "replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 1, replaces: [{ name: \"\" }] }\n",
            "should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: day }\n",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: \"\"\ndescriptors: []\n",
            "config file cannot have empty domain",
        ),
        ("domain: d\ndescriptors:\n  - a\n  - b\n", "line 3"),
        ("domain: d\ndomain: e\n", "duplicate"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n",
            "share_threshold can only be used with wildcard values",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 1, algorithm: magic }\n",
            "unknown algorithm 'magic'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 5, cost: 0 }\n",
            "cost must be at least 1",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 5, cost: 6 }\n",
            "cost 6 is more than requests_per_unit 5 can ever admit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, cost: 2 }\n",
            "should not specify cost when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 5, cost: -1 }\n",
            "line 4",
        ),
    ];
    for (text, expected) in cases {
        let error = check_error(&[("bad.yaml", text)]);
        let place = error.find("bad.yaml: ").map(|at| &error[at..]);
        assert!(
            place.is_some_and(|p| p.contains("line ") && p.contains(" column ")),
            "no place in {error:?} for {text:?}"
        );
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
    let error = check_error(&[("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")]);
    assert!(
        error.contains("b.yaml: line 1 column 9: duplicate domain 'd'"),
        "{error}"
    );
}

#[test]
fn a_changed_directory_is_reloaded_and_an_invalid_one_ignored() {
    let dir = TempDir::new("reload");
    dir.write("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 1 }\n");
    let rls = Rls::start(&dir.0, &[]);
    let first = grpc_calls(rls.addr, &[call("d", &[("k", "v")])]);
    assert_eq!(limit(&first[0], 0), Some((1, DAY)));
    dir.write("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 9 }\n");
    dir.write("b.yaml", "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 4 }\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = grpc_calls(
            rls.addr,
            &[call("d", &[("k", "v")]), call("e", &[("k", "v")])],
        );
        if limit(&a[0], 0) == Some((9, HOUR)) && limit(&a[1], 0) == Some((4, HOUR)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new files never took effect: {a:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // An invalid version leaves the one in force.
    dir.write(
        "b.yaml",
        "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: aeon }\n",
    );
    std::thread::sleep(Duration::from_secs(2));
    let a = grpc_calls(rls.addr, &[call("e", &[("k", "v")])]);
    assert_eq!(limit(&a[0], 0), Some((4, HOUR)), "{a:?}");
}
