//! Concurrency quotas and load shedding from a rules file, through the real
//! gateway binary in front of an upstream whose handler blocks on a gate, so
//! the number of requests under way is known.
#![cfg(feature = "gateway")]

use crate::support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http::StatusCode;
use support::gate::{BOUND, Gate};
use support::gateway::{Gateway, RulesFile};
use support::{HttpClient, Reply, client};
use tokio::task::JoinHandle;

async fn fetch(http: &HttpClient, gw: &Gateway, path: &str, user: &str) -> Reply {
    let headers = [("x-user", user.as_bytes())];
    let answer = support::get(http, gw.addr, path, &headers);
    tokio::time::timeout(BOUND, answer)
        .await
        .expect("the gateway did not answer")
}

/// A request left waiting at the gate.
fn hold(http: &HttpClient, gw: &Gateway, path: &str, user: &str) -> JoinHandle<Reply> {
    let (http, gw_addr) = (http.clone(), gw.addr);
    let (path, user) = (path.to_owned(), user.to_owned());
    tokio::spawn(async move {
        let headers = [("x-user", user.as_bytes())];
        let answer = support::get(&http, gw_addr, &path, &headers);
        tokio::time::timeout(BOUND, answer)
            .await
            .expect("no answer")
    })
}

const CONCURRENCY: &str = r#"
rules:
  - name: held
    key: header:x-user
    quotas: [{ algorithm: gcra, limit: 1000, period: 1s }]
    concurrency: { limit: 2 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_concurrency_limit_holds_per_key_until_the_response_is_over() {
    let gate = Gate::default();
    let up = gate.upstream().await;
    let file = RulesFile::new("concurrency", CONCURRENCY);
    let gw = Gateway::start(&file.0, Some(up), &[]);
    let http = client();

    let held: Vec<_> = (0..2).map(|_| hold(&http, &gw, "/gate/a", "a")).collect();
    gate.until_inside(2).await;
    let refused = fetch(&http, &gw, "/", "a").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let policy = refused.header("ratelimit-policy").unwrap_or_default();
    assert!(policy.contains("qu=\"concurrent-requests\""), "{policy}");
    assert!(policy.contains("q=2"), "{policy}");
    // Another key has slots of its own.
    let other = hold(&http, &gw, "/gate/b", "b");
    gate.until_inside(3).await;
    assert_eq!(gate.inside.load(Ordering::SeqCst), 3);

    // One response over frees one slot for key a, and only one. The gate
    // is fair, so the permit goes to one of a's requests, in first.
    gate.permits.add_permits(1);
    let start = Instant::now();
    while !held.iter().any(JoinHandle::is_finished) {
        assert!(start.elapsed() < BOUND, "no held request finished");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gate.until_inside(2).await;
    let again = hold(&http, &gw, "/gate/a", "a");
    gate.until_inside(3).await;
    let refused = fetch(&http, &gw, "/", "a").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);

    gate.permits.add_permits(8);
    for h in held.into_iter().chain([other, again]) {
        assert_eq!(h.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(fetch(&http, &gw, "/", "a").await.status, StatusCode::OK);
}

const SHEDDING: &str = r#"
shedding: { max_in_flight: 4, target_latency: 10s, reserved: 0.2 }
rules:
  - name: gate
    match: { prefix: /gate/ }
    key: header:x-user
    quotas: [{ algorithm: gcra, limit: 1000, period: 1s }]
    priority: critical
  - name: batch
    match: { prefix: /batch }
    key: header:x-user
    quotas: [{ algorithm: gcra, limit: 1000, period: 1s }]
    priority: background
  - name: pay
    match: { prefix: /pay }
    key: header:x-user
    quotas: [{ algorithm: gcra, limit: 1000, period: 1s }]
    priority: critical
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_route_is_shed_under_load_and_a_critical_one_served() {
    let gate = Gate::default();
    let up = gate.upstream().await;
    let file = RulesFile::new("shedding", SHEDDING);
    let gw = Gateway::start(&file.0, Some(up), &[]);
    let http = client();

    assert_eq!(
        fetch(&http, &gw, "/batch", "u").await.status,
        StatusCode::OK
    );
    // 3 of 4 in flight: a load of 0.75, past background's 0.6, below
    // critical's 1.
    let held: Vec<_> = (0..3)
        .map(|i| hold(&http, &gw, &format!("/gate/{i}"), "u"))
        .collect();
    gate.until_inside(3).await;
    let shed = fetch(&http, &gw, "/batch", "u").await;
    assert_eq!(shed.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.header("retry-after"), Some("1"));
    assert!(
        shed.json()["type"]
            .as_str()
            .is_some_and(|t| t.ends_with("#temporary-reduced-capacity")),
        "{:?}",
        shed.json()
    );
    for _ in 0..3 {
        assert_eq!(fetch(&http, &gw, "/pay", "u").await.status, StatusCode::OK);
    }

    gate.permits.add_permits(3);
    for h in held {
        assert_eq!(h.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        fetch(&http, &gw, "/batch", "u").await.status,
        StatusCode::OK
    );
}

const CONCURRENCY_ONLY: &str = r#"
rules:
  - name: held
    key: header:x-user
    concurrency: { limit: 1 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_with_only_a_concurrency_limit_limits_requests_under_way_only() {
    let gate = Gate::default();
    let up = gate.upstream().await;
    let file = RulesFile::new("concurrency-only", CONCURRENCY_ONLY);
    let gw = Gateway::start(&file.0, Some(up), &[]);
    let http = client();

    // No rate quota: requests one after another all pass.
    for _ in 0..30 {
        assert_eq!(fetch(&http, &gw, "/", "b").await.status, StatusCode::OK);
    }
    let held = hold(&http, &gw, "/gate/a", "a");
    gate.until_inside(1).await;
    let refused = fetch(&http, &gw, "/", "a").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let policy = refused.header("ratelimit-policy").unwrap_or_default();
    assert_eq!(policy, "\"concurrent\";q=1;qu=\"concurrent-requests\"");
    assert_eq!(fetch(&http, &gw, "/", "b").await.status, StatusCode::OK);
    gate.permits.add_permits(1);
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    // The slot is given back once the response is over: bounded wait.
    let start = Instant::now();
    while fetch(&http, &gw, "/", "a").await.status != StatusCode::OK {
        assert!(start.elapsed() < BOUND, "slot never given back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const ELASTIC: &str = r#"
shedding: { max_in_flight: 100, target_latency: 10s }
rules:
  - name: api
    key: header:x-user
    priority: critical
    quotas: [{ name: api, algorithm: gcra, limit: 2, period: 1m, mode: elastic, elastic_percent: 100 }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elastic_rate_quota_in_the_gateway_admits_over_its_limit_while_idle() {
    let gate = Gate::default();
    let up = gate.upstream().await;
    let file = RulesFile::new("elastic", ELASTIC);
    let gw = Gateway::start(&file.0, Some(up), &[]);
    let http = client();
    for _ in 0..4 {
        assert_eq!(fetch(&http, &gw, "/", "a").await.status, StatusCode::OK);
    }
    let refused = fetch(&http, &gw, "/", "a").await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "past the ceiling"
    );
    let policy = refused.header("ratelimit-policy").unwrap_or_default();
    assert_eq!(policy, "\"api\";q=2;w=60", "the limit, not the ceiling");
}
