//! The gateway as an HTTP intermediary, in front of a real upstream that
//! sends rate-limit fields of its own and echoes the request head it got:
//! the origin's `RateLimit`/`RateLimit-Policy` survive with the gateway's
//! added (draft-11 section 7.2), `X-Forwarded-Proto`/`-Host` say how the
//! client came, and fields named in `Connection` stop at each hop.
#![cfg(feature = "gateway")]

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use support::gateway::{Gateway, RulesFile};
use support::{Reply, reply};

const RULES: &str = r#"
rules:
  - name: api
    key: header:x-api-key
    quotas: [{ name: gw, algorithm: fixed_window, limit: 5, period: 1h }]
"#;

/// An origin that limits too, and answers with the request's head as JSON
/// (`{"name": ["value", ...]}`).
async fn origin() -> SocketAddr {
    let app = Router::new().fallback(|req: Request| async move {
        let mut seen = serde_json::Map::new();
        for name in req.headers().keys() {
            let values = req
                .headers()
                .get_all(name)
                .iter()
                .map(|v| serde_json::Value::from(v.to_str().unwrap()))
                .collect();
            seen.insert(name.to_string(), serde_json::Value::Array(values));
        }
        Response::builder()
            .header("ratelimit-policy", r#""origin";q=100;w=60"#)
            .header("ratelimit", r#""origin";r=99;t=60"#)
            .header("connection", "x-origin-hop")
            .header("x-origin-hop", "for the gateway only")
            .header("x-origin-end", "for the client")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(
                serde_json::Value::Object(seen).to_string(),
            ))
            .unwrap()
    });
    support::serve(app).await
}

/// Sends one request exactly as written (a pooled client would manage
/// `Connection` itself).
async fn send(gw: &Gateway, headers: &[(&str, &str)]) -> Reply {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = http::Request::get("/orders?id=7");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = sender
            .send_request(req.body(Empty::<Bytes>::new()).unwrap())
            .await
            .unwrap();
        reply(resp).await
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the gateway did not answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_origins_fields_survive_and_hop_fields_stop_at_the_gateway() {
    let up = origin().await;
    let rules = RulesFile::new("intermediary", RULES);
    let gw = Gateway::start(&rules.0, Some(up), &[]);
    let answer = send(
        &gw,
        &[
            ("host", "shop.example:8443"),
            ("x-api-key", "k1"),
            ("connection", "keep-alive, x-client-hop"),
            ("x-client-hop", "for the gateway only"),
            ("x-client-end", "for the origin"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "claimed.example"),
        ],
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);

    // Both limiters' policies and numbers, the origin's first and intact.
    let policies = answer.list("ratelimit-policy");
    let names: Vec<&str> = policies.iter().map(|m| m.name()).collect();
    assert_eq!(names, ["origin", "gw"], "{policies:?}");
    assert_eq!((policies[0].int("q"), policies[0].int("w")), (100, 60));
    assert_eq!(policies[1].int("q"), 5);
    let limits = answer.list("ratelimit");
    let names: Vec<&str> = limits.iter().map(|m| m.name()).collect();
    assert_eq!(names, ["origin", "gw"], "{limits:?}");
    assert_eq!((limits[0].int("r"), limits[0].int("t")), (99, 60));
    assert_eq!(limits[1].int("r"), 4);

    // The origin's hop field stayed with the gateway; its end field did not.
    assert_eq!(answer.header("x-origin-hop"), None);
    assert_eq!(answer.header("x-origin-end"), Some("for the client"));
    assert!(
        answer
            .headers
            .get_all("connection")
            .iter()
            .all(|v| !v.to_str().unwrap().contains("x-origin-hop")),
        "{:?}",
        answer.headers
    );

    // What the origin saw.
    let seen = answer.json();
    let one = |name: &str| -> Option<String> {
        let values = seen.get(name)?.as_array().unwrap();
        assert_eq!(values.len(), 1, "{name}: {values:?}");
        Some(values[0].as_str().unwrap().to_owned())
    };
    assert_eq!(one("x-forwarded-proto").as_deref(), Some("http"));
    assert_eq!(
        one("x-forwarded-host").as_deref(),
        Some("shop.example:8443")
    );
    assert_eq!(one("x-client-hop"), None, "named in Connection: {seen}");
    assert_eq!(one("x-client-end").as_deref(), Some("for the origin"));
    assert_eq!(one("connection"), None);
    assert_eq!(one("x-api-key").as_deref(), Some("k1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_by_the_gateway_carries_only_the_gateways_fields() {
    let up = origin().await;
    let rules = RulesFile::new("intermediary-429", &RULES.replace("limit: 5", "limit: 1"));
    let gw = Gateway::start(&rules.0, Some(up), &[]);
    let first = send(&gw, &[("host", "h"), ("x-api-key", "k2")]).await;
    assert_eq!(first.status, StatusCode::OK);
    let refused = send(&gw, &[("host", "h"), ("x-api-key", "k2")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let names: Vec<String> = refused
        .list("ratelimit")
        .iter()
        .map(|m| m.name().to_owned())
        .collect();
    assert_eq!(names, ["gw"], "the origin was never asked");
}
