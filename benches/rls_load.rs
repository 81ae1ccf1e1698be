//! Load for `tollgate rls` and for Envoy in front of it (BENCHMARKS.md):
//!
//! ```text
//! rls_load grpc ADDR STREAMS SECONDS [KEYS]     ShouldRateLimit calls on STREAMS concurrent
//!                                               streams of one HTTP/2 connection, over
//!                                               KEYS users (10 000; 1 for one hot key)
//! rls_load http ADDR CONNS SECONDS              GET / with x-user on CONNS HTTP/1.1 connections
//! rls_load upstream ADDR                        an upstream that answers 200 "ok"
//! ```
//!
//! Each run prints one line: calls per second, p50 and p99 latency, and
//! the answers by kind. Keys rotate over 10 000 users unless told.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// The request and response of `ShouldRateLimit`, with Envoy's field
/// numbers: only what the load needs.
#[derive(Clone, PartialEq, prost::Message)]
struct Request {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<Descriptor>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Descriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<Entry>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Entry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Response {
    #[prost(int32, tag = "1")]
    overall_code: i32,
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    latencies: Vec<u32>,
    ok: u64,
    refused: u64,
    errors: u64,
}

fn report(what: &str, seconds: f64, tallies: Vec<Tally>) {
    let mut all: Vec<u32> = Vec::new();
    let (mut ok, mut refused, mut errors) = (0, 0, 0);
    for t in tallies {
        all.extend(t.latencies);
        ok += t.ok;
        refused += t.refused;
        errors += t.errors;
    }
    all.sort_unstable();
    let at = |q: f64| {
        all.get(((all.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0)
    };
    println!(
        "{what}: {:.0}/s p50 {} us p99 {} us (ok {ok}, refused {refused}, errors {errors})",
        all.len() as f64 / seconds,
        at(0.5),
        at(0.99)
    );
}

async fn grpc(addr: String, streams: usize, seconds: u64, keys: usize) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an address")
        .connect()
        .await
        .expect("connect to the service");
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..streams {
        let mut client = tonic::client::Grpc::new(channel.clone());
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let path = http::uri::PathAndQuery::from_static(
                "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            );
            let mut i = w * 7919;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let request = Request {
                    domain: "bench".into(),
                    descriptors: vec![Descriptor {
                        entries: vec![Entry {
                            key: "user".into(),
                            value: format!("u{}", i % keys),
                        }],
                    }],
                };
                let started = Instant::now();
                if client.ready().await.is_err() {
                    tally.errors += 1;
                    continue;
                }
                let codec = tonic_prost::ProstCodec::<Request, Response>::default();
                let answer = client
                    .unary(tonic::Request::new(request), path.clone(), codec)
                    .await;
                tally.latencies.push(started.elapsed().as_micros() as u32);
                match answer.map(|r| r.into_inner().overall_code) {
                    Ok(1) => tally.ok += 1,
                    Ok(_) => tally.refused += 1,
                    Err(_) => tally.errors += 1,
                }
            }
            tally
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut tallies = Vec::new();
    for w in workers {
        tallies.push(w.await.expect("a worker"));
    }
    report(
        &format!("grpc {streams} streams"),
        started.elapsed().as_secs_f64(),
        tallies,
    );
}

async fn http(addr: String, conns: usize, seconds: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..conns {
        // One client each, one connection each: keep-alive, one at a time.
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1)
            .build_http::<Empty<bytes::Bytes>>();
        let (stop, addr) = (Arc::clone(&stop), addr.clone());
        workers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            let mut i = w * 7919;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let request = http::Request::get(format!("http://{addr}/"))
                    .header("x-user", format!("u{}", i % 10_000))
                    .body(Empty::new())
                    .expect("a request");
                let started = Instant::now();
                let answer = client.request(request).await;
                match answer {
                    Ok(r) => {
                        let status = r.status();
                        let _ = r.into_body().collect().await;
                        tally.latencies.push(started.elapsed().as_micros() as u32);
                        if status.is_success() {
                            tally.ok += 1;
                        } else {
                            tally.refused += 1;
                        }
                    }
                    Err(_) => tally.errors += 1,
                }
            }
            tally
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut tallies = Vec::new();
    for w in workers {
        tallies.push(w.await.expect("a worker"));
    }
    report(
        &format!("http {conns} connections"),
        started.elapsed().as_secs_f64(),
        tallies,
    );
}

async fn upstream(addr: String) {
    let app = axum::Router::new().fallback(|| async { "ok" });
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    axum::serve(listener, app).await.expect("serve");
}

#[tokio::main]
async fn main() {
    // `cargo bench` runs every bench target with `--bench`; a harness is run
    // with its own arguments (by a script, or under valgrind) and does
    // nothing then.
    if std::env::args().any(|a| a == "--bench") {
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| -> u64 { args.get(i).and_then(|s| s.parse().ok()).expect("a number") };
    match args.first().map(String::as_str) {
        Some("grpc") => {
            let keys = args.get(4).and_then(|k| k.parse().ok()).unwrap_or(10_000);
            grpc(args[1].clone(), number(2) as usize, number(3), keys).await
        }
        Some("http") => http(args[1].clone(), number(2) as usize, number(3)).await,
        Some("upstream") => upstream(args[1].clone()).await,
        _ => eprintln!(
            "usage: rls_load grpc ADDR STREAMS SECONDS | http ADDR CONNS SECONDS | upstream ADDR"
        ),
    }
}
