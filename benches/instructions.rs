//! A loop of in-memory checks for `scripts/bench-instructions.sh`, which
//! runs it under callgrind at two lengths and reports the difference per
//! check: instructions, which machine noise does not move.
//!
//! `instructions <case> <checks>`; with other arguments (as `cargo bench`
//! passes) it does nothing.
//!
//! `instructions time <checks>`: time, not instructions. Governor's GCRA
//! and tollgate's hot-key cases take turns in one process, 10 000 checks
//! at a time, until each has made `checks`; each block is timed. A shared
//! VM's speed drifts between runs by more than these differences, so only
//! cases interleaved this finely compare (`scripts/bench-time.sh engine`).

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tollgate::{Algorithm, Counts, Limiter, MemoryBackend, Quota, QuotaSet, Settle};

#[path = "support/interleave.rs"]
mod interleave;
#[path = "support/peers.rs"]
mod peers;

use interleave::{Run, interleave};

fn tollgate(quotas: QuotaSet) -> Limiter<MemoryBackend> {
    Limiter::new(MemoryBackend::new(), quotas)
}

/// The output of a future the memory backend has ready at once: polled
/// once, no runtime to count.
fn ready<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the memory backend never waits"),
    }
}

/// A reservation of 2 on GCRA and its settle, each check: `keep`, the
/// real cost below (1: one unit given back) or above (3: one more charged).
/// `requests_and_tokens_<how>`: the same on a set of two GCRA quotas, one
/// counting requests and one the cost (the tokens), as an LLM API limits.
fn reserve_and_settle(how: &str, key: String) -> Option<Run<'static>> {
    let (how, quotas) = match how.strip_prefix("requests_and_tokens_") {
        Some(how) => (how, requests_and_tokens()),
        None => (how, peers::admitting(Algorithm::Gcra)),
    };
    let settle = match how {
        "keep" => Settle::Keep,
        "below" => Settle::Actual(1),
        "above" => Settle::Actual(3),
        _ => return None,
    };
    let limiter = tollgate(quotas);
    Some(Box::new(move |checks| {
        for _ in 0..checks {
            let reservation = ready(limiter.reserve(black_box(&key), 2)).expect("reserved");
            let _ = black_box(ready(reservation.settle(settle)));
        }
    }))
}

/// A request quota and a token quota, both GCRA and never spent in a run.
fn requests_and_tokens() -> QuotaSet {
    let quota = |name: &str| {
        Quota::gcra(1_000_000, Duration::from_secs(1))
            .burst(peers::NEVER_SPENT)
            .name(name)
    };
    QuotaSet::new(
        "llm",
        [
            quota("requests")
                .counts(Counts::Requests)
                .build()
                .expect("valid quota"),
            quota("tokens").build().expect("valid quota"),
        ],
    )
    .expect("valid set")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [case, checks] = args.as_slice() else {
        return;
    };
    let Ok(checks) = checks.parse::<u64>() else {
        return;
    };
    if case == "time" {
        return interleaved(checks);
    }
    match run(case) {
        Some(mut run) => run(checks),
        None => eprintln!("unknown case {case}"),
    }
}

/// Governor's GCRA, tollgate's one-number and two-number cases and a set of
/// three quotas in turn,
/// 10 000 checks at a time; prints the nanoseconds a check each took, and
/// each one's time over governor's and over tollgate's GCRA.
fn interleaved(checks: u64) {
    let names = [
        "governor/gcra",
        "tollgate/gcra",
        "tollgate/fixed_window",
        "tollgate/token_bucket_fractional",
        "tollgate/sliding_window",
        "tollgate/token_bucket_fractional_pair",
        "tollgate/three_quotas",
    ];
    let mut runs: Vec<Run> = names.iter().filter_map(|n| run(n)).collect();
    let ns = interleave(&mut runs, checks, 10_000);
    for (name, each) in names.iter().zip(&ns) {
        println!(
            "{name}: {each:.1} ns, {:.3}x governor/gcra, {:.3}x tollgate/gcra",
            each / ns[0],
            each / ns[1]
        );
    }
}

/// The case called `case`, on one key.
fn run(case: &str) -> Option<Run<'static>> {
    let key = "ip:203.0.113.7".to_owned();
    if case == "governor/gcra" {
        let gov = peers::governor_admitting();
        return Some(Box::new(move |checks| {
            for _ in 0..checks {
                let _ = black_box(gov.check_key(black_box(&key)));
            }
        }));
    }
    if let Some(how) = case.strip_prefix("tollgate/reserve_settle_") {
        return reserve_and_settle(how, key);
    }
    let quotas = match case.strip_prefix("tollgate/")? {
        "three_quotas" => peers::three_quotas(),
        "three_quotas_admitted" => peers::three_quotas_admitted(),
        "three_quotas_flood" => peers::three_quotas_flood(),
        "three_quotas_refused" => peers::three_quotas_refused(),
        // Two a microsecond: the window keeps its start and count, wide.
        "fixed_window_two_a_microsecond" => QuotaSet::single(
            Quota::fixed_window(2_000_000, Duration::from_secs(1))
                .build()
                .expect("valid quota"),
        ),
        // A token that is not a whole number of microseconds: the bucket
        // is two numbers (the moment it is full, the units refilled past
        // it). 3 000 000 a second refills 3 units a microsecond, and the
        // two are packed in one word; 999 999 refills 999 999, and they are
        // a pair, swapped together. Bursts that every check fits.
        "token_bucket_fractional" => QuotaSet::single(
            Quota::token_bucket(3_000_000, Duration::from_secs(1))
                .burst(1 << 40)
                .build()
                .expect("valid quota"),
        ),
        "token_bucket_fractional_pair" => QuotaSet::single(
            Quota::token_bucket(999_999, Duration::from_secs(1))
                .burst(1 << 32)
                .build()
                .expect("valid quota"),
        ),
        // A flood on one key: ten a minute, so every check but the first ten
        // is refused.
        // Windows of 100 ms: the check weighs the previous window's count,
        // as on a key checked for longer than one window (the admitting
        // sliding window's windows never end).
        "sliding_window_rolling" => QuotaSet::single(
            Quota::sliding_window(u64::from(u32::MAX), Duration::from_millis(100))
                .build()
                .expect("valid quota"),
        ),
        "sliding_window_refusing" => QuotaSet::single(
            Quota::sliding_window(10, Duration::from_secs(60))
                .build()
                .expect("valid quota"),
        ),
        name => peers::admitting(*Algorithm::ALL.iter().find(|a| a.name() == name)?),
    };
    let limiter = tollgate(quotas);
    Some(Box::new(move |checks| check(&limiter, &key, checks)))
}

/// `checks` checks of `key`: a function of its own, as the loop was in
/// `main` before the cases were closures (inlined into its closure, GCRA's
/// check counted ~14 instructions more).
#[inline(never)]
fn check(limiter: &Limiter<MemoryBackend>, key: &str, checks: u64) {
    for _ in 0..checks {
        let _ = black_box(limiter.check_now(black_box(key), 1));
    }
}
