//! Gateways that share one Redis share one limit, and a rules file can name
//! Redis as its backend.
#![cfg(all(feature = "gateway", feature = "redis"))]

use crate::support;
use crate::support::redis as redis_support;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redis_support::RedisServer;
use support::gateway::{Gateway, RulesFile, upstream};
use tollgate::rules::Rules;

const RULES: &str = r#"
rules:
  - name: api
    key: header:x-api-key
    quotas: [{ name: api, algorithm: sliding_log, limit: 5, period: 1h }]
"#;

async fn status(gw: &Gateway, key: &str) -> StatusCode {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::get(format!("http://{}/api", gw.addr))
        .header("x-api-key", key)
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    resp.into_body().collect().await.unwrap();
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_redis_share_one_limit() {
    let redis = RedisServer::start();
    let up = upstream().await;
    let rules = RulesFile::new("shared", RULES);
    let url = redis.url();
    let a = Gateway::start(&rules.0, Some(up.addr), &["--redis", &url]);
    let b = Gateway::start(&rules.0, Some(up.addr), &["--redis", &url]);
    let mut admitted = 0;
    for i in 0..12 {
        let gw = if i % 2 == 0 { &a } else { &b };
        admitted += usize::from(status(gw, "shared-key").await == StatusCode::CREATED);
    }
    assert_eq!(admitted, 5, "five across both gateways, not five each");
    assert_eq!(up.count(), 5);
    // A gateway on its own memory would not know about the other's traffic.
    let alone = Gateway::start(&rules.0, Some(up.addr), &[]);
    assert_eq!(status(&alone, "shared-key").await, StatusCode::CREATED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_file_can_name_redis_and_its_failure_policy() {
    let redis = RedisServer::start();
    let yaml = format!(
        "backend:\n  redis:\n    url: {}\n    prefix: \"t:\"\n    timeout: 200ms\n    on_failure: memory\n{RULES}",
        redis.url()
    );
    let rules = Rules::parse(&yaml).unwrap();
    assert!(
        rules.describe().contains("decide in memory"),
        "{}",
        rules.describe()
    );
    let app = axum::Router::new()
        .fallback(|| async { "ok" })
        .layer(tollgate::RateLimitLayer::from_policy(rules));
    let addr = support::serve(app).await;
    let c = support::client();
    for _ in 0..5 {
        let r = support::get(&c, addr, "/x", &[("x-api-key", b"k")]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    assert_eq!(
        support::get(&c, addr, "/x", &[("x-api-key", b"k")])
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let keys = redis.cli(&["--scan", "--pattern", "t:*"]);
    assert!(keys.contains("t:{key:k}:"), "state is in Redis: {keys}");
    let err =
        Rules::parse("backend:\n  redis:\n    url: redis://x\n    on_failure: retry\nrules: []\n")
            .unwrap_err();
    assert!(
        err.to_string().contains("valid values are error, memory"),
        "{err}"
    );
}

#[test]
fn a_rules_file_sets_the_lease_mode_and_refuses_what_cannot_be_leased() {
    let backend = |lease: &str| {
        format!("backend:\n  redis:\n    url: redis://127.0.0.1:1\n    lease: {lease}\n")
    };
    let gcra = "rules:\n  - name: api\n    key: header:x-api-key\n    quotas: [{ algorithm: gcra, limit: 5, period: 1s }]\n";
    for (lease, shown) in [
        ("auto", "leases: auto"),
        ("250", "leases: 250"),
        ("off", "leases: off"),
    ] {
        let rules = Rules::parse(&format!("{}{gcra}", backend(lease))).unwrap();
        assert!(rules.describe().contains(shown), "{}", rules.describe());
    }
    for bad in ["0", "-3", "sometimes", "true", "1.5"] {
        let err = Rules::parse(&format!("{}{gcra}", backend(bad))).unwrap_err();
        assert!(err.to_string().contains("lease"), "{bad}: {err}");
    }
    // A sliding log needs every arrival: refused with leases on, fine off.
    let err = Rules::parse(&format!("{}{RULES}", backend("auto"))).unwrap_err();
    assert!(err.to_string().contains("cannot be leased"), "{err}");
    assert!(Rules::parse(&format!("{}{RULES}", backend("off"))).is_ok());
    // So does an elastic quota, whose answer depends on the load.
    let elastic = "shedding: { max_in_flight: 8, target_latency: 1s }\nrules:\n  - name: api\n    key: header:x-api-key\n    quotas: [{ algorithm: gcra, limit: 5, period: 1s, mode: elastic, elastic_percent: 50 }]\n";
    let err = Rules::parse(&format!("{}{elastic}", backend("auto"))).unwrap_err();
    assert!(err.to_string().contains("is elastic"), "{err}");
    assert!(err.to_string().contains("cannot be leased"), "{err}");
    assert!(Rules::parse(&format!("{}{elastic}", backend("off"))).is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_leasing_gateways_share_one_limit() {
    const LEASE: usize = 20;
    let redis = RedisServer::start();
    let up = upstream().await;
    // A Redis call that fails is let through by default (fail open), and
    // five in a row open the circuit breaker, which then lets everything
    // through for a second: on a loaded machine the 50 ms default timeout
    // is missed, and admissions from Redis could not be told from those.
    // Failures are refused here (503), and waited for far longer.
    let rules = RulesFile::new(
        "leasing",
        &format!(
            r#"
backend:
  redis:
    url: {}
    lease: {LEASE}
    timeout: 5s
on_backend_error: reject
timeout: 10s
rules:
  - name: api
    key: header:x-api-key
    quotas: [{{ name: api, algorithm: gcra, limit: 300, period: 3650d }}]
"#,
            redis.url()
        ),
    );
    let gateways: Vec<std::sync::Arc<Gateway>> = (0..3)
        .map(|_| {
            std::sync::Arc::new(Gateway::start(
                &rules.0,
                Some(up.addr),
                // Each request comes on a connection of its own from one
                // loopback address, and closed ones linger a moment on the
                // gateway's side: the per-address cap is not what this
                // test is about.
                &["--max-connections-per-ip", "1000"],
            ))
        })
        .collect();
    let mut tasks = Vec::new();
    for gw in &gateways {
        for _ in 0..24 {
            let gw = gw.clone();
            tasks.push(tokio::spawn(async move {
                let (mut admitted, mut refused, mut failed) = (0, 0, 0);
                for _ in 0..20 {
                    match status(&gw, "hot").await {
                        StatusCode::CREATED => admitted += 1,
                        StatusCode::TOO_MANY_REQUESTS => refused += 1,
                        _ => failed += 1,
                    }
                }
                (admitted, refused, failed)
            }));
        }
    }
    let mut admitted = 0;
    let mut refused = 0;
    let mut failed = 0;
    for t in tasks {
        let (a, r, f) = t.await.unwrap();
        (admitted, refused, failed) = (admitted + a, refused + r, failed + f);
    }
    // 1 440 requests for 300 units: all of them, less what the last leases
    // left parked.
    assert!(
        (300 - 3 * LEASE..=300).contains(&admitted),
        "{admitted} admitted, {refused} refused, {failed} failed"
    );
    assert_eq!(failed, 0, "Redis calls failed");
    println!("{admitted} admitted, {refused} refused");
    assert_eq!(up.count(), admitted);
    let calls = redis.command_calls("evalsha") + redis.command_calls("eval");
    assert!(calls < 300, "{calls} Redis calls for 300 admissions");
}
