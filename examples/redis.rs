//! An axum app whose limits live in Redis, so every instance of it shares
//! them.
//!
//! ```text
//! redis-server &
//! cargo run --example redis --features redis
//! PORT=3001 cargo run --example redis --features redis   # a second instance
//! ```
//!
//! `REDIS_URL` overrides `redis://127.0.0.1:6379`, `PORT` overrides 3000.
//! Requests to either instance draw from the same limits. Stop Redis while
//! it runs: requests go on, limited per instance by the in-memory fallback,
//! and are limited through Redis again once it is back (see `/stats`).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get};
use tollgate::key::PeerIp;
use tollgate::{Limiter, MemoryBackend, OnFailure, Quota, QuotaSet, RateLimitLayer, RedisBackend};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "tollgate=info,info".into()),
        )
        .init();

    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let backend = RedisBackend::from_url(&url)
        .prefix("tollgate-example:")
        .timeout(Duration::from_millis(50))
        // Without this, a Redis failure is an error and the layer's own
        // policy applies (let the request through, by default).
        .on_failure(OnFailure::Fallback(MemoryBackend::new()))
        .build()?;

    // 5 requests per 10 s per client IP, and at least 200 ms between two.
    let limiter = Limiter::new(
        backend.clone(),
        QuotaSet::new(
            "example",
            [
                Quota::gcra(5, Duration::from_secs(10))
                    .name("burst")
                    .build()?,
                Quota::min_interval(Duration::from_millis(200))
                    .name("spacing")
                    .build()?,
            ],
        )?,
    );

    let stats = backend.clone();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(limiter, PeerIp::new()))
        .route(
            "/stats",
            get(move || {
                let stats = stats.stats();
                async move { format!("{stats:#?}\n") }
            }),
        );

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("tollgate with Redis at {url}, listening on http://{addr}");
    println!("  /      : 5 requests per 10 s per client IP, 200 ms apart, shared through Redis");
    println!("  /stats : what the Redis backend did (calls, failures, cache hits, ...)");
    println!();
    println!("try:");
    println!(
        "  for i in $(seq 7); do curl -si http://{addr}/ | grep -Ei '^(HTTP|ratelimit|retry-after)'; sleep 0.3; done"
    );
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    Ok(())
}
