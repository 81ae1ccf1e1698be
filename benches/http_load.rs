//! A load generator for `scripts/bench-http.sh` where wrk is not installed:
//! keep-alive HTTP/1.1 GETs on `-c` connections for `-d` seconds, over
//! `-t` threads, and a report in wrk's words (the lines the script reads).
//!
//! `http_load -t 1 -c 64 -d 10 http://127.0.0.1:8000/`

use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

struct Args {
    threads: usize,
    connections: usize,
    duration: Duration,
    url: http::Uri,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        threads: 1,
        connections: 64,
        duration: Duration::from_secs(10),
        url: "http://127.0.0.1:8000/".parse().expect("literal"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "-t" => args.threads = value()?.parse().map_err(|e| format!("-t: {e}"))?,
            "-c" => args.connections = value()?.parse().map_err(|e| format!("-c: {e}"))?,
            // Seconds, with or without wrk's trailing `s`.
            "-d" => {
                let v = value()?;
                let secs: f64 = v
                    .trim_end_matches('s')
                    .parse()
                    .map_err(|e| format!("-d: {e}"))?;
                args.duration = Duration::from_secs_f64(secs);
            }
            url if !url.starts_with('-') => {
                args.url = url.parse().map_err(|e| format!("{url}: {e}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// What one connection saw: latencies in microseconds, and responses that
/// were not 2xx or 3xx.
#[derive(Default)]
struct Seen {
    latencies: Vec<u32>,
    bad: u64,
    errors: u64,
}

async fn connection(url: http::Uri, until: Instant) -> Seen {
    let mut seen = Seen::default();
    let authority = url.authority().expect("URL with a host").clone();
    let Ok(stream) = tokio::net::TcpStream::connect(authority.as_str()).await else {
        seen.errors += 1;
        return seen;
    };
    let _ = stream.set_nodelay(true);
    let Ok((mut sender, conn)) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        seen.errors += 1;
        return seen;
    };
    tokio::spawn(conn);
    while Instant::now() < until {
        let request = Request::get(url.path())
            .header(http::header::HOST, authority.as_str())
            .body(Empty::<Bytes>::new())
            .expect("valid request");
        let start = Instant::now();
        let Ok(response) = sender.send_request(request).await else {
            seen.errors += 1;
            break;
        };
        let status = response.status();
        if response.into_body().collect().await.is_err() {
            seen.errors += 1;
            break;
        }
        let micros = start.elapsed().as_micros();
        seen.latencies
            .push(u32::try_from(micros).unwrap_or(u32::MAX));
        seen.bad += u64::from(!(status.is_success() || status.is_redirection()));
    }
    seen
}

fn main() {
    // `cargo bench` runs every bench target with `--bench`; a harness is run
    // with its own arguments (by a script) and does nothing then.
    if std::env::args().any(|a| a == "--bench") {
        return;
    }
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("http_load: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .expect("runtime");
    let start = Instant::now();
    let until = start + args.duration;
    let all: Vec<Seen> = runtime.block_on(async {
        let tasks: Vec<_> = (0..args.connections)
            .map(|_| tokio::spawn(connection(args.url.clone(), until)))
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.push(task.await.expect("connection task"));
        }
        all
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut latencies: Vec<u32> = all
        .iter()
        .flat_map(|s| s.latencies.iter().copied())
        .collect();
    latencies.sort_unstable();
    let requests = latencies.len();
    let p99 = latencies
        .get((requests * 99 / 100).min(requests.saturating_sub(1)))
        .copied()
        .unwrap_or(0);
    let bad: u64 = all.iter().map(|s| s.bad).sum();
    let errors: u64 = all.iter().map(|s| s.errors).sum();
    // wrk's words, which scripts/bench-http.sh reads.
    println!(
        "Running {:.0}s test @ {}",
        args.duration.as_secs_f64(),
        args.url
    );
    println!(
        "  {} threads and {} connections",
        args.threads, args.connections
    );
    println!("  Latency Distribution");
    println!("     99%   {:.2}ms", f64::from(p99) / 1000.0);
    println!("  {requests} requests in {elapsed:.2}s");
    if errors > 0 {
        println!("  Socket errors: {errors}");
    }
    if bad > 0 {
        println!("  Non-2xx or 3xx responses: {bad}");
    }
    println!("Requests/sec: {:.2}", requests as f64 / elapsed);
}
