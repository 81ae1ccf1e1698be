//! An overload run: a handler that serves 200 requests a second (4 workers,
//! 20 ms each) offered 600 a second (3x) for 4 s, 5% of them critical (within the 20% reserved),
//! with load shedding off and on. Prints goodput and the critical requests'
//! success rate and latency percentiles; bounded in time (4 s of load, 2 s
//! client timeout).
//!
//! `cargo run --release --example overload`

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;
use tollgate::key::GlobalKey;
use tollgate::layer::{MeasuredLoad, Priority, Shedding};
use tollgate::{Limiter, MemoryBackend, Quota, RateLimitLayer};

const WORKERS: usize = 4;
const WORK: Duration = Duration::from_millis(20);
const OFFERED_PER_SEC: u64 = 600;
const RUN: Duration = Duration::from_secs(4);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

async fn serve(shed: bool) -> SocketAddr {
    let workers = Arc::new(Semaphore::new(WORKERS));
    let work = move || {
        let workers = Arc::clone(&workers);
        async move {
            let Ok(_worker) = workers.acquire().await else {
                return "closed";
            };
            tokio::time::sleep(WORK).await;
            "done"
        }
    };
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .build()
        .expect("quota");
    let mut layer = RateLimitLayer::builder(Limiter::new(MemoryBackend::new(), quota), GlobalKey);
    if shed {
        // Full at twice the workers in flight: a short queue, no more.
        layer = layer
            .measure_load(MeasuredLoad::new(
                2 * WORKERS as u64,
                Duration::from_millis(200),
            ))
            .shed(Shedding::new().priority(|parts| {
                if parts.uri.path() == "/critical" {
                    Priority::Critical
                } else {
                    Priority::Normal
                }
            }));
    }
    let app = Router::new()
        .route("/critical", get(work.clone()))
        .route("/normal", get(work))
        .layer(layer.build());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

struct Outcome {
    critical: bool,
    ok: bool,
    status: u16,
    latency: Duration,
}

async fn run(shed: bool) {
    let addr = serve(shed).await;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / OFFERED_PER_SEC as u32);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let mut n = 0u64;
    while started.elapsed() < RUN {
        tick.tick().await;
        n += 1;
        let critical = n % 20 == 0;
        let path = if critical { "critical" } else { "normal" };
        let uri = format!("http://{addr}/{path}");
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let req = http::Request::get(uri).body(Empty::new()).expect("request");
            let reply = tokio::time::timeout(CLIENT_TIMEOUT, async {
                let resp = client.request(req).await.ok()?;
                let status = resp.status().as_u16();
                resp.into_body().collect().await.ok()?;
                Some(status)
            })
            .await;
            let status = reply.ok().flatten().unwrap_or(0);
            Outcome {
                critical,
                ok: status == 200,
                status,
                latency: sent.elapsed(),
            }
        }));
    }
    let mut outcomes = Vec::new();
    for t in tasks {
        if let Ok(o) = t.await {
            outcomes.push(o);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let served = outcomes.iter().filter(|o| o.ok).count();
    let shed_count = outcomes.iter().filter(|o| o.status == 503).count();
    let timeouts = outcomes.iter().filter(|o| o.status == 0).count();
    let critical: Vec<&Outcome> = outcomes.iter().filter(|o| o.critical).collect();
    let critical_ok = critical.iter().filter(|o| o.ok).count();
    // Latency of every critical request, failures included (a timeout
    // counts as the 2 s it took).
    let mut lat: Vec<Duration> = critical.iter().map(|o| o.latency).collect();
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "| {} | {} | {:.0} | {} | {} | {:.1}% | {:.0} ms | {:.0} ms |",
        if shed { "on" } else { "off" },
        outcomes.len(),
        served as f64 / elapsed,
        shed_count,
        timeouts,
        100.0 * critical_ok as f64 / critical.len() as f64,
        pct(0.5).as_secs_f64() * 1000.0,
        pct(0.99).as_secs_f64() * 1000.0,
    );
}

#[tokio::main]
async fn main() {
    println!(
        "capacity {} req/s ({WORKERS} workers x {WORK:?}), offered {OFFERED_PER_SEC} req/s for {RUN:?}, 5% critical",
        WORKERS as f64 / WORK.as_secs_f64()
    );
    println!(
        "| shedding | requests | goodput (200/s) | shed (503) | timed out | critical served | critical p50 | critical p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    run(false).await;
    // Let the first run's stragglers finish before the second.
    tokio::time::sleep(CLIENT_TIMEOUT).await;
    run(true).await;
}
