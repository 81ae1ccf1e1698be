//! An axum app rate-limited in memory by client IP, with one stricter and
//! more expensive route.
//!
//! Run with `cargo run --example quickstart` (`PORT` overrides 3000), then
//! follow what it prints.

use std::net::SocketAddr;
use std::time::Duration;

use axum::{Router, routing::get, routing::post};
use tollgate::key::PeerIp;
use tollgate::{Limiter, MemoryBackend, Quota, QuotaSet, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "tollgate=debug,info".into()),
        )
        .init();

    let app = app()?;

    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr = listener.local_addr()?;
    println!("tollgate quickstart listening on http://{addr}");
    println!("  every route: 5 requests per 10 s per client IP");
    println!("  POST /report: also 6 units a minute, each report costs 3 (so 2 a minute)");
    println!();
    println!("try:");
    println!(
        "  for i in $(seq 3); do curl -si -X POST http://{addr}/report | grep -Ei '^(HTTP|ratelimit|retry-after)'; done"
    );
    println!(
        "  for i in $(seq 7); do curl -si http://{addr}/ | grep -Ei '^(HTTP|ratelimit|retry-after)'; done"
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

/// The app: the part the README shows, and that a test serves to check the
/// README's output against it.
pub fn app() -> Result<Router, Box<dyn std::error::Error>> {
    // One backend for the whole app; each layer keeps its own counters
    // because its quota set has its own name.
    let backend = MemoryBackend::new();

    // Everything: 5 requests per 10 seconds per client IP, bursts allowed.
    let everywhere = Limiter::new(
        backend.clone(),
        QuotaSet::new("app", [Quota::gcra(5, Duration::from_secs(10)).build()?])?,
    );
    // /report: 6 units a minute, and each report costs 3.
    let reports = Limiter::new(
        backend,
        QuotaSet::new(
            "reports",
            [Quota::sliding_window(6, Duration::from_secs(60)).build()?],
        )?,
    );

    Ok(Router::new()
        .route(
            "/report",
            post(|| async { "report queued\n" }).layer(
                RateLimitLayer::builder(reports, PeerIp::new())
                    .cost(|_| 3)
                    .build(),
            ),
        )
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(everywhere, PeerIp::new())))
}
