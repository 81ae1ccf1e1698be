//! Checks per second on many cores: one hot key and many keys, at 1, 2, 4,
//! 8 and 16 threads, for every algorithm, plain and batched
//! (`BatchBackend`), with governor 0.10 beside GCRA, and `mixed`: GCRA and
//! a set of three quotas in turn on one backend (readers and writers of
//! the same shards). Prints one markdown
//! report: millions of checks a second, then ratios at the same thread
//! count (each algorithm to GCRA, GCRA to governor, batched to plain).
//!
//! `cargo bench --bench cores` (or `scripts/bench-cores.sh`, which builds
//! it once and runs it where cargo is not). Settings, from the environment:
//! `THREADS=1,2,4,8,16`, `CELL_MS=300` (each cell's measured time),
//! `ROUNDS=3` (each cell's rounds, cases interleaved within a round; a
//! cell's median is reported, and a ratio's median over the rounds),
//! `ONLY=gcra,mixed,...` (cases by name),
//! `SHAPES=hot` (the hot key alone; `hot,many` by default), `PIN=1` (thread
//! `t` of a cell held to CPU `t`, on Linux: where the threads sit on the
//! chip sets how long a hot key's line takes to pass between them, which
//! the scheduler otherwise chooses anew each cell).

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use tollgate::backend::BatchBackend;
use tollgate::{Algorithm, Limiter, MemoryBackend, Quota, QuotaSet};

#[path = "support/peers.rs"]
mod peers;

/// Keys of the many-keys case, shared by the threads, each starting at
/// its own offset: more than a cache holds, fewer than the default bound.
const KEYS: usize = 1 << 16;

/// A checker: checks the key it is given.
type Check = Arc<dyn Fn(&String) + Send + Sync>;

/// Holds the calling thread to CPU `cpu` (on Linux; elsewhere it does
/// nothing). A CPU the process may not use leaves the thread where it was.
fn pin(cpu: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: a zeroed `cpu_set_t` is the empty set, `CPU_SET` writes
    // within it, and `sched_setaffinity(0, ..)` reads it for the calling
    // thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpu;
}

/// Runs `check` on `threads` threads for `cell`, on one key (`hot`) or
/// on [`KEYS`] keys; checks a second.
fn cell(threads: usize, cell: Duration, hot: bool, keys: &Arc<Vec<String>>, check: &Check) -> f64 {
    let pinned = std::env::var("PIN").is_ok_and(|p| p == "1");
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, total, barrier) = (stop.clone(), total.clone(), barrier.clone());
            let (keys, check) = (keys.clone(), check.clone());
            std::thread::spawn(move || {
                if pinned {
                    pin(t);
                }
                let mut i = t * (KEYS / threads.max(1));
                let mut done = 0u64;
                let global = "global".to_owned();
                barrier.wait();
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        let key = if hot { &global } else { &keys[i % KEYS] };
                        i = i.wrapping_add(7919);
                        check(black_box(key));
                    }
                    done += 256;
                }
                total.fetch_add(done, Ordering::Relaxed);
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    std::thread::sleep(cell);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("bench thread");
    }
    total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn plain(algorithm: Algorithm) -> Check {
    let backend = MemoryBackend::builder().max_keys(4 * KEYS).build();
    let limiter = Limiter::new(backend, peers::admitting(algorithm));
    Arc::new(move |key| {
        black_box(limiter.check_now(key, 1));
    })
}

fn quota_set(set: QuotaSet) -> Check {
    let backend = MemoryBackend::builder().max_keys(4 * KEYS).build();
    let limiter = Limiter::new(backend, set);
    Arc::new(move |key| {
        black_box(limiter.check_now(key, 1));
    })
}

/// Every other check of a thread a GCRA quota (decided under the shard's
/// read lock), the others a set of three quotas (under its write lock), on
/// one backend: readers and writers on the same shards, as a service with
/// single and multi-quota routes has them.
fn mixed() -> Check {
    let backend = MemoryBackend::builder().max_keys(4 * KEYS).build();
    let read = Limiter::new(backend.clone(), peers::admitting(Algorithm::Gcra));
    let write = Limiter::new(backend, peers::three_quotas_admitted());
    Arc::new(move |key| {
        thread_local! {
            static TURN: Cell<bool> = const { Cell::new(false) };
        }
        let turn = TURN.with(|t| {
            t.set(!t.get());
            t.get()
        });
        if turn {
            black_box(read.check_now(key, 1));
        } else {
            black_box(write.check_now(key, 1));
        }
    })
}

fn batched(algorithm: Algorithm) -> Check {
    let inner = MemoryBackend::builder().max_keys(4 * KEYS).build();
    let limiter = Limiter::new(BatchBackend::new(inner), peers::admitting(algorithm));
    Arc::new(move |key| {
        black_box(limiter.check_now(key, 1));
    })
}

fn governor() -> Check {
    let gov = peers::governor_admitting();
    Arc::new(move |key| {
        black_box(gov.check_key(key)).ok();
    })
}

/// One row: a case's checks a second at each thread count, every round's.
struct Row {
    name: String,
    rounds: Vec<Vec<f64>>,
}

fn main() {
    // `cargo bench` passes `--bench`; no other arguments are taken.
    let threads: Vec<usize> = std::env::var("THREADS")
        .unwrap_or_else(|_| "1,2,4,8,16".into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .filter(|&t| t > 0)
        .collect();
    let cell_ms = std::env::var("CELL_MS")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(300);
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .filter(|&r| r > 0)
        .unwrap_or(3);
    let only = std::env::var("ONLY").ok();
    // Whether `ONLY` names the case (every case when it is unset).
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    let span = Duration::from_millis(cell_ms);
    let keys: Arc<Vec<String>> = Arc::new(
        (0..KEYS)
            .map(|i| format!("ip:10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
            .collect(),
    );
    let mut cases: Vec<(String, Box<dyn Fn() -> Check>)> = Vec::new();
    for algorithm in Algorithm::ALL.into_iter().filter(|a| wanted(a.name())) {
        let name = algorithm.name();
        cases.push((name.to_string(), Box::new(move || plain(algorithm))));
        cases.push((
            format!("{name} batched"),
            Box::new(move || batched(algorithm)),
        ));
    }
    // States of two numbers: a sliding window whose counts stay under 2^32
    // (the admitting quota above counts past it, so it is decided under the
    // write lock), the same with windows that end, each one word beside a
    // frame; a token bucket refilling 3 units a microsecond, one number on
    // its own clock, and one refilling 999 999, a word beside a frame.
    let two_numbers = [
        (
            "sliding_window_u32",
            Quota::sliding_window(u64::from(u32::MAX), Duration::from_secs(1_000_000)),
        ),
        // Windows of 100 ms: each check weighs the previous window's count.
        (
            "sliding_window_rolling",
            Quota::sliding_window(u64::from(u32::MAX), Duration::from_millis(100)),
        ),
        (
            "token_bucket_fractional",
            Quota::token_bucket(3_000_000, Duration::from_secs(1)).burst(1 << 40),
        ),
        (
            "token_bucket_fractional_pair",
            Quota::token_bucket(999_999, Duration::from_secs(1)).burst(1 << 32),
        ),
    ];
    for (name, quota) in two_numbers {
        if wanted(name) {
            let set = QuotaSet::single(quota.build().expect("valid quota"));
            cases.push((name.into(), Box::new(move || quota_set(set.clone()))));
        }
    }
    if wanted("mixed") {
        cases.push(("mixed".into(), Box::new(mixed)));
    }
    cases.push(("governor".into(), Box::new(governor)));

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("# Checks per second on many cores\n");
    println!(
        "{cpus} CPUs; threads {threads:?}; {cell_ms} ms a cell, a cell the median of {rounds} rounds, a ratio the median of the rounds' ratios; millions of checks a second.\n"
    );
    // One cell thrown away first: the machine's first busy moments (clock
    // speed rising, pages first touched) otherwise fell on the first case.
    let warm = cases[0].1();
    cell(
        threads.first().copied().unwrap_or(1),
        span,
        true,
        &keys,
        &warm,
    );
    let shapes = std::env::var("SHAPES").unwrap_or_else(|_| "hot,many".into());
    let hot_shapes = [true, false].into_iter().filter(|&hot| {
        shapes
            .split(',')
            .any(|s| s == if hot { "hot" } else { "many" })
    });
    for hot in hot_shapes {
        // Cases interleaved within each round, the median of the rounds
        // kept: a slow moment of the machine falls on one round of every
        // case, not on every round of one.
        let mut rates = vec![vec![Vec::new(); threads.len()]; cases.len()];
        for (ti, &t) in threads.iter().enumerate() {
            for _ in 0..rounds {
                for (ci, (name, make)) in cases.iter().enumerate() {
                    // A fresh limiter per cell: no cell inherits another's keys.
                    let check = make();
                    if !hot {
                        // The keys are stored before they are measured.
                        for key in keys.iter() {
                            check(key);
                        }
                    }
                    let rate = cell(t, span, hot, &keys, &check);
                    eprintln!(
                        "{} {name} {t} threads: {:.2} M/s",
                        if hot { "hot" } else { "many" },
                        rate / 1e6
                    );
                    rates[ci][ti].push(rate);
                }
            }
        }
        let rows: Vec<Row> = cases
            .iter()
            .zip(rates)
            .map(|((name, _), rounds)| Row {
                name: name.clone(),
                rounds,
            })
            .collect();
        report(
            if hot { "One hot key" } else { "Many keys" },
            &threads,
            &rows,
        );
    }
}

/// The middle of a cell's rounds (the upper middle of an even count).
fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

fn report(title: &str, threads: &[usize], rows: &[Row]) {
    let head: String = threads.iter().map(|t| format!(" {t} |")).collect();
    let rule: String = threads.iter().map(|_| " ---:|").collect();
    let find = |name: &str| rows.iter().find(|r| r.name == name);
    println!("## {title}: M checks/s\n\n| case |{head}\n|---|{rule}");
    for row in rows {
        let cells: String = row
            .rounds
            .iter()
            .map(|r| format!(" {:.2} |", median(r.clone()) / 1e6))
            .collect();
        println!("| {} |{cells}", row.name);
    }
    // The median of the rounds' ratios: the two cells of a round ran one
    // after the other, so a change of the machine's speed between rounds
    // (on a VM, whether its two CPUs share a core) moves both.
    let ratio = |label: String, a: &Row, b: &Row| {
        let cells: String = a
            .rounds
            .iter()
            .zip(&b.rounds)
            .map(|(x, y)| {
                let each = x.iter().zip(y).map(|(x, y)| x / y).collect();
                format!(" {:.2}x |", median(each))
            })
            .collect();
        println!("| {label} |{cells}");
    };
    println!("\n## {title}: ratios at the same threads\n\n| ratio |{head}\n|---|{rule}");
    if let Some(gcra) = find("gcra") {
        for row in rows
            .iter()
            .filter(|r| !r.name.contains(' ') && r.name != "gcra" && r.name != "governor")
        {
            ratio(format!("{} / gcra", row.name), row, gcra);
        }
        if let Some(gov) = find("governor") {
            ratio("gcra / governor".into(), gcra, gov);
        }
    }
    for row in rows.iter().filter(|r| r.name.ends_with(" batched")) {
        if let Some(base) = find(row.name.trim_end_matches(" batched")) {
            ratio(format!("{} / plain", row.name), row, base);
        }
    }
    println!();
}
