//! Usage-based limits through real gateways: a rule's cost from the
//! response, and request and token quotas in one set, on memory and on
//! Redis.

#![cfg(feature = "gateway")]

use crate::support;
use crate::support::redis as redis_support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::usage::fake_llm;

/// 5 requests and 1 000 tokens a minute per API key: two rules on the same
/// requests, the second taking its cost from the fake LLM's answer.
const LLM_RULES: &str = r#"
matching: all
rules:
  - name: requests
    key: header:x-api-key
    quotas: [{ name: requests, algorithm: fixed_window, limit: 5, period: 1m }]
  - name: tokens
    key: header:x-api-key
    cost_from_response: { header: x-usage-total-tokens, reserve: 500, reserve_header: x-max-tokens }
    quotas: [{ name: tokens, algorithm: fixed_window, limit: 1000, period: 1m }]
"#;

/// The same limits as one rule and one set: the request quota counts
/// requests, the token quota the cost from the response.
const LLM_ONE_RULE: &str = r#"
rules:
  - name: llm
    key: header:x-api-key
    cost_from_response: { header: x-usage-total-tokens, reserve: 500, reserve_header: x-max-tokens }
    quotas:
      - { name: requests, algorithm: fixed_window, limit: 5, period: 1m, counts: requests }
      - { name: tokens, algorithm: fixed_window, limit: 1000, period: 1m }
"#;

/// Waits, if need be, until at least 25 s of the wall clock's minute are
/// left: the quotas here are fixed windows of a minute aligned to the
/// clock, and a trace that crossed into the next window would see every
/// count start again (a pass where a refusal is asserted).
async fn well_inside_a_minute() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970");
    let into = now.as_millis() % 60_000;
    if into > 35_000 {
        tokio::time::sleep(Duration::from_millis(60_000 - into as u64 + 100)).await;
    }
}

/// One call through a gateway: its status and Retry-After.
async fn call(
    gw: &support::gateway::Gateway,
    key: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<u64>) {
    let (status, retry, _) = call_read(gw, key, headers).await;
    (status, retry)
}

/// [`call`], with the body (a refusal's problem details name the quota).
async fn call_read(
    gw: &support::gateway::Gateway,
    key: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<u64>, String) {
    use http_body_util::BodyExt;
    let client = support::client();
    let mut req =
        http::Request::get(format!("http://{}/v1/chat", gw.addr)).header("x-api-key", key);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(req.body(http_body_util::Empty::new()).unwrap()),
    )
    .await
    .unwrap()
    .unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}

/// Both limits hold through `gateways` (taken in turn): a key spending
/// little runs into the request limit, one spending 300 tokens a call
/// (its estimate exact) into the token limit.
async fn five_requests_and_a_thousand_tokens(gateways: &[&support::gateway::Gateway]) {
    well_inside_a_minute().await;
    let mut passed = 0;
    for i in 0..7 {
        let (status, _) = call(
            gateways[i % gateways.len()],
            "small",
            &[("x-tokens", "10"), ("x-max-tokens", "10")],
        )
        .await;
        passed += usize::from(status == 200);
    }
    assert_eq!(passed, 5, "five requests a minute");
    let mut passed = 0;
    for i in 0..5 {
        let (status, _) = call(
            gateways[i % gateways.len()],
            "big",
            &[("x-tokens", "300"), ("x-max-tokens", "300")],
        )
        .await;
        passed += usize::from(status == 200);
    }
    assert_eq!(passed, 3, "three answers of 300 tokens in 1 000");
}

/// After an answer that took far more than reserved, calls of one token
/// pass until the settle lands, then are refused; the refusal's
/// Retry-After is the rest of the window (the debt lasts as long).
async fn an_under_estimate_is_refused_after(
    gw: &support::gateway::Gateway,
    headers: &[(&str, &str)],
) {
    let (status, _) = call(gw, "debtor", headers).await;
    assert_eq!(status, 200);
    for _ in 0..4 {
        let (status, retry) = call(gw, "debtor", &[("x-tokens", "1"), ("x-max-tokens", "1")]).await;
        if status == 429 {
            let retry = retry.expect("a Retry-After");
            assert!((1..=60).contains(&retry), "{retry}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the usage beyond the reservation was never charged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_memory_holds_requests_and_tokens_a_minute() {
    let llm = fake_llm().await;
    let rules = support::gateway::RulesFile::new("usage-memory", LLM_RULES);
    let gw = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &[]);
    five_requests_and_a_thousand_tokens(&[&gw]).await;
    an_under_estimate_is_refused_after(&gw, &[("x-tokens", "1500"), ("x-max-tokens", "100")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_redis_share_requests_and_tokens() {
    let redis = redis_support::RedisServer::start();
    let llm = fake_llm().await;
    let rules = support::gateway::RulesFile::new("usage-redis", LLM_RULES);
    let url = redis.url();
    let a = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &["--redis", &url]);
    let b = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &["--redis", &url]);
    five_requests_and_a_thousand_tokens(&[&a, &b]).await;
    // The count in a trailer, at the end of a chunked answer.
    an_under_estimate_is_refused_after(
        &b,
        &[
            ("x-tokens", "1500"),
            ("x-max-tokens", "100"),
            ("x-stream", "trailer"),
        ],
    )
    .await;
    let served = llm.served.load(Ordering::SeqCst);
    // Five small answers, three of 300 tokens, the one in debt.
    assert!(served > 5 + 3, "{served}");
}

/// One set, "5 requests and 1 000 tokens a minute": through `gateways`
/// (taken in turn), the 6th cheap request is refused by the request
/// quota, and a big one, with requests left, by the token quota; an
/// estimate of 0 tokens still counts its request.
async fn one_set_of_requests_and_tokens(gateways: &[&support::gateway::Gateway]) {
    well_inside_a_minute().await;
    let gw = |i: usize| gateways[i % gateways.len()];
    for i in 0..4 {
        let (status, _) = call(
            gw(i),
            "small",
            &[("x-tokens", "10"), ("x-max-tokens", "10")],
        )
        .await;
        assert_eq!(status, 200, "cheap request {i}");
    }
    let (status, _) = call(gw(4), "small", &[("x-tokens", "0"), ("x-max-tokens", "0")]).await;
    assert_eq!(status, 200, "the fifth, free of tokens");
    let (status, retry, body) = call_read(
        gw(5),
        "small",
        &[("x-tokens", "10"), ("x-max-tokens", "10")],
    )
    .await;
    assert_eq!(status, 429, "the sixth cheap request");
    assert!(
        body.contains(r#""violated-policies":["requests"]"#),
        "{body}"
    );
    assert!(retry.is_some_and(|r| (1..=60).contains(&r)), "{retry:?}");
    for i in 0..3 {
        let (status, _) = call(
            gw(i),
            "big",
            &[("x-tokens", "300"), ("x-max-tokens", "300")],
        )
        .await;
        assert_eq!(status, 200, "big answer {i}");
    }
    let (status, _, body) = call_read(
        gw(3),
        "big",
        &[("x-tokens", "300"), ("x-max-tokens", "300")],
    )
    .await;
    assert_eq!(status, 429, "a fourth answer of 300 tokens");
    assert!(body.contains(r#""violated-policies":["tokens"]"#), "{body}");
    // Answers that took fewer tokens than reserved give the rest back
    // (once the settle lands): two of 600 reserved and 50 used leave room
    // for a third of 800, which without the tokens given back would be
    // refused; a refused call spends no request.
    for (i, (used, estimate)) in [("50", "600"), ("50", "600"), ("800", "800")]
        .into_iter()
        .enumerate()
    {
        let mut status = 0;
        for _ in 0..20 {
            (status, _) = call(
                gw(i),
                "over",
                &[("x-tokens", used), ("x-max-tokens", estimate)],
            )
            .await;
            if status == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            status, 200,
            "answer {i} of {used} tokens, {estimate} reserved"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_set_on_memory_counts_requests_and_tokens_apart() {
    let llm = fake_llm().await;
    let rules = support::gateway::RulesFile::new("usage-one-set", LLM_ONE_RULE);
    let gw = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &[]);
    one_set_of_requests_and_tokens(&[&gw]).await;
    an_under_estimate_is_refused_after(&gw, &[("x-tokens", "1500"), ("x-max-tokens", "100")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_set_on_redis_counts_requests_and_tokens_apart_across_two_gateways() {
    let redis = redis_support::RedisServer::start();
    let llm = fake_llm().await;
    let rules = support::gateway::RulesFile::new("usage-one-set-redis", LLM_ONE_RULE);
    let url = redis.url();
    let a = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &["--redis", &url]);
    let b = support::gateway::Gateway::start(&rules.0, Some(llm.addr), &["--redis", &url]);
    one_set_of_requests_and_tokens(&[&a, &b]).await;
    an_under_estimate_is_refused_after(&b, &[("x-tokens", "1500"), ("x-max-tokens", "100")]).await;
}
