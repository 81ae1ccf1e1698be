//! Redis-backed decisions: throughput and latency at 1, 16 and 64 callers
//! beside `redis-benchmark` replaying the very `EVALSHA` the backend sends
//! (the ceiling on this machine); p99 at half the 64-caller rate; Redis
//! calls during a one-key flood with and without the denial cache; and
//! `MEMORY USAGE` per key for each algorithm.
//!
//! Run through `scripts/bench-redis.sh`, which pins this process and
//! `redis-benchmark` to one core and Redis to the other.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::{Algorithm, Lease, Limiter, Quota, QuotaSet, RedisBackend};

const SECONDS: u64 = 5;

struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        let pinned = Command::new("taskset").arg("-V").output().is_ok();
        let mut cmd = if pinned {
            let mut c = Command::new("taskset");
            c.args(["-c", "1", "redis-server"]);
            c
        } else {
            Command::new("redis-server")
        };
        let child = cmd
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH");
        let redis = Redis { child, port };
        let start = Instant::now();
        while redis.cli(&["ping"]).trim() != "PONG" {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Script calls so far (EVALSHA and EVAL).
    fn script_calls(&self) -> u64 {
        let info = self.cli(&["info", "commandstats"]);
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gcra_limiter(redis: &Redis, name: &str, lease: Lease) -> Limiter<RedisBackend> {
    // Never refuses: every call runs the script and writes, as an admitted
    // request does.
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(1_000_000)
        .build()
        .expect("quota");
    let backend = RedisBackend::from_url(redis.url())
        .timeout(Duration::from_secs(1))
        .lease(lease)
        .build()
        .expect("backend");
    Limiter::new(backend, QuotaSet::new(name, [quota]).expect("set"))
}

struct Figures {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

/// `callers` tasks checking one key as fast as they can, or at `rate` in all.
async fn tollgate_load(
    limiter: &Arc<Limiter<RedisBackend>>,
    callers: usize,
    rate: Option<f64>,
) -> Figures {
    keys_load(limiter, callers, rate, &["bench".to_owned()]).await
}

/// `callers` tasks checking `keys` in turn, as fast as they can or at `rate`
/// in all.
async fn keys_load(
    limiter: &Arc<Limiter<RedisBackend>>,
    callers: usize,
    rate: Option<f64>,
    keys: &[String],
) -> Figures {
    let deadline = Instant::now() + Duration::from_secs(SECONDS);
    let keys: Arc<[String]> = keys.into();
    let tasks: Vec<_> = (0..callers)
        .map(|caller| {
            let limiter = Arc::clone(limiter);
            let keys = Arc::clone(&keys);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut tick = rate.map(|r| {
                    let mut t = tokio::time::interval(Duration::from_secs_f64(callers as f64 / r));
                    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    t
                });
                let mut next = caller;
                while Instant::now() < deadline {
                    if let Some(t) = &mut tick {
                        t.tick().await;
                    }
                    let key = &keys[next % keys.len()];
                    next += callers;
                    let start = Instant::now();
                    let d = limiter.check(key, 1).await.expect("decision");
                    assert!(d.allowed());
                    latencies.push(start.elapsed().as_micros() as u32);
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    all.sort_unstable();
    Figures {
        per_sec: all.len() as f64 / SECONDS as f64,
        p50_ms: percentile(&all, 0.50),
        p99_ms: percentile(&all, 0.99),
    }
}

/// The arguments of one EVALSHA the backend sends, seen through MONITOR.
fn capture_evalsha(
    redis: &Redis,
    limiter: &Limiter<RedisBackend>,
    rt: &tokio::runtime::Runtime,
) -> Vec<String> {
    let mut monitor = Command::new("redis-cli")
        .args(["-p", &redis.port.to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli monitor");
    let stdout = monitor.stdout.take().expect("monitor output");
    std::thread::sleep(Duration::from_millis(200));
    rt.block_on(async {
        for _ in 0..3 {
            limiter.check("bench", 1).await.expect("decision");
        }
    });
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    let args = loop {
        line.clear();
        if reader.read_line(&mut line).expect("monitor line") == 0 {
            panic!("no EVALSHA seen");
        }
        if line.contains("\"EVALSHA\"") || line.contains("\"evalsha\"") {
            break quoted(&line);
        }
    };
    let _ = monitor.kill();
    let _ = monitor.wait();
    args
}

/// The quoted words of a MONITOR line.
fn quoted(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        word.push(n);
                    }
                }
                '"' => break,
                c => word.push(c),
            }
        }
        out.push(word);
    }
    out
}

fn redis_benchmark(redis: &Redis, callers: usize, command: &[String]) -> Figures {
    let requests = (callers * 4_000).clamp(40_000, 300_000).to_string();
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", "0", "redis-benchmark"]);
    let out = cmd
        .args([
            "-p",
            &redis.port.to_string(),
            "-c",
            &callers.to_string(),
            "-n",
            &requests,
        ])
        .args(command)
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
    let per_sec = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("throughput summary:"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    // "latency summary (msec):" then a header line and a values line.
    let lines: Vec<&str> = text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("latency summary"))
        .unwrap_or(0);
    let header: Vec<&str> = lines
        .get(at + 1)
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    let values: Vec<f64> = lines
        .get(at + 2)
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let get = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .and_then(|i| values.get(i))
            .copied()
            .unwrap_or(f64::NAN)
    };
    Figures {
        per_sec,
        p50_ms: get("p50"),
        p99_ms: get("p99"),
    }
}

/// Whether to run `section` (throughput, flood, leases, memory): all by
/// default, or those named in `SECTIONS` (comma-separated).
fn wants(section: &str) -> bool {
    std::env::var("SECTIONS").map_or(true, |s| s.split(',').any(|x| x.trim() == section))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let redis = Redis::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    if wants("throughput") {
        let limiter = Arc::new(rt.block_on(async { gcra_limiter(&redis, "bench", Lease::Off) }));
        let command = capture_evalsha(&redis, &limiter, &rt);

        println!("## Throughput and latency (GCRA, one key, every call admitted)\n");
        println!(
            "| callers | tollgate decisions/s | p50 | p99 | redis-benchmark EVALSHA/s | p50 | p99 | tollgate / ceiling |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        let mut at_64 = 0.0;
        for callers in [1usize, 16, 64] {
            let t = rt.block_on(tollgate_load(&limiter, callers, None));
            let r = redis_benchmark(&redis, callers, &command);
            if callers == 64 {
                at_64 = t.per_sec;
            }
            println!(
                "| {callers} | {:.0} | {:.3} ms | {:.3} ms | {:.0} | {:.3} ms | {:.3} ms | {:.0}% |",
                t.per_sec,
                t.p50_ms,
                t.p99_ms,
                r.per_sec,
                r.p50_ms,
                r.p99_ms,
                100.0 * t.per_sec / r.per_sec
            );
        }
        let half = rt.block_on(tollgate_load(&limiter, 64, Some(at_64 / 2.0)));
        println!(
            "\nAt half the 64-caller rate ({:.0}/s asked, {:.0}/s done): p50 {:.3} ms, p99 {:.3} ms.\n",
            at_64 / 2.0,
            half.per_sec,
            half.p50_ms,
            half.p99_ms
        );
    }
    if wants("flood") {
        println!("## One-key flood: Redis calls, with and without the denial cache\n");
        println!(
            "16 tasks hammer one key for 2 s; the quota is GCRA 10 per second (burst 10), so a refusal's retry-after is about 100 ms. \"After 0.5 s\": the last 1.5 s (15 intervals), once the burst is spent.\n"
        );
        println!(
            "| denial cache | checks | admitted | Redis script calls | calls for refusals | refusal calls per retry-after interval | all calls per interval | after 0.5 s: calls per interval | after 0.5 s: refusal calls per interval |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (cache, lease) in [(true, Lease::Off), (false, Lease::Off), (true, Lease::Auto)] {
            let quota = Quota::gcra(10, Duration::from_secs(1))
                .build()
                .expect("quota");
            let backend = RedisBackend::from_url(redis.url())
                .denial_cache(if cache { 10_000 } else { 0 })
                .lease(lease)
                .timeout(Duration::from_secs(1))
                .build()
                .expect("backend");
            let limiter = Arc::new(Limiter::new(
                backend,
                QuotaSet::new(format!("flood-{cache}-{lease}"), [quota]).expect("set"),
            ));
            // Connect and load the script before counting.
            rt.block_on(limiter.peek("warm-up", 1)).expect("warm-up");
            let before = redis.script_calls();
            let admissions = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let ((checks, admitted), (steady_calls, steady_admitted)) = rt.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(2);
                let tasks: Vec<_> = (0..16)
                    .map(|_| {
                        let l = Arc::clone(&limiter);
                        let admissions = Arc::clone(&admissions);
                        tokio::spawn(async move {
                            let (mut n, mut ok) = (0u64, 0u64);
                            while Instant::now() < deadline {
                                n += 1;
                                // A failed check counts as not admitted; the
                                // call count says whether Redis was asked.
                                let d = l.check("flooder", 1).await;
                                let admitted = u64::from(d.is_ok_and(|d| d.allowed()));
                                ok += admitted;
                                // A check answered here is ready at once and
                                // never yields: without this, one task would
                                // hold the worker and the others' Redis
                                // answers would wait for it for whole intervals.
                                tokio::task::yield_now().await;
                                admissions
                                    .fetch_add(admitted, std::sync::atomic::Ordering::Relaxed);
                            }
                            (n, ok)
                        })
                    })
                    .collect();
                tokio::time::sleep(Duration::from_millis(500)).await;
                let at_half = (
                    redis.script_calls(),
                    admissions.load(std::sync::atomic::Ordering::Relaxed),
                );
                let mut sum = (0, 0);
                for t in tasks {
                    let (n, ok) = t.await.expect("task");
                    sum = (sum.0 + n, sum.1 + ok);
                }
                let steady = (
                    redis.script_calls() - at_half.0,
                    admissions.load(std::sync::atomic::Ordering::Relaxed) - at_half.1,
                );
                (sum, steady)
            });
            let calls = redis.script_calls() - before;
            let refusal_calls = calls.saturating_sub(admitted);
            println!(
                "| {} | {checks} | {admitted} | {calls} | {refusal_calls} | {:.2} | {:.2} | {:.2} | {:.2} |",
                match (cache, lease) {
                    (true, Lease::Off) => "on",
                    (false, _) => "off",
                    (true, _) => "on, leases auto",
                },
                refusal_calls as f64 / 20.0,
                calls as f64 / 20.0,
                steady_calls as f64 / 15.0,
                steady_calls.saturating_sub(steady_admitted) as f64 / 15.0
            );
        }
    }
    if wants("leases") {
        println!("\n## Leases: a hot key, and 1 000 quiet keys, with leases off and on\n");
        println!(
            "GCRA that never refuses. Hot key: 64 callers on one key as fast as they can. Quiet keys: 1 000 keys, 4 checks/s each (4 000/s in all, 64 callers). {SECONDS} s each, off and auto interleaved.\n"
        );
        println!("| load | leases | decisions/s | p50 | p99 | Redis script calls/s |");
        println!("|---|---|---:|---:|---:|---:|");
        let quiet: Vec<String> = (0..1000).map(|i| format!("quiet-{i:04}")).collect();
        for round in 0..2 {
            for (load, keys, rate) in [
                ("hot key", vec!["hot".to_owned()], None),
                ("1 000 quiet keys", quiet.clone(), Some(4_000.0)),
            ] {
                for lease in [Lease::Off, Lease::Auto] {
                    let name = format!("lease-{round}-{lease}-{}", keys.len());
                    let limiter =
                        Arc::new(rt.block_on(async { gcra_limiter(&redis, &name, lease) }));
                    rt.block_on(limiter.peek("warm-up", 1)).expect("warm-up");
                    let before = redis.script_calls();
                    let f = rt.block_on(keys_load(&limiter, 64, rate, &keys));
                    let calls = (redis.script_calls() - before) as f64 / SECONDS as f64;
                    println!(
                        "| {load} | {lease} | {:.0} | {:.3} ms | {:.3} ms | {calls:.0} |",
                        f.per_sec, f.p50_ms, f.p99_ms
                    );
                }
            }
        }
    }
    if wants("memory") {
        println!(
            "\n## Redis memory per key (`MEMORY USAGE`, 1 000 keys each, one check per key)\n"
        );
        println!("| algorithm | bytes per key |\n|---|---:|");
        for algorithm in Algorithm::ALL {
            let quota = Quota::builder(algorithm, 100, Duration::from_secs(3600))
                .build()
                .expect("quota");
            let set = QuotaSet::new(format!("mem-{}", algorithm.name()), [quota]).expect("set");
            let backend = RedisBackend::from_url(redis.url())
                .build()
                .expect("backend");
            let limiter = Limiter::new(backend.clone(), set.clone());
            let keys: Vec<String> = (0..1000).map(|i| format!("client-{i:04}")).collect();
            rt.block_on(async {
                for k in &keys {
                    limiter.check(k, 1).await.expect("decision");
                }
            });
            let total: u64 = keys
                .iter()
                .flat_map(|k| backend.redis_keys(k, &set))
                .map(|rk| {
                    redis
                        .cli(&["memory", "usage", &rk])
                        .trim()
                        .parse::<u64>()
                        .unwrap_or(0)
                })
                .sum();
            println!("| {algorithm} | {:.0} |", total as f64 / keys.len() as f64);
        }
    }
}
