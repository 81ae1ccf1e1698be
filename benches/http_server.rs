//! The server `scripts/bench-http.sh` loads: an axum hello-world, bare or
//! behind a rate limiter whose limit is never reached (so what is measured is
//! the cost of deciding, on every request).
//!
//! `cargo build --release --bench http_server`, then
//! `MODE=bare|tollgate|tollgate-global|tollgate-global-batched|governor|tollgate-redis|tollgate-redis-lease [PORT=8000] target/release/deps/http_server-*`
//! (`tollgate-redis` and `tollgate-redis-lease`, leases on, need `--features redis`
//! and `REDIS_URL`).
//!
//! Modes that split tollgate's cost into its parts (BENCHMARKS.md, "Over
//! HTTP"): `passthrough` (a layer that does nothing),
//! `passthrough-boxed` (one that changes the response body's type, which
//! axum then boxes), `static-headers` (one that adds two fixed lines as long
//! as tollgate's IETF fields), `tollgate-unkeyed` (tollgate with no key found,
//! so no decision, and the request let through), `tollgate-no-headers` and
//! `tollgate-draft6` (tollgate with those header styles).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::{Router, routing::get};
use http::{HeaderValue, Response};
use tollgate::key::{GlobalKey, KeyError, KeyExtractor, KeyFuture, PeerIp};
use tollgate::{HeaderStyle, Limiter, MemoryBackend, OnMissingKey, Quota, RateLimitLayer};

#[path = "support/peers.rs"]
mod peers;

/// A key never found.
struct NoKey;

impl KeyExtractor for NoKey {
    fn extract(&self, _: &http::request::Parts) -> KeyFuture {
        KeyFuture::ready(Err(KeyError::NoPeerAddress))
    }
}

/// A limit the load never reaches.
fn never_reached() -> Result<Quota, tollgate::QuotaError> {
    Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(peers::NEVER_SPENT)
        .build()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` runs every bench target with `--bench`; a harness is run
    // with its own arguments (by a script, or under valgrind) and does
    // nothing then.
    if std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let mode = std::env::var("MODE").unwrap_or_else(|_| "bare".into());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8000);
    let app = Router::new().route("/", get(|| async { "hello" }));
    let memory = || never_reached().map(|q| Limiter::new(MemoryBackend::new(), q));
    let app = match mode.as_str() {
        "bare" => app,
        "tollgate" => app.layer(RateLimitLayer::new(memory()?, PeerIp::new())),
        // One key for every request, plain and batched per core.
        "tollgate-global" => app.layer(RateLimitLayer::new(memory()?, GlobalKey)),
        "tollgate-global-batched" => {
            let backend = tollgate::backend::BatchBackend::new(MemoryBackend::new());
            app.layer(RateLimitLayer::new(
                Limiter::new(backend, never_reached()?),
                GlobalKey,
            ))
        }
        #[cfg(feature = "redis")]
        "tollgate-redis" | "tollgate-redis-lease" => {
            let url =
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
            let lease = match mode.as_str() {
                "tollgate-redis-lease" => tollgate::Lease::Auto,
                _ => tollgate::Lease::Off,
            };
            let backend = tollgate::RedisBackend::from_url(url).lease(lease).build()?;
            app.layer(RateLimitLayer::new(
                // Named: on Redis a set's name is what every server counts under.
                Limiter::new(
                    backend,
                    tollgate::QuotaSet::new("bench", [never_reached()?])?,
                ),
                PeerIp::new(),
            ))
        }
        "governor" => app.layer(peers::governor_layer()),
        "passthrough" => app.layer(tower::util::MapRequestLayer::new(|r| r)),
        "passthrough-boxed" => {
            app.layer(tower::util::MapResponseLayer::new(|r: Response<Body>| {
                r.map(|b| http_body_util::BodyExt::map_err(b, |e| e))
            }))
        }
        "static-headers" => app.layer(tower::util::MapResponseLayer::new(
            |mut r: Response<Body>| {
                let h = r.headers_mut();
                let policy = "\"1000000-per-1s\";q=1000000000000;w=1";
                h.append("ratelimit-policy", HeaderValue::from_static(policy));
                let state = "\"1000000-per-1s\";r=999999999999;t=1";
                h.append("ratelimit", HeaderValue::from_static(state));
                r
            },
        )),
        "tollgate-unkeyed" => app.layer(
            RateLimitLayer::builder(memory()?, NoKey)
                .on_missing_key(OnMissingKey::Allow)
                .build(),
        ),
        "tollgate-no-headers" | "tollgate-draft6" => {
            let style = match mode.as_str() {
                "tollgate-draft6" => HeaderStyle::Draft6,
                _ => HeaderStyle::None,
            };
            app.layer(
                RateLimitLayer::builder(memory()?, PeerIp::new())
                    .header_style(style)
                    .build(),
            )
        }
        other => return Err(format!("unknown MODE {other:?}").into()),
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
