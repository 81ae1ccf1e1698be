//! Waiting one's turn, measured: utilisation (sent / allowed) and added
//! latency at 1, 10 and 100 workers, tollgate's pacer in memory and on
//! Redis beside governor's `until_key_ready`, all in one process, at
//! `--rate` a second with a burst of 1 for `--seconds` each.
//!
//! Added latency: the k-th request sent goes at `send_k`; at the rate, it
//! could have gone at `start + k / rate`; the difference, p50 and p99.
//!
//! ```text
//! scripts/bench-outbound.sh          # starts a Redis, runs this with
//!     --redis redis://127.0.0.1:PORT --rate 200 --seconds 3
//! ```

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tollgate::Quota;
use tollgate::outbound::{MemoryPace, PaceStore, Pacer, RedisPace};

struct Args {
    redis: Option<String>,
    rate: u64,
    seconds: u64,
}

fn parse() -> Args {
    let mut args = Args {
        redis: None,
        rate: 200,
        seconds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--redis" => args.redis = Some(value),
            "--rate" => args.rate = value.parse().expect("--rate N"),
            "--seconds" => args.seconds = value.parse().expect("--seconds N"),
            other => panic!("unknown argument {other}"),
        }
    }
    args
}

/// What one run measured.
struct Run {
    sent: usize,
    allowed: f64,
    p50: Duration,
    p99: Duration,
}

/// Runs `workers` that each wait with `wait` then record the moment.
async fn run<F, Fut>(workers: usize, rate: u64, seconds: u64, wait: F) -> Run
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let sends = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (wait, sends) = (wait.clone(), Arc::clone(&sends));
        tasks.push(tokio::spawn(async move {
            loop {
                wait().await;
                let now = Instant::now();
                if now >= until {
                    return;
                }
                sends.lock().unwrap().push(now);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut sends = std::mem::take(&mut *sends.lock().unwrap());
    sends.sort();
    let interval = Duration::from_secs(1).as_secs_f64() / rate as f64;
    let mut late: Vec<Duration> = sends
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let ideal = start + Duration::from_secs_f64(k as f64 * interval);
            t.saturating_duration_since(ideal)
        })
        .collect();
    late.sort();
    let at = |q: f64| {
        late.get(((late.len() as f64 * q) as usize).min(late.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Run {
        sent: sends.len(),
        // One at the start (the burst) and one an interval after.
        allowed: 1.0 + seconds as f64 * rate as f64,
        p50: at(0.5),
        p99: at(0.99),
    }
}

fn pacer<S: PaceStore>(store: S, rate: u64) -> Pacer<S> {
    let quota = Quota::gcra(rate, Duration::from_secs(1))
        .burst(1)
        .build()
        .unwrap();
    Pacer::new(store, &quota).max_wait(Duration::from_secs(60))
}

fn print(name: &str, workers: usize, r: &Run) {
    println!(
        "| {name} | {workers} | {} | {:.1}% | {:.2} ms | {:.2} ms |",
        r.sent,
        100.0 * r.sent as f64 / r.allowed,
        r.p50.as_secs_f64() * 1e3,
        r.p99.as_secs_f64() * 1e3
    );
}

#[tokio::main]
async fn main() {
    // `cargo bench` runs every bench target with `--bench`; this harness is
    // run by scripts/bench-outbound.sh with its own arguments.
    if std::env::args().any(|a| a == "--bench") {
        return;
    }
    let args = parse();
    let (rate, seconds) = (args.rate, args.seconds);
    println!("| limiter | workers | sent | sent / allowed | added latency p50 | p99 |");
    println!("|---|---|---|---|---|---|");
    for workers in [1, 10, 100] {
        let p = pacer(MemoryPace::new(), rate);
        let r = run(workers, rate, seconds, move || {
            let p = p.clone();
            async move {
                p.acquire("k", 1).await.unwrap();
            }
        })
        .await;
        print("tollgate pacer, memory", workers, &r);

        if let Some(url) = &args.redis {
            let prefix = format!("bench-outbound:{workers}:{}:", std::process::id());
            let store = RedisPace::from_url(url, &prefix)
                .unwrap()
                .timeout(Duration::from_secs(2));
            let p = pacer(store, rate);
            let r = run(workers, rate, seconds, move || {
                let p = p.clone();
                async move {
                    if let Err(e) = p.acquire("k", 1).await {
                        eprintln!("no turn: {e}");
                    }
                }
            })
            .await;
            print("tollgate pacer, Redis", workers, &r);
        }

        let quota = governor::Quota::per_second(NonZeroU32::new(rate as u32).unwrap())
            .allow_burst(NonZeroU32::MIN);
        let g = Arc::new(governor::RateLimiter::keyed(quota));
        let r = run(workers, rate, seconds, move || {
            let g = Arc::clone(&g);
            async move {
                g.until_key_ready(&"k").await;
            }
        })
        .await;
        print("governor until_key_ready", workers, &r);
    }
}
