//! A worker pool calling a URL under a shared limit: each request waits
//! its turn, in this process or (with `--redis`) across every process
//! pointing at the same Redis, and the provider's 429s pause the pool.
//!
//! ```text
//! cargo run --example outbound --features redis -- \
//!     --url http://127.0.0.1:8080/ --rate 100/s --workers 16 --seconds 10 \
//!     [--redis redis://127.0.0.1:6379]
//! ```
//!
//! Prints the requests sent, answered 2xx, answered 429, and the largest
//! number sent in any one second.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::Quota;
use tollgate::outbound::{
    Adapt, DestinationHost, MemoryPace, OutboundLayer, PaceStore, Pacer, RedisPace,
};
use tower::{ServiceBuilder, ServiceExt};

struct Args {
    url: String,
    rate: u64,
    workers: usize,
    redis: Option<String>,
    seconds: u64,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        url: String::new(),
        rate: 0,
        workers: 16,
        redis: None,
        seconds: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => args.url = value()?,
            "--rate" => {
                let v = value()?;
                let n = v.strip_suffix("/s").unwrap_or(&v);
                args.rate = n.parse().map_err(|_| format!("--rate {v}: want N/s"))?;
            }
            "--workers" => args.workers = value()?.parse().map_err(|_| "--workers: a number")?,
            "--redis" => args.redis = Some(value()?),
            "--seconds" => args.seconds = value()?.parse().map_err(|_| "--seconds: a number")?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if args.url.is_empty() || args.rate == 0 {
        return Err("--url URL and --rate N/s are required".into());
    }
    Ok(args)
}

/// Sent (answered), 2xx, 429, and each request's moment of going out.
type Tally = (u64, u64, u64, Vec<Instant>);

async fn run<S: PaceStore>(store: S, args: &Args) -> Result<Tally, Box<dyn std::error::Error>> {
    // A burst of 1: at most `rate` in any second, however the seconds fall.
    let quota = Quota::gcra(args.rate, Duration::from_secs(1))
        .burst(1)
        .build()?;
    let pacer = Pacer::new(store, &quota)
        .max_wait(Duration::from_secs(30))
        .adapt(Adapt::aimd(1, Duration::from_secs(1)).increase(args.rate as f64 / 20.0));
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    // Each request's moment of going out, stamped behind the limiter.
    let sends = Arc::new(Mutex::new(Vec::new()));
    let stamp = Arc::clone(&sends);
    let client = ServiceBuilder::new()
        .layer(OutboundLayer::new(pacer, DestinationHost).concurrency(args.workers))
        .map_request(move |request| {
            stamp.lock().unwrap().push(Instant::now());
            request
        })
        .service(client);
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let (client, url) = (client.clone(), args.url.clone());
        workers.push(tokio::spawn(async move {
            let mut tally: Tally = (0, 0, 0, Vec::new());
            while Instant::now() < until {
                let request = http::Request::get(&url).body(Empty::new())?;
                match client.clone().oneshot(request).await {
                    Ok(response) => {
                        tally.0 += 1;
                        let status = response.status();
                        tally.1 += u64::from(status.is_success());
                        tally.2 += u64::from(status.as_u16() == 429);
                        let _ = response.into_body().collect().await;
                    }
                    Err(e) => {
                        eprintln!("not sent: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            Ok::<_, http::Error>(tally)
        }));
    }
    let mut all: Tally = (0, 0, 0, Vec::new());
    for w in workers {
        let t = w.await??;
        all.0 += t.0;
        all.1 += t.1;
        all.2 += t.2;
    }
    all.3 = std::mem::take(&mut *sends.lock().unwrap());
    Ok(all)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!(
                "{e}\nusage: outbound --url URL --rate N/s --workers W [--redis URL] --seconds S"
            );
            std::process::exit(2);
        }
    };
    let (sent, ok, refused, mut times) = match &args.redis {
        Some(url) => run(RedisPace::from_url(url, "outbound-example:")?, &args).await?,
        None => run(MemoryPace::new(), &args).await?,
    };
    times.sort();
    let mut most = 0;
    let mut start = 0;
    for (end, t) in times.iter().enumerate() {
        while t.duration_since(times[start]) >= Duration::from_secs(1) {
            start += 1;
        }
        most = most.max(end + 1 - start);
    }
    println!("sent {sent}");
    println!("2xx {ok}");
    println!("429 {refused}");
    println!("most in one second {most}");
    Ok(())
}
