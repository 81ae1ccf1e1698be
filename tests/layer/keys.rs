//! Keys through the layer: the route's pattern, a user with a route, an
//! extractor that awaits, bad and missing input, and a fallback on a
//! malformed key.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use http::{Request, StatusCode};
use tollgate::key::{
    ClientIp, HeaderKey, KeyExtractor, KeyExtractorExt, KeyFuture, PeerIp, RouteKey,
};
use tollgate::{OnMissingKey, Quota, RateLimitLayer};

use super::http_layer::{SEC, app, clock, from, limiter, request, send};

#[tokio::test]
async fn the_route_key_uses_the_matched_pattern() {
    let c = clock();
    let app = app(RateLimitLayer::new(
        limiter(&c, Quota::fixed_window(2, 60 * SEC).build().unwrap()),
        RouteKey,
    ));
    let item = |id: u32| {
        let mut req = Request::get(format!("/items/{id}"))
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 1))));
        req
    };
    assert_eq!(send(&app, item(1)).await.status, StatusCode::OK);
    assert_eq!(send(&app, item(2)).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, item(3)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, from("192.0.2.1")).await.status,
        StatusCode::OK,
        "/ is another route"
    );
}

#[tokio::test]
async fn bad_input_gets_the_documented_answer() {
    let c = clock();
    let trusted = ClientIp::trusted_proxies(["192.0.2.0/24".parse().unwrap()]);
    let by_ip = app(RateLimitLayer::new(
        limiter(&c, Quota::gcra(100, SEC).build().unwrap()),
        trusted,
    ));
    for xff in [&b"garbage"[..], b"1.2.3.4, not an ip", b"for=1.2.3.4"] {
        let r = send(&by_ip, request("192.0.2.1", &[("x-forwarded-for", xff)])).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{xff:?}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(
            r.json()["detail"]
                .as_str()
                .unwrap()
                .contains("forwarding header")
        );
    }
    let r = send(
        &by_ip,
        request("192.0.2.1", &[("x-forwarded-for", b"\xff\xfe")]),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        send(&by_ip, from("192.0.2.1")).await.status,
        StatusCode::OK,
        "still serving"
    );

    let by_header = app(RateLimitLayer::new(
        limiter(&c, Quota::gcra(100, SEC).build().unwrap()),
        HeaderKey::new(http::HeaderName::from_static("x-api-key")),
    ));
    let non_ascii = send(
        &by_header,
        request("192.0.2.1", &[("x-api-key", b"caf\xc3\xa9")]),
    )
    .await;
    assert_eq!(non_ascii.status, StatusCode::BAD_REQUEST);
    let huge = vec![b'k'; 1000];
    let oversized = send(&by_header, request("192.0.2.1", &[("x-api-key", &huge)])).await;
    assert_eq!(oversized.status, StatusCode::BAD_REQUEST);
    assert!(
        oversized.body.contains("over the 256 accepted"),
        "{}",
        oversized.body
    );
    assert_eq!(
        send(&by_header, from("192.0.2.1")).await.status,
        StatusCode::BAD_REQUEST,
        "no key"
    );
    let ok = send(&by_header, request("192.0.2.1", &[("x-api-key", b"abc")])).await;
    assert_eq!(ok.status, StatusCode::OK);
}

#[tokio::test]
async fn a_missing_connect_info_is_a_server_error_or_passes_when_told() {
    let c = clock();
    let no_info = || Request::get("/").body(Body::empty()).unwrap();
    let strict = app(RateLimitLayer::new(
        limiter(&c, Quota::gcra(1, SEC).build().unwrap()),
        PeerIp::new(),
    ));
    let r = send(&strict, no_info()).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.body.contains("into_make_service_with_connect_info"));

    let lenient = app(RateLimitLayer::builder(
        limiter(&c, Quota::gcra(1, SEC).build().unwrap()),
        PeerIp::new(),
    )
    .on_missing_key(OnMissingKey::Allow)
    .build());
    for _ in 0..3 {
        assert_eq!(send(&lenient, no_info()).await.status, StatusCode::OK);
    }
}

#[derive(Clone)]
struct UserId(u32);

impl std::fmt::Display for UserId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[tokio::test]
async fn user_and_route_together_form_the_key() {
    use tollgate::key::ExtensionKey;
    let c = clock();
    let app = app(RateLimitLayer::new(
        limiter(&c, Quota::fixed_window(1, 60 * SEC).build().unwrap()),
        (ExtensionKey::<UserId>::new(), RouteKey),
    ));
    let as_user = |user: u32, path: &str| {
        let mut req = Request::get(path).body(Body::empty()).unwrap();
        req.extensions_mut().insert(UserId(user));
        req
    };
    assert_eq!(send(&app, as_user(1, "/")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, as_user(1, "/")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, as_user(1, "/items/7")).await.status,
        StatusCode::OK
    );
    assert_eq!(send(&app, as_user(2, "/")).await.status, StatusCode::OK);
    // No user id: the tuple cannot be formed, so the request is refused.
    let anonymous = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(send(&app, anonymous).await.status, StatusCode::BAD_REQUEST);
}

/// Finds the account behind an API key by awaiting a lookup.
struct Lookup;

impl tollgate::key::KeyExtractor for Lookup {
    fn extract(&self, parts: &http::request::Parts) -> tollgate::key::KeyFuture {
        let api_key = parts.headers.get("x-api-key").cloned();
        tollgate::key::KeyFuture::new(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            match api_key.as_ref().and_then(|v| v.to_str().ok()) {
                Some("k1" | "k2") => Ok("account:1".into()),
                Some(_) => Ok("account:other".into()),
                None => Err(tollgate::key::KeyError::Missing("x-api-key header")),
            }
        })
    }
}

#[tokio::test]
async fn a_key_extractor_may_await() {
    let c = clock();
    let app = app(RateLimitLayer::new(
        limiter(&c, Quota::fixed_window(2, 60 * SEC).build().unwrap()),
        Lookup,
    ));
    // Two API keys of one account share its limit.
    assert_eq!(
        send(&app, request("192.0.2.1", &[("x-api-key", b"k1")]))
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        send(&app, request("192.0.2.1", &[("x-api-key", b"k2")]))
            .await
            .status,
        StatusCode::OK
    );
    let r = send(&app, request("192.0.2.1", &[("x-api-key", b"k1")])).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.list("ratelimit")[0].int("r"), 0);
    assert_eq!(
        send(&app, from("192.0.2.1")).await.status,
        StatusCode::BAD_REQUEST
    );
}

/// A key extractor that answers only after a yield, as a lookup would.
pub(super) struct Async<K>(pub(super) K);

impl<K: KeyExtractor> KeyExtractor for Async<K> {
    fn extract(&self, parts: &http::request::Parts) -> KeyFuture {
        let found = self.0.extract(parts);
        KeyFuture::new(async move {
            tokio::task::yield_now().await;
            found.await
        })
    }
}

#[tokio::test]
async fn or_falls_back_on_a_malformed_key_as_on_a_missing_one() {
    let c = clock();
    let api_key = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
    let app = app(RateLimitLayer::new(
        limiter(&c, Quota::gcra(1, 60 * SEC).build().unwrap()),
        api_key.or(PeerIp::new()),
    ));
    // A key that is not visible ASCII: counted under the client's address.
    let broken = request("192.0.2.1", &[("x-api-key", b"\xff\xfe")]);
    assert_eq!(send(&app, broken).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, from("192.0.2.1")).await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the broken key spent the address's quota"
    );
    let good = request("192.0.2.1", &[("x-api-key", b"alice")]);
    assert_eq!(send(&app, good).await.status, StatusCode::OK);
}
