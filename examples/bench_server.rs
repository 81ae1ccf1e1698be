//! The server `scripts/bench-http.sh` loads: an axum hello-world, bare or
//! behind a rate limiter whose limit is never reached (so what is measured is
//! the cost of deciding, on every request).
//!
//! `MODE=bare|tollgate|governor|tollgate-redis|tollgate-redis-lease [PORT=8000] cargo run --release --example bench_server`
//! (`tollgate-redis` and `tollgate-redis-lease`, leases on, need `--features redis`
//! and `REDIS_URL`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get};
use tollgate::key::PeerIp;
use tollgate::{Limiter, MemoryBackend, Quota, RateLimitLayer};

#[path = "../benches/support/peers.rs"]
mod peers;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mode = std::env::var("MODE").unwrap_or_else(|_| "bare".into());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(8000);
    let app = Router::new().route("/", get(|| async { "hello" }));
    let app = match mode.as_str() {
        "bare" => app,
        "tollgate" => {
            let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
                .burst(peers::NEVER_SPENT)
                .build()?;
            app.layer(RateLimitLayer::new(
                Limiter::new(MemoryBackend::new(), quota),
                PeerIp::new(),
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
            let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
                .burst(peers::NEVER_SPENT)
                .build()?;
            app.layer(RateLimitLayer::new(
                Limiter::new(backend, quota),
                PeerIp::new(),
            ))
        }
        "governor" => app.layer(peers::governor_layer()),
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
