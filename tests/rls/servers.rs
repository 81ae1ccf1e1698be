//! The service behind real Envoy proxies, on real Redis servers (a Cluster,
//! leases, a Redis that stops answering), and its metrics.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::support::envoy::{Envoy, Rls, grpc_calls, grpc_calls_concurrently};
use super::support::process::TempDir;
use super::support::redis::{RedisCluster, RedisServer};
use super::{call, support};

/// The configuration the Envoy tests use: 3 requests an hour per user.
const EDGE: &str = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { name: per-user, unit: hour, requests_per_unit: 3 }\n";

async fn envoy_get(envoy: &Envoy, user: &str) -> support::Reply {
    let client = support::client();
    support::get(
        &client,
        envoy.addr,
        "/hello",
        &[("x-user", user.as_bytes())],
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_limits_through_tollgate_rls() {
    let up = support::gateway::upstream().await;
    let dir = TempDir::new("envoy");
    let config = dir.write("edge.yaml", EDGE);
    let rls = Rls::start(&config, &[]);
    let envoy = Envoy::start(up.addr, rls.addr, true);
    for left in (0..3).rev() {
        let r = envoy_get(&envoy, "alice").await;
        assert_eq!(r.status, 201, "passes to the upstream: {:?}", r.headers);
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"per-user\";q=3;w=3600")
        );
        let state = r.list("ratelimit");
        assert_eq!(state[0].int("r"), left);
    }
    let r = envoy_get(&envoy, "alice").await;
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(r.list("ratelimit")[0].int("r"), 0);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry));
    assert_eq!(
        up.count(),
        3,
        "the refused request never reached the upstream"
    );
    assert_eq!(
        envoy_get(&envoy, "bob").await.status,
        201,
        "another user has his own"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_sends_each_request_s_cost_and_the_limit_s_cost_multiplies_it() {
    let up = support::gateway::upstream().await;
    let dir = TempDir::new("envoy-cost");
    let config = dir.write(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { name: tokens, unit: hour, requests_per_unit: 100, cost: 2 }\n",
    );
    let rls = Rls::start(&config, &[]);
    let envoy = Envoy::start_with_hits(up.addr, rls.addr, true, Some("%REQ(x-tokens)%"));
    let client = support::client();
    let send = |tokens: &'static str| {
        let headers: [(&str, &[u8]); 2] = [("x-user", b"frank"), ("x-tokens", tokens.as_bytes())];
        let client = client.clone();
        async move { support::get(&client, envoy.addr, "/chat", &headers).await }
    };
    let r = send("30").await;
    assert_eq!(r.status, 201, "{:?}", r.headers);
    assert_eq!(
        r.list("ratelimit")[0].int("r"),
        40,
        "30 tokens at 2 units each"
    );
    let r = send("15").await;
    assert_eq!(r.status, 201, "{:?}", r.headers);
    assert_eq!(r.list("ratelimit")[0].int("r"), 10);
    let r = send("10").await;
    assert_eq!(r.status, 429, "20 units do not fit in 10: {:?}", r.headers);
    assert_eq!(up.count(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_envoys_share_a_limit_through_redis() {
    let redis = RedisServer::start();
    let up = support::gateway::upstream().await;
    let dir = TempDir::new("shared");
    let config = dir.write("edge.yaml", EDGE);
    let url = redis.url();
    // A loaded machine may take longer than the default 50 ms to connect
    // and load the scripts: a failed call would be a 500, not a pass.
    let args = ["--redis", &url, "--redis-timeout", "2s"];
    let (rls_a, rls_b) = (Rls::start(&config, &args), Rls::start(&config, &args));
    for rls in [&rls_a, &rls_b] {
        let (addr, probe) = (rls.addr, call("edge", &[("user", "warm-up")]));
        tokio::task::spawn_blocking(move || warm(addr, probe))
            .await
            .unwrap();
    }
    let envoys = [
        Envoy::start(up.addr, rls_a.addr, true),
        Envoy::start(up.addr, rls_b.addr, true),
    ];
    let mut passed = 0;
    for i in 0..8 {
        if envoy_get(&envoys[i % 2], "carol").await.status == 201 {
            passed += 1;
        }
    }
    assert_eq!(passed, 3, "one limit across both proxies");
}

#[tokio::test(flavor = "multi_thread")]
async fn failure_mode_deny_both_ways_with_the_service_stopped() {
    let up = support::gateway::upstream().await;
    let dir = TempDir::new("failure");
    let config = dir.write("edge.yaml", EDGE);
    let mut rls = Rls::start(&config, &[]);
    let deny = Envoy::start(up.addr, rls.addr, true);
    let allow = Envoy::start(up.addr, rls.addr, false);
    assert_eq!(envoy_get(&deny, "dave").await.status, 201);
    rls.stop();
    assert_eq!(
        envoy_get(&deny, "dave").await.status,
        500,
        "failure_mode_deny: true"
    );
    assert_eq!(
        envoy_get(&allow, "dave").await.status,
        201,
        "failure_mode_deny: false"
    );
}

/// Calls `probe` until Redis decides it: the first call opens the
/// connection and loads the scripts, which a loaded machine may take
/// longer than the timeout to do.
fn warm(addr: SocketAddr, probe: Value) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let a = grpc_calls(addr, std::slice::from_ref(&probe));
        if !a[0]["statuses"][0]["limit"].is_null() {
            return;
        }
        assert!(Instant::now() < deadline, "Redis never decided: {a:?}");
    }
}

#[test]
fn redis_cluster_and_leases_through_the_service() {
    let dir = TempDir::new("redis");
    let config = dir.write(
        "c.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 5, algorithm: gcra }\n",
    );
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    // A loaded machine may take longer than the default 50 ms to connect.
    let mut args: Vec<&str> = vec!["--redis-timeout", "2s"];
    for url in &urls {
        args.extend(["--redis", url]);
    }
    let single = RedisServer::start();
    let url = single.url();
    let leases = vec![
        "--redis",
        &url,
        "--redis-lease",
        "auto",
        "--redis-timeout",
        "2s",
    ];
    for extra in [args, leases] {
        let rls = Rls::start(&config, &extra);
        warm(rls.addr, call("d", &[("k", "warm-up")]));
        let calls: Vec<Value> = (0..7).map(|_| call("d", &[("k", "one")])).collect();
        let a = grpc_calls(rls.addr, &calls);
        let codes: Vec<&str> = a.iter().map(|a| a["overall"].as_str().unwrap()).collect();
        assert_eq!(
            codes,
            ["OK", "OK", "OK", "OK", "OK", "OVER_LIMIT", "OVER_LIMIT"],
            "{extra:?}: {a:?}"
        );
    }
}

/// 48 calls for one user, 16 in flight at a time; every answer is checked
/// against `policy` and must come within `bound`.
fn load_answers(rls: &Rls, policy: &str, bound: u64) -> Vec<Value> {
    let load: Vec<Value> = (0..48).map(|_| call("edge", &[("user", "erin")])).collect();
    let answers = grpc_calls_concurrently(rls.addr, &load, 16);
    for answer in &answers {
        let ms = answer["ms"].as_u64().unwrap();
        assert!(ms < bound, "{policy}: a call waited {ms} ms: {answer}");
    }
    answers
}

#[test]
fn redis_stopped_under_load_answers_within_the_timeout_by_the_policy() {
    let dir = TempDir::new("down");
    let config = dir.write("c.yaml", EDGE);
    let mut redis = RedisServer::start();
    let url = redis.url();
    let policies = ["error", "allow", "deny", "memory"];
    let services: Vec<Rls> = policies
        .iter()
        .map(|p| {
            let args = ["--redis", &url, "--redis-timeout", "250ms"];
            Rls::start(&config, &[&args[..], &["--on-backend-error", p]].concat())
        })
        .collect();
    // Warmed on another user: erin's count stays out of Redis (and out of
    // its denial cache), so the memory policy starts her from nothing.
    for rls in &services {
        warm(rls.addr, call("edge", &[("user", "warm-up")]));
    }
    // A Redis that accepts and never answers (the reference waited for its
    // own timeout on every call), then one that is gone. The bound is the
    // 250 ms timeout with room for a loaded machine, far below the 10 s
    // the client would wait.
    redis.cli(&["CLIENT", "PAUSE", "30000", "ALL"]);
    for stopped in ["paused", "killed"] {
        if stopped == "killed" {
            redis.kill();
        }
        for (rls, policy) in services.iter().zip(policies) {
            let answers = load_answers(rls, policy, 2_000);
            let count = |code: &str| answers.iter().filter(|a| a["overall"] == code).count();
            match policy {
                "error" => {
                    let errors = answers.iter().filter(|a| a["error"] == "UNAVAILABLE");
                    assert_eq!(errors.count(), 48, "{stopped}: {answers:?}");
                }
                "allow" => assert_eq!(count("OK"), 48, "{stopped}: {answers:?}"),
                "deny" => assert_eq!(count("OVER_LIMIT"), 48, "{stopped}: {answers:?}"),
                // Counted in this process while Redis is away: erin's 3 an
                // hour, then refused (the count carries over to the kill).
                _ => {
                    let ok = if stopped == "paused" { 3 } else { 0 };
                    assert_eq!(count("OK"), ok, "{stopped}: {answers:?}");
                    assert_eq!(count("OVER_LIMIT"), 48 - ok, "{stopped}: {answers:?}");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_by_domain_and_configured_descriptor_only() {
    let dir = TempDir::new("metrics");
    let config = dir.write("c.yaml", "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: { unit: day, requests_per_unit: 2 }\n  - key: beta\n    shadow_mode: true\n    rate_limit: { unit: day, requests_per_unit: 1 }\n");
    let rls = Rls::start(&config, &["--metrics-listen", "127.0.0.1:0"]);
    let mut calls: Vec<Value> = (0..3)
        .map(|_| call("edge", &[("user", "secret-user-1")]))
        .collect();
    calls.push(call("edge", &[("user", "secret-user-2")]));
    calls.extend((0..2).map(|_| call("edge", &[("beta", "b")])));
    // An addend near 2^64 twice would wrap a counter that added it whole.
    let mut huge = call("edge", &[("user", "greedy")]);
    huge["descriptors"][0]["hits_addend"] = json!(u64::MAX - 1);
    calls.extend([huge.clone(), huge]);
    let addr = rls.addr;
    tokio::task::spawn_blocking(move || grpc_calls(addr, &calls))
        .await
        .unwrap();
    let client = support::client();
    let page = support::get(
        &client,
        rls.metrics.expect("metrics address"),
        "/metrics",
        &[],
    )
    .await
    .body;
    let value = |name: &str, descriptor: &str| -> u64 {
        page.lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{"))
                    && l.contains("domain=\"edge\"")
                    && l.contains(&format!("descriptor=\"{descriptor}\""))
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} for {descriptor} in {page}"))
    };
    let capped = 2 * u64::from(u32::MAX);
    assert_eq!(value("tollgate_rls_total_hits", "edge.user"), 4 + capped);
    assert_eq!(value("tollgate_rls_within_limit", "edge.user"), 3);
    assert_eq!(value("tollgate_rls_over_limit", "edge.user"), 1 + capped);
    assert_eq!(value("tollgate_rls_near_limit", "edge.user"), 1);
    assert_eq!(value("tollgate_rls_shadow_mode", "edge.beta"), 1);
    assert!(
        !page.contains("secret-user"),
        "a request's values became a label"
    );
}
