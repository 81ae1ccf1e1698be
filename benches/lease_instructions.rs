//! Instructions per hot-key decision, for callgrind: `N` checks of one key
//! through `Limiter::check_now` (the HTTP layer's path), falling back to
//! `check` when the backend must wait, on `MemoryBackend` or on Redis with
//! leases. Run twice with different `N`; the difference divided by the
//! difference in `N` is the cost of one decision, start-up excluded.
//!
//! `MODE=memory|lease N=20000 [REDIS_URL=...] valgrind --tool=callgrind target/release/deps/lease_instructions-*`
//! (`lease` needs `--features redis`).

use std::time::Duration;

use tollgate::{Backend, Limiter, MemoryBackend, Quota};

fn run<B: Backend>(limiter: &Limiter<B>, n: u64, rt: &tokio::runtime::Runtime) {
    for _ in 0..n {
        let d = match limiter.check_now("hot", 1) {
            Some(d) => d,
            None => rt.block_on(limiter.check("hot", 1)),
        };
        assert!(d.expect("a decision").allowed());
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` runs every bench target with `--bench`; a harness is run
    // with its own arguments (by a script, or under valgrind) and does
    // nothing then.
    if std::env::args().any(|a| a == "--bench") {
        return Ok(());
    }
    let n: u64 = std::env::var("N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let mode = std::env::var("MODE").unwrap_or_else(|_| "memory".into());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let quota = Quota::gcra(1_000_000, Duration::from_secs(1))
        .burst(1_000_000)
        .build()?;
    match mode.as_str() {
        "memory" => run(&Limiter::new(MemoryBackend::new(), quota), n, &rt),
        #[cfg(feature = "redis")]
        "lease" => {
            let url =
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
            let backend = rt.block_on(async {
                tollgate::RedisBackend::from_url(url)
                    .lease(tollgate::Lease::Auto)
                    .timeout(Duration::from_secs(5))
                    .build()
            })?;
            // Named: on Redis a set's name is what every server counts under.
            let limiter = Limiter::new(backend.clone(), tollgate::QuotaSet::new("bench", [quota])?);
            run(&limiter, n, &rt);
            eprintln!("{:?}", backend.stats());
        }
        other => return Err(format!("unknown MODE {other:?}").into()),
    }
    Ok(())
}
