//! Cases timed in turn within one process: a shared VM's speed drifts
//! between runs and between processes by more than the differences these
//! benches look for, so only cases interleaved this finely compare
//! (`scripts/bench-time.sh`).

use std::time::{Duration, Instant};

/// A case: makes as many checks or requests as it is given.
pub type Run<'a> = Box<dyn FnMut(u64) + 'a>;

/// Runs every case `total` times (rounded up to whole blocks), `block` at
/// a time, each in turn, the order turning every round so that no case
/// always follows another; each is first run once, uncounted (the clock's
/// calibration). Each case's nanoseconds per item, in order.
pub fn interleave(runs: &mut [Run<'_>], total: u64, block: u64) -> Vec<f64> {
    let mut spent = vec![Duration::ZERO; runs.len()];
    runs.iter_mut().for_each(|run| run(1));
    let blocks = total.div_ceil(block);
    for round in 0..blocks as usize {
        for i in 0..runs.len() {
            let at = (round + i) % runs.len();
            let start = Instant::now();
            runs[at](block);
            spent[at] += start.elapsed();
        }
    }
    let made = (blocks * block) as f64;
    spent.iter().map(|d| d.as_nanos() as f64 / made).collect()
}
