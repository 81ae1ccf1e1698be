//! Gateways that share one Redis share one limit, and a rules file can name
//! Redis as its backend.
#![cfg(all(feature = "gateway", feature = "redis"))]

#[path = "support/redis.rs"]
mod redis_support;
mod support;

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
