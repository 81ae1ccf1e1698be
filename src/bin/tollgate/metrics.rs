//! `--metrics-listen ADDR`: Prometheus text at `/metrics`, on a listener of
//! its own so that the limited port never exposes it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Decision latency buckets, in seconds: an in-memory decision takes about a
/// microsecond, a Redis round trip a fraction of a millisecond to the
/// timeout.
const LATENCY_BUCKETS: [f64; 12] = [
    1e-6, 5e-6, 2.5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.25,
];

/// How often histograms are compacted between scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder. Called before the rules are loaded:
/// limiters register their metrics when they are built.
pub fn install() -> Result<PrometheusHandle, String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("tollgate_decision_duration_seconds".into()),
            &LATENCY_BUCKETS,
        )
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("cannot start the metrics recorder: {e}"))
}

/// Serves `/metrics` at `addr` until the process ends, with the same header
/// timeout, connection cap and header size cap as the limited port: a scraper
/// port is no less exposed to slow clients.
pub async fn serve(
    addr: SocketAddr,
    handle: PrometheusHandle,
    limits: super::server::Limits,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(listen = %listener.local_addr()?, "metrics at /metrics");
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(handle);
    tokio::spawn(super::server::serve(
        listener,
        app,
        limits,
        Arc::new(|_| false),
        std::future::pending(),
    ));
    Ok(())
}

async fn scrape(State(handle): State<PrometheusHandle>) -> impl IntoResponse {
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
}
