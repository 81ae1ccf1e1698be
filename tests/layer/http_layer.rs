//! The layer through `oneshot`: limits, headers, shadow and delay, routes,
//! any service and body, the decision and its reason seen by handlers.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use support::{Reply, reply};
use tollgate::key::{HeaderKey, KeyExtractor, PeerIp};
use tollgate::layer::{Policy, QUOTA_EXCEEDED, Reason};
use tollgate::{
    Decision, HeaderStyle, Limiter, ManualClock, MemoryBackend, Mode, OnDelay, OnMissingKey, Quota,
    QuotaSet, RateLimitLayer, Timestamp,
};
use tower::ServiceExt;

use super::keys::Async;

pub(super) const SEC: Duration = Duration::from_secs(1);

pub(super) fn clock() -> ManualClock {
    ManualClock::new(Timestamp::from_secs(1_700_000_040))
}

pub(super) fn limiter(
    clock: &ManualClock,
    quotas: impl Into<QuotaSet>,
) -> Limiter<MemoryBackend<ManualClock>> {
    Limiter::new(
        MemoryBackend::builder().clock(clock.clone()).build(),
        quotas,
    )
}

pub(super) fn app<P: Policy>(layer: RateLimitLayer<P>) -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/items/{id}", get(|| async { "item" }))
        .layer(layer)
}

pub(super) fn from(ip: &str) -> Request<Body> {
    request(ip, &[])
}

pub(super) fn request(ip: &str, headers: &[(&str, &[u8])]) -> Request<Body> {
    let mut req = Request::get("/");
    for (k, v) in headers {
        req = req.header(*k, http::HeaderValue::from_bytes(v).unwrap());
    }
    let mut req = req.body(Body::empty()).unwrap();
    let addr: SocketAddr = format!("{ip}:4000").parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(addr));
    req
}

pub(super) async fn send(app: &Router, req: Request<Body>) -> Reply {
    reply(app.clone().oneshot(req).await.unwrap()).await
}

#[tokio::test]
async fn the_limit_holds_per_key_and_keys_are_independent() {
    let c = clock();
    let app = app(RateLimitLayer::new(
        limiter(&c, Quota::fixed_window(3, 60 * SEC).build().unwrap()),
        PeerIp::new(),
    ));
    for _ in 0..3 {
        assert_eq!(send(&app, from("192.0.2.1")).await.status, StatusCode::OK);
    }
    assert_eq!(
        send(&app, from("192.0.2.1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(&app, from("192.0.2.2")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn ietf_headers_name_every_quota() {
    let c = clock();
    let set = QuotaSet::new(
        "api",
        [
            Quota::fixed_window(10, 60 * SEC)
                .name("per-minute")
                .build()
                .unwrap(),
            Quota::gcra(2, Duration::from_millis(2500))
                .name("burst")
                .build()
                .unwrap(),
        ],
    )
    .unwrap();
    let app = app(RateLimitLayer::new(limiter(&c, set), PeerIp::new()));
    c.advance(15 * SEC);
    let r = send(&app, from("192.0.2.1")).await;
    assert_eq!(r.status, StatusCode::OK);
    let policy = r.list("ratelimit-policy");
    assert_eq!(policy.len(), 2);
    assert_eq!(
        (policy[0].name(), policy[0].int("q"), policy[0].int("w")),
        ("per-minute", 10, 60)
    );
    // A 2.5 s period is announced as 3 whole seconds.
    assert_eq!(
        (policy[1].name(), policy[1].int("q"), policy[1].int("w")),
        ("burst", 2, 3)
    );
    let state = r.list("ratelimit");
    assert_eq!(
        (state[0].name(), state[0].int("r"), state[0].int("t")),
        ("per-minute", 9, 45)
    );
    // One of two units used; it returns in 1.25 s, announced as 2.
    assert_eq!(
        (state[1].name(), state[1].int("r"), state[1].int("t")),
        ("burst", 1, 2)
    );
    assert!(r.header("retry-after").is_none());

    send(&app, from("192.0.2.1")).await;
    let refused = send(&app, from("192.0.2.1")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let state = refused.list("ratelimit");
    assert_eq!((state[0].int("r"), state[1].int("r")), (8, 0));
    assert_eq!(refused.header("retry-after"), Some("2"));
    let problem = refused.json();
    assert_eq!(problem["type"], QUOTA_EXCEEDED);
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["violated-policies"], serde_json::json!(["burst"]));
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
}

#[tokio::test]
async fn draft6_and_legacy_headers_show_the_binding_quota() {
    for style in [HeaderStyle::Draft6, HeaderStyle::Legacy] {
        let c = clock();
        let set = QuotaSet::new(
            "api",
            [
                Quota::fixed_window(10, 60 * SEC).build().unwrap(),
                Quota::fixed_window(2, 10 * SEC).build().unwrap(),
            ],
        )
        .unwrap();
        let layer = RateLimitLayer::builder(limiter(&c, set), PeerIp::new())
            .header_style(style)
            .build();
        let app = app(layer);
        c.advance(3 * SEC);
        let r = send(&app, from("192.0.2.1")).await;
        let prefix = if style == HeaderStyle::Draft6 {
            "ratelimit"
        } else {
            "x-ratelimit"
        };
        let h = |n: &str| r.header(&format!("{prefix}-{n}")).map(str::to_owned);
        assert_eq!(h("limit").as_deref(), Some("2"), "{style:?}");
        assert_eq!(h("remaining").as_deref(), Some("1"));
        assert_eq!(h("reset").as_deref(), Some("7"));
        assert!(r.header("ratelimit").is_none() && r.header("ratelimit-policy").is_none());
        send(&app, from("192.0.2.1")).await;
        let refused = send(&app, from("192.0.2.1")).await;
        assert_eq!(refused.header("retry-after"), Some("7"));
        let legacy_retry = refused.header("x-ratelimit-retry-after");
        if style == HeaderStyle::Legacy {
            assert_eq!(legacy_retry, Some("7"));
        } else {
            assert_eq!(legacy_retry, None);
        }
    }
}

#[tokio::test]
async fn no_header_style_still_says_when_to_retry() {
    let c = clock();
    let layer = RateLimitLayer::builder(
        limiter(&c, Quota::gcra(1, 60 * SEC).build().unwrap()),
        PeerIp::new(),
    )
    .header_style(HeaderStyle::None)
    .build();
    let app = app(layer);
    let ok = send(&app, from("192.0.2.1")).await;
    assert!(ok.headers.keys().all(|k| !k.as_str().contains("ratelimit")));
    let refused = send(&app, from("192.0.2.1")).await;
    assert_eq!(refused.header("retry-after"), Some("60"));
}

#[tokio::test]
async fn retry_after_rounds_up_and_a_retry_after_it_passes() {
    let c = clock();
    let app = app(RateLimitLayer::new(
        limiter(
            &c,
            Quota::gcra(1, Duration::from_millis(1500)).build().unwrap(),
        ),
        PeerIp::new(),
    ));
    assert_eq!(send(&app, from("192.0.2.1")).await.status, StatusCode::OK);
    c.advance(Duration::from_millis(10));
    let refused = send(&app, from("192.0.2.1")).await;
    // 1.49 s to wait: told 2, never 1 (which would be another 429).
    assert_eq!(refused.header("retry-after"), Some("2"));
    c.advance(SEC);
    assert_eq!(
        send(&app, from("192.0.2.1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    c.advance(SEC);
    assert_eq!(send(&app, from("192.0.2.1")).await.status, StatusCode::OK);
}

#[tokio::test]
async fn shadow_mode_never_refuses_but_still_reports() {
    let c = clock();
    let quota = Quota::fixed_window(1, 60 * SEC)
        .mode(Mode::Shadow)
        .build()
        .unwrap();
    let app = app(RateLimitLayer::new(limiter(&c, quota), PeerIp::new()));
    send(&app, from("192.0.2.1")).await;
    let r = send(&app, from("192.0.2.1")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.list("ratelimit")[0].int("r"), 0);
    assert!(r.header("retry-after").is_none());
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_delays_the_request_instead_of_refusing() {
    let c = clock();
    let quota = Quota::leaky_bucket(2, SEC).build().unwrap();
    let app = app(RateLimitLayer::new(limiter(&c, quota), PeerIp::new()));
    let start = tokio::time::Instant::now();
    assert_eq!(send(&app, from("192.0.2.1")).await.status, StatusCode::OK);
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(send(&app, from("192.0.2.1")).await.status, StatusCode::OK);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(500),
        "held for its turn"
    );
    // The queue of two is full now (the manual clock did not move).
    assert_eq!(
        send(&app, from("192.0.2.1")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    let c = clock();
    let layer = RateLimitLayer::builder(
        limiter(&c, Quota::leaky_bucket(2, SEC).build().unwrap()),
        PeerIp::new(),
    )
    .on_delay(OnDelay::Reject)
    .build();
    let app = self::app(layer);
    send(&app, from("192.0.2.1")).await;
    let r = send(&app, from("192.0.2.1")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
}

#[tokio::test]
async fn routes_carry_their_own_quotas_and_costs() {
    let c = clock();
    let backend = MemoryBackend::builder().clock(c.clone()).build();
    let cheap = Limiter::new(
        backend.clone(),
        QuotaSet::new(
            "cheap",
            [Quota::fixed_window(10, 60 * SEC).build().unwrap()],
        )
        .unwrap(),
    );
    let costly = Limiter::new(
        backend,
        QuotaSet::new(
            "costly",
            [Quota::token_bucket(10, 60 * SEC).build().unwrap()],
        )
        .unwrap(),
    );
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(RateLimitLayer::new(cheap, PeerIp::new()))
        .route(
            "/export",
            post(|| async { "exported" }).layer(
                RateLimitLayer::builder(costly, PeerIp::new())
                    .cost(|parts| {
                        if parts.uri.query() == Some("full") {
                            5
                        } else {
                            2
                        }
                    })
                    .build(),
            ),
        );
    let export = |q: &str| {
        let mut req = Request::post(format!("/export?{q}"))
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1))));
        req
    };
    assert_eq!(
        send(&app, export("full")).await.list("ratelimit")[0].int("r"),
        5
    );
    assert_eq!(send(&app, export("full")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, export("part")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The cheap route counts separately.
    let r = send(&app, from("192.0.2.1")).await;
    assert_eq!(
        (r.status, r.list("ratelimit")[0].int("r")),
        (StatusCode::OK, 9)
    );
}

#[tokio::test]
async fn nested_layers_report_every_policy() {
    let c = clock();
    let backend = MemoryBackend::builder().clock(c.clone()).build();
    let outer = Limiter::new(
        backend.clone(),
        QuotaSet::new(
            "outer",
            [Quota::gcra(5, 60 * SEC).name("app").build().unwrap()],
        )
        .unwrap(),
    );
    let inner = Limiter::new(
        backend,
        QuotaSet::new(
            "inner",
            [Quota::gcra(2, 60 * SEC).name("route").build().unwrap()],
        )
        .unwrap(),
    );
    let app = Router::new()
        .route(
            "/",
            get(|| async { "ok" }).layer(RateLimitLayer::new(inner, PeerIp::new())),
        )
        .layer(RateLimitLayer::new(outer, PeerIp::new()));
    let r = send(&app, from("192.0.2.1")).await;
    let names: Vec<String> = r
        .list("ratelimit")
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    assert_eq!(names, ["route", "app"]);
    assert_eq!(r.list("ratelimit-policy").len(), 2);
}

#[tokio::test]
async fn a_custom_rejection_response_keeps_the_headers() {
    let c = clock();
    let layer = RateLimitLayer::builder(
        limiter(&c, Quota::gcra(1, 60 * SEC).build().unwrap()),
        PeerIp::new(),
    )
    .rejection_response(|r| {
        let mut resp = Response::new(Bytes::from(format!("slow down, {}", r.key)));
        *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        resp
    })
    .build();
    let app = app(layer);
    send(&app, from("192.0.2.1")).await;
    let r = send(&app, from("192.0.2.1")).await;
    assert_eq!(r.body, "slow down, ip:192.0.2.1");
    assert_eq!(r.header("retry-after"), Some("60"));
    assert_eq!(r.list("ratelimit")[0].int("r"), 0);
}

#[tokio::test]
async fn any_tower_service_and_body_type_can_be_limited() {
    use tower::{Service, ServiceBuilder, service_fn};
    let c = clock();
    let layer = RateLimitLayer::new(
        limiter(&c, Quota::gcra(1, 60 * SEC).build().unwrap()),
        tollgate::key::GlobalKey,
    );
    // A plain tower service with its own request and response body types.
    let mut svc =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|req: Request<String>| async move {
                Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                    Bytes::from(req.into_body()),
                )))
            }));
    let first = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new("ping".to_owned()))
        .await
        .unwrap();
    assert_eq!(reply(first).await.body, "ping");
    let second = svc
        .ready()
        .await
        .unwrap()
        .call(Request::new("ping".to_owned()))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A service that is ready only when told, and then fails readiness.
#[derive(Clone)]
struct Gatekeeper(std::sync::Arc<std::sync::atomic::AtomicU8>);

impl tower::Service<Request<Body>> for Gatekeeper {
    type Response = Response<String>;
    type Error = &'static str;
    type Future = std::future::Ready<Result<Response<String>, &'static str>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        match self.0.load(std::sync::atomic::Ordering::SeqCst) {
            0 => std::task::Poll::Pending,
            1 => std::task::Poll::Ready(Ok(())),
            _ => std::task::Poll::Ready(Err("inner not ready")),
        }
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        std::future::ready(Ok(Response::new("ok".into())))
    }
}

#[tokio::test]
async fn poll_ready_passes_through() {
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::task::{Context, Poll, Waker};
    use tower::{Layer, Service};
    let c = clock();
    let state = std::sync::Arc::new(AtomicU8::new(0));
    let layer = RateLimitLayer::new(
        limiter(&c, Quota::gcra(5, SEC).build().unwrap()),
        PeerIp::new(),
    );
    let mut svc = layer.layer(Gatekeeper(state.clone()));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(
        svc.poll_ready(&mut cx).is_pending(),
        "pending while the inner service is"
    );
    state.store(1, Ordering::SeqCst);
    assert!(matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))));
    let r = svc.call(from("192.0.2.1")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    state.store(2, Ordering::SeqCst);
    assert!(matches!(
        svc.poll_ready(&mut cx),
        Poll::Ready(Err("inner not ready"))
    ));
}

/// The header lines and body a README output block shows.
fn documented(block: &str) -> (u16, Vec<(String, String)>, String) {
    let mut lines = block.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    let mut headers = Vec::new();
    let mut body = String::new();
    for line in lines {
        match line.split_once(": ") {
            Some((name, value)) if body.is_empty() && !line.starts_with('{') => {
                headers.push((name.to_owned(), value.to_owned()))
            }
            _ => body.push_str(line),
        }
    }
    (status.parse().unwrap(), headers, body)
}

// The example itself, so that the README's output is checked against the
// code users run (its `main` is not called here).
#[allow(dead_code)]
#[path = "../../examples/quickstart.rs"]
mod quickstart;

#[tokio::test]
async fn the_readme_axum_example_prints_what_the_readme_shows() {
    let readme = include_str!("../../README.md");
    let shown = readme
        .split_once("the sixth within 10 s")
        .expect("the README shows the quickstart's output")
        .1;
    let blocks: Vec<&str> = shown
        .split("```text\n")
        .skip(1)
        .take(2)
        .map(|b| b.split("```").next().unwrap().trim_end())
        .collect();
    // The quickstart's own app, which the README shows.
    let app = quickstart::app().unwrap();
    let addr = support::serve(app).await;
    let client = support::client();
    let mut replies = Vec::new();
    for _ in 0..6 {
        replies.push(support::get(&client, addr, "/", &[]).await);
    }
    for (block, reply) in blocks.iter().zip([&replies[0], &replies[5]]) {
        let (status, headers, body) = documented(block);
        assert_eq!(reply.status.as_u16(), status, "{block}");
        for (name, value) in headers {
            assert_eq!(
                reply.header(&name),
                Some(value.as_str()),
                "{name} in\n{block}"
            );
        }
        assert_eq!(reply.body.trim_end(), body, "{block}");
    }
}

/// What a handler read of the decision the layer handed it.
async fn remaining(decision: Option<axum::Extension<Decision>>) -> String {
    match decision {
        Some(axum::Extension(d)) => format!("{} left", d.remaining()),
        None => "no decision".to_owned(),
    }
}

#[tokio::test]
async fn a_handler_reads_the_decision_from_the_request_extensions() {
    let c = clock();
    let quota = || Quota::gcra(3, 60 * SEC).build().unwrap();
    let handed = Router::new().route("/", get(remaining)).layer(
        RateLimitLayer::builder(limiter(&c, quota()), PeerIp::new())
            .decision_in_extensions(true)
            .build(),
    );
    assert_eq!(send(&handed, from("192.0.2.1")).await.body, "2 left");
    assert_eq!(send(&handed, from("192.0.2.1")).await.body, "1 left");
    // Decided on the awaited path (a key found asynchronously) too.
    let awaited = Router::new().route("/", get(remaining)).layer(
        RateLimitLayer::builder(limiter(&c, quota()), Async(PeerIp::new()))
            .decision_in_extensions(true)
            .build(),
    );
    assert_eq!(send(&awaited, from("192.0.2.1")).await.body, "2 left");
    // Off by default.
    let plain = Router::new()
        .route("/", get(remaining))
        .layer(RateLimitLayer::new(limiter(&c, quota()), PeerIp::new()));
    assert_eq!(send(&plain, from("192.0.2.1")).await.body, "no decision");
}

/// What a handler read of the reason the layer handed it.
async fn reason(reason: Option<axum::Extension<Reason>>) -> String {
    match reason {
        Some(axum::Extension(r)) => r.as_str().to_owned(),
        None => "no reason".to_owned(),
    }
}

#[tokio::test]
async fn every_decision_carries_its_reason_to_handlers_bodies_and_outer_layers() {
    let c = clock();
    let api_key = || HeaderKey::new(http::HeaderName::from_static("x-api-key"));
    fn handed(c: &ManualClock, quota: Quota, key: impl KeyExtractor) -> Router {
        Router::new().route("/", get(reason)).layer(
            RateLimitLayer::builder(limiter(c, quota), key)
                .decision_in_extensions(true)
                .on_missing_key(OnMissingKey::Allow)
                .build(),
        )
    }
    let gcra = || Quota::gcra(1, 60 * SEC).build().unwrap();
    let app = handed(&c, gcra(), api_key());
    let alice = || request("192.0.2.1", &[("x-api-key", b"alice")]);
    assert_eq!(send(&app, alice()).await.body, "admitted");
    // A request with no key, let through by the policy: a reason, no
    // decision.
    assert_eq!(send(&app, from("192.0.2.1")).await.body, "no_key");

    // Refused: the body says why, and so do the response's extensions
    // for the layers around this one.
    let refused = app.clone().oneshot(alice()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.extensions().get::<Reason>(), Some(&Reason::Quota));
    let body = reply(refused).await.body;
    assert!(body.contains(r#""reason":"quota""#), "{body}");

    // A shadow quota past its limit admits, and says so.
    let shadow = Quota::gcra(1, 60 * SEC).mode(Mode::Shadow).build().unwrap();
    let app = handed(&c, shadow, api_key());
    assert_eq!(send(&app, alice()).await.body, "admitted");
    assert_eq!(send(&app, alice()).await.body, "shadow");

    // The awaited path gives the same reasons.
    let app = handed(&c, gcra(), Async(api_key()));
    assert_eq!(send(&app, alice()).await.body, "admitted");
    let refused = app.clone().oneshot(alice()).await.unwrap();
    assert_eq!(refused.extensions().get::<Reason>(), Some(&Reason::Quota));
}
