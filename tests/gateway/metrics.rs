//! `tollgate serve --metrics-listen`: after a known sequence of requests,
//! `/metrics` (scraped over TCP from the real binary) says exactly what
//! happened.
#![cfg(feature = "gateway")]

use crate::support;
#[cfg(feature = "redis")]
use crate::support::redis as redis_support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::gateway::{Gateway, RulesFile, upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RULES: &str = r#"
rules:
  - name: api
    match: { prefix: /api/ }
    key: header:x-api-key
    quotas: [{ name: api, algorithm: fixed_window, limit: 2, period: 1h }]
  - name: trial
    match: { prefix: /trial }
    key: peer_ip
    quotas: [{ name: trial, algorithm: fixed_window, limit: 1, period: 1h, mode: shadow }]
"#;

async fn status(gw: &Gateway, path: &str, key: Option<&str>) -> StatusCode {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut req = Request::get(format!("http://{}{path}", gw.addr));
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    let resp = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    resp.into_body().collect().await.unwrap();
    status
}

/// `GET /metrics` over a plain TCP connection, as Prometheus does.
async fn scrape(addr: SocketAddr) -> String {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut reply = Vec::new();
        stream.read_to_end(&mut reply).await.unwrap();
        String::from_utf8(reply).unwrap()
    };
    let reply = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the scrape timed out");
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.to_owned()
}

/// Every sample of a scrape, by name and sorted labels: `name{a="x",b="y"}`.
fn samples(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let series = match series.split_once('{') {
            Some((name, labels)) => {
                let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                labels.sort_unstable();
                format!("{name}{{{}}}", labels.join(","))
            }
            None => series.to_owned(),
        };
        out.insert(series, value.parse().unwrap());
    }
    out
}

fn metrics_gateway(
    rules: &RulesFile,
    upstream: SocketAddr,
    extra: &[&str],
) -> (Gateway, SocketAddr) {
    let mut args = vec!["--metrics-listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let gateway = Gateway::start(&rules.0, Some(upstream), &args);
    let metrics = gateway.metrics_addr();
    (gateway, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrape_counts_each_decision_by_policy_and_outcome() {
    let up = upstream().await;
    let rules = RulesFile::new("metrics", RULES);
    let (gw, metrics) = metrics_gateway(&rules, up.addr, &[]);

    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(status(&gw, "/api/x", Some("alice")).await);
    }
    statuses.push(status(&gw, "/api/x", Some("bob")).await);
    for _ in 0..2 {
        statuses.push(status(&gw, "/trial", None).await);
    }
    statuses.push(status(&gw, "/elsewhere", None).await);
    let s = StatusCode::from_u16;
    let expected = [201, 201, 429, 201, 201, 201, 201].map(|c| s(c).unwrap());
    assert_eq!(statuses, expected);

    let text = scrape(metrics).await;
    let got = samples(&text);
    let want = [
        (
            r#"tollgate_decisions_total{outcome="allowed",policy="api"}"#,
            3.0,
        ),
        (
            r#"tollgate_decisions_total{outcome="refused",policy="api"}"#,
            1.0,
        ),
        (
            r#"tollgate_decisions_total{outcome="shadow_refused",policy="api"}"#,
            0.0,
        ),
        (
            r#"tollgate_decisions_total{outcome="errored",policy="api"}"#,
            0.0,
        ),
        (
            r#"tollgate_decisions_total{outcome="allowed",policy="trial"}"#,
            1.0,
        ),
        (
            r#"tollgate_decisions_total{outcome="refused",policy="trial"}"#,
            0.0,
        ),
        (
            r#"tollgate_decisions_total{outcome="shadow_refused",policy="trial"}"#,
            1.0,
        ),
        // alice, bob and 127.0.0.1: one state each; no rule matched /elsewhere.
        ("tollgate_memory_states", 3.0),
        (
            r#"tollgate_decision_duration_seconds_count{backend="memory"}"#,
            6.0,
        ),
        (
            r#"tollgate_decision_duration_seconds_bucket{backend="memory",le="+Inf"}"#,
            6.0,
        ),
    ];
    for (series, value) in want {
        assert_eq!(got.get(series), Some(&value), "{series} in\n{text}");
    }
    assert!(
        !text.contains("alice") && !text.contains("127.0.0.1"),
        "no client key is ever a label:\n{text}"
    );
    // The limited port does not serve the metrics.
    assert_eq!(status(&gw, "/metrics", None).await, StatusCode::CREATED);
    assert_eq!(up.count(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_rules_file_is_never_read_again_and_a_new_version_once_settled() {
    let up = upstream().await;
    let rules = RulesFile::new("metrics-reads", RULES);
    let (_gw, metrics) = metrics_gateway(&rules, up.addr, &[]);
    let reads = "tollgate_rules_reads_total";
    let outcome = |o: &str| format!(r#"tollgate_rules_reloads_total{{outcome="{o}"}}"#);
    let got = samples(&scrape(metrics).await);
    assert_eq!(got.get(reads), Some(&1.0), "the load's read: {got:?}");
    assert_eq!(got.get(&outcome("applied")), Some(&0.0), "{got:?}");
    // Six reload ticks of 250 ms look at the file and do not read it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(samples(&scrape(metrics).await).get(reads), Some(&1.0));

    // A new version, renamed in: read when seen changed, read again one
    // tick later to find it the same, then applied.
    let next = rules.0.with_file_name("next.yaml");
    std::fs::write(&next, RULES.replace("limit: 2,", "limit: 3,")).unwrap();
    std::fs::rename(&next, &rules.0).unwrap();
    let start = std::time::Instant::now();
    while samples(&scrape(metrics).await).get(&outcome("applied")) != Some(&1.0) {
        assert!(start.elapsed() < Duration::from_secs(5), "not applied");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let got = samples(&scrape(metrics).await);
    for (series, value) in [
        (reads.to_owned(), 3.0),
        (outcome("applied"), 1.0),
        (outcome("invalid"), 0.0),
        (outcome("refused"), 0.0),
    ] {
        assert_eq!(got.get(&series), Some(&value), "{series} in {got:?}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_calls_cache_hits_failures_and_the_breaker_are_scraped() {
    let mut redis = redis_support::RedisServer::start();
    let up = upstream().await;
    let rules = RulesFile::new("metrics-redis", RULES);
    let url = redis.url();
    let (gw, metrics) = metrics_gateway(&rules, up.addr, &["--redis", &url]);

    // Two admitted; the second empties the quota, so Redis also says when
    // its next unit frees, and both refusals come from the denial cache
    // without calling Redis.
    for want in [201, 201, 429, 429] {
        assert_eq!(status(&gw, "/api/x", Some("carol")).await.as_u16(), want);
    }
    let got = samples(&scrape(metrics).await);
    let redis_series = [
        ("tollgate_redis_calls_total", 2.0),
        ("tollgate_redis_cache_hits_total", 2.0),
        (r#"tollgate_redis_failures_total{kind="unavailable"}"#, 0.0),
        (
            r#"tollgate_redis_failures_total{kind="misconfigured"}"#,
            0.0,
        ),
        ("tollgate_redis_circuit_open", 0.0),
        (
            r#"tollgate_decisions_total{outcome="allowed",policy="api"}"#,
            2.0,
        ),
        (
            r#"tollgate_decisions_total{outcome="refused",policy="api"}"#,
            2.0,
        ),
        (
            r#"tollgate_decision_duration_seconds_count{backend="redis"}"#,
            4.0,
        ),
    ];
    for (series, value) in redis_series {
        assert_eq!(got.get(series), Some(&value), "{series} in {got:?}");
    }

    // Redis gone: five failed calls open the breaker (the default), the
    // sixth check is refused by it without a call; every one is an errored
    // decision, and the request passes (the default failure policy).
    redis.kill();
    for _ in 0..6 {
        assert_eq!(
            status(&gw, "/api/x", Some("dave")).await,
            StatusCode::CREATED
        );
    }
    let text = scrape(metrics).await;
    let got = samples(&text);
    let down = [
        ("tollgate_redis_calls_total", 7.0),
        (r#"tollgate_redis_failures_total{kind="unavailable"}"#, 5.0),
        ("tollgate_redis_circuit_open", 1.0),
        (
            r#"tollgate_decisions_total{outcome="errored",policy="api"}"#,
            6.0,
        ),
        (
            r#"tollgate_decision_duration_seconds_count{backend="redis"}"#,
            10.0,
        ),
    ];
    for (series, value) in down {
        assert_eq!(got.get(series), Some(&value), "{series} in\n{text}");
    }
}

/// A problem body's `reason` member, through the real gateway.
async fn refusal_reason(gw: &Gateway, path: &str, key: &str) -> (StatusCode, String) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::get(format!("http://{}{path}", gw.addr)).header("x-api-key", key);
    let resp = client
        .request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_decision_is_counted_by_its_reason_and_near_limit_by_policy() {
    let up = upstream().await;
    let rules = RulesFile::new(
        "reasons",
        r#"
near_limit: 0.5
deny: { keys: ["key:revoked"] }
rules:
  - name: api
    match: { prefix: /api/ }
    key: header:x-api-key
    quotas: [{ name: api, algorithm: fixed_window, limit: 4, period: 1h }]
  - name: trial
    match: { prefix: /trial }
    key: peer_ip
    quotas: [{ name: trial, algorithm: fixed_window, limit: 1, period: 1h, mode: shadow }]
"#,
    );
    let (gw, metrics) = metrics_gateway(&rules, up.addr, &[]);

    // Four admitted (used 1, 2, 3, 4 of 4: the last two above half), one
    // refused by the quota, one denied, two through the shadow quota (the
    // second past it).
    for _ in 0..4 {
        assert_eq!(
            status(&gw, "/api/x", Some("erin")).await,
            StatusCode::CREATED
        );
    }
    let (refused, body) = refusal_reason(&gw, "/api/x", "erin").await;
    assert_eq!(refused, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains(r#""reason":"quota""#), "{body}");
    assert!(body.contains(r#""violated-policies":["api"]"#), "{body}");
    let (denied, body) = refusal_reason(&gw, "/api/x", "revoked").await;
    assert_eq!(denied, StatusCode::FORBIDDEN);
    assert!(body.contains(r#""reason":"deny_list""#), "{body}");
    for _ in 0..2 {
        assert_eq!(status(&gw, "/trial", None).await, StatusCode::CREATED);
    }

    let text = scrape(metrics).await;
    let got = samples(&text);
    let want = [
        (r#"tollgate_decision_reasons_total{reason="admitted"}"#, 5.0),
        (r#"tollgate_decision_reasons_total{reason="quota"}"#, 1.0),
        (
            r#"tollgate_decision_reasons_total{reason="deny_list"}"#,
            1.0,
        ),
        (r#"tollgate_decision_reasons_total{reason="shadow"}"#, 1.0),
        (r#"tollgate_decision_reasons_total{reason="lease"}"#, 0.0),
        (r#"tollgate_near_limit_total{policy="api"}"#, 2.0),
        (r#"tollgate_near_limit_total{policy="trial"}"#, 2.0),
    ];
    for (series, value) in want {
        assert_eq!(got.get(series), Some(&value), "{series} in\n{text}");
    }
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_on_a_leasing_redis_decide_from_the_lease_without_waiting() {
    let redis = redis_support::RedisServer::start();
    let up = upstream().await;
    let rules = RulesFile::new(
        "reasons-lease",
        r#"
timeout: 10s
rules:
  - name: api
    match: { prefix: /api/ }
    key: header:x-api-key
    quotas: [{ name: api, algorithm: gcra, limit: 10000, period: 1h }]
"#,
    );
    let url = redis.url();
    let args = ["--redis", url.as_str(), "--redis-lease", "auto"];
    let (gw, metrics) = metrics_gateway(&rules, up.addr, &args);

    // Four clients at once, each on one connection: a hot key, whose
    // leases grow with its pace.
    let (clients, each) = (4, 50);
    let sent = clients * each;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let addr = gw.addr;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let client = client.clone();
        tasks.spawn(async move {
            for _ in 0..each {
                let req = Request::get(format!("http://{addr}/api/x"))
                    .header("x-api-key", "frank")
                    .body(Empty::new())
                    .unwrap();
                let resp = client.request(req).await.unwrap();
                assert_eq!(resp.status(), StatusCode::CREATED);
                resp.into_body().collect().await.unwrap();
            }
        });
    }
    let all = async {
        while let Some(task) = tasks.join_next().await {
            task.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("the requests timed out");
    let text = scrape(metrics).await;
    let got = samples(&text);
    let reason = |r: &str| {
        let series = format!(r#"tollgate_decision_reasons_total{{reason="{r}"}}"#);
        got.get(&series).copied().unwrap_or(0.0)
    };
    // The reason `lease` is given only on the path that does not wait: the
    // rules asked the lease in the service's `call`, and Redis was called
    // only to fill it.
    let (lease, admitted) = (reason("lease"), reason("admitted"));
    // Every request has one reason; on a loaded machine a Redis call may
    // time out (then the failure policy lets it through).
    let failed = reason("timeout") + reason("fail_open");
    assert_eq!(lease + admitted + failed, f64::from(sent), "{text}");
    assert!(lease > 0.0, "{text}");
    // Every decision from a lease spared a Redis call.
    let calls = got["tollgate_redis_calls_total"];
    assert!(
        calls <= admitted,
        "{calls} calls for {admitted} awaited decisions:\n{text}"
    );
}
