//! Top offenders: a bounded heavy-hitter summary of a rule's keys.
//!
//! Space-Saving (Metwally, Agrawal and El Abbadi, 2005) with `k` counters:
//! a key seen again adds to its counter; a new key takes over the smallest
//! counter, inheriting its count as its possible error. With `n` keys
//! recorded in all, every key seen more than `n / k` times is in the
//! summary, and each count is at most `n / k` above the truth (the error
//! reported beside it). Memory is `k` entries whatever the number of keys.
//!
//! Admitted decisions, the hot path's, are counted one by one until a
//! rule's summary has counted [`EXACT_ADMITTED`] of them, then one in
//! [`SAMPLE`] (chosen at random), as `SAMPLE` decisions: counting each one
//! was most of what the summary cost a request, and a key heavy enough to
//! matter is seen often enough for the sample to find it (a count of `c`
//! is then off by about `sqrt(SAMPLE * c)`, beside the sketch's error).
//! Refusals are always counted one by one.

// Read by the admin API (the `admin` feature); the request path uses a part.
#![cfg_attr(not(feature = "admin"), allow(dead_code))]

use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use compact_str::CompactString;

/// Counters per summary: a key seen in more than 1/64 of a rule's decisions
/// of one kind is always found.
pub(crate) const COUNTERS: usize = 64;

/// Admitted decisions a rule's summary counts one by one, before it
/// samples them.
pub(crate) const EXACT_ADMITTED: u64 = 1_024;

/// Past [`EXACT_ADMITTED`], one admitted decision in this many is counted,
/// as this many.
pub(crate) const SAMPLE: u64 = 8;

/// The longest key kept: a longer one is kept cut (its count stays its
/// own, as the hash is of the whole key).
const MAX_KEPT: usize = 256;

/// One counter.
#[derive(Clone, Debug)]
struct Counter {
    hash: u64,
    count: u64,
    error: u64,
    key: CompactString,
}

/// Slots of the direct-mapped index (a power of two).
const INDEX: usize = 256;
/// An empty index slot.
const NONE: u8 = u8::MAX;

/// A Space-Saving summary of at most `k` keys (at most 255).
#[derive(Debug)]
pub(crate) struct SpaceSaving {
    counters: Vec<Counter>,
    /// Where a key was last seen, by the low bits of its hash: a key seen
    /// again (the heavy hitters, most decisions of a flood) is found in
    /// one probe, not a scan of the counters. A stale or colliding slot is
    /// caught by the hash check, and the scan decides.
    index: [u8; INDEX],
    k: usize,
    total: u64,
    hasher: foldhash::fast::FixedState,
}

/// One key of a summary's top: its count, and by how much that count may
/// be over the truth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Heavy {
    pub key: String,
    pub count: u64,
    pub error: u64,
}

impl SpaceSaving {
    /// A summary of `k` counters (at least one).
    pub(crate) fn new(k: usize) -> Self {
        SpaceSaving {
            counters: Vec::with_capacity(k.clamp(1, 255)),
            index: [NONE; INDEX],
            k: k.clamp(1, 255),
            total: 0,
            hasher: foldhash::fast::FixedState::with_seed(0x746f_6c6c_6761_7465),
        }
    }

    /// Counts `weight` more decisions of `key` (the weighted form of the
    /// algorithm: its bound holds with `n` the weights' sum).
    pub(crate) fn record(&mut self, key: &str, weight: u64) {
        use std::hash::BuildHasher;
        let hash = self.hasher.hash_one(key);
        self.total += weight;
        let slot = &mut self.index[hash as usize & (INDEX - 1)];
        if let Some(c) = self.counters.get_mut(usize::from(*slot)) {
            if c.hash == hash && c.key == kept(key) {
                c.count += weight;
                return;
            }
        }
        // Not where the index says: a scan of the counters decides.
        let found = (self.counters.iter()).position(|c| c.hash == hash && c.key == kept(key));
        let at = match found {
            Some(at) => {
                self.counters[at].count += weight;
                at
            }
            None if self.counters.len() < self.k => {
                self.counters.push(Counter {
                    hash,
                    count: weight,
                    error: 0,
                    key: kept(key).into(),
                });
                self.counters.len() - 1
            }
            None => {
                let Some((at, min)) =
                    (self.counters.iter_mut().enumerate()).min_by_key(|(_, c)| c.count)
                else {
                    return;
                };
                min.error = min.count;
                min.count += weight;
                min.hash = hash;
                min.key = kept(key).into();
                at
            }
        };
        // Below 255 counters, so the position fits and is never NONE.
        *slot = u8::try_from(at).unwrap_or(NONE);
    }

    /// The `n` keys with the highest counts, highest first.
    pub(crate) fn top(&self, n: usize) -> Vec<Heavy> {
        let mut all: Vec<&Counter> = self.counters.iter().collect();
        all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        all.into_iter()
            .take(n)
            .map(|c| Heavy {
                key: c.key.to_string(),
                count: c.count,
                error: c.error,
            })
            .collect()
    }

    /// Decisions recorded in all.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// The bytes this summary holds, its keys included: bounded by `k`.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.counters.capacity() * std::mem::size_of::<Counter>()
            + (self.counters.iter())
                .map(|c| {
                    if c.key.is_heap_allocated() {
                        c.key.capacity()
                    } else {
                        0
                    }
                })
                .sum::<usize>()
    }
}

/// The part of `key` a counter keeps.
fn kept(key: &str) -> &str {
    if key.len() <= MAX_KEPT {
        return key;
    }
    let mut end = MAX_KEPT;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    &key[..end]
}

/// A rule's two summaries: the keys it admitted and the keys it refused.
#[derive(Debug)]
pub(crate) struct TopKeys {
    admitted: Mutex<SpaceSaving>,
    refused: Mutex<SpaceSaving>,
    /// Whether admitted decisions are sampled now (see the module): read
    /// by every admission, written once, so its cache line stays shared.
    sampling: AtomicBool,
}

impl Default for TopKeys {
    fn default() -> Self {
        TopKeys {
            admitted: Mutex::new(SpaceSaving::new(COUNTERS)),
            refused: Mutex::new(SpaceSaving::new(COUNTERS)),
            sampling: AtomicBool::new(false),
        }
    }
}

/// Whether this admitted decision is in the sample: one in [`SAMPLE`], by
/// a generator of each thread's own (xorshift), so that no order of
/// requests a client chooses is counted more or less than its share, and
/// threads share no state for it.
#[inline]
fn sampled() -> bool {
    thread_local! {
        static STATE: Cell<u32> = const { Cell::new(0x2545_f491) };
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        state.set(x);
        // The high bits, the generator's best.
        x >> (32 - SAMPLE.trailing_zeros()) == 0
    })
}

impl TopKeys {
    /// Counts a decision of `key`. Never waits: while another thread
    /// holds the summary, this decision goes uncounted (the summary is an
    /// estimate already, and the request path must not queue behind it).
    /// Admissions are sampled once the summary has counted
    /// [`EXACT_ADMITTED`] of them.
    #[inline]
    pub(crate) fn record(&self, key: &str, refused: bool) {
        if refused {
            if let Ok(mut summary) = self.refused.try_lock() {
                summary.record(key, 1);
            }
            return;
        }
        let weight = if self.sampling.load(Ordering::Relaxed) {
            if !sampled() {
                return;
            }
            SAMPLE
        } else {
            1
        };
        if let Ok(mut summary) = self.admitted.try_lock() {
            summary.record(key, weight);
            if weight == 1 && summary.total() >= EXACT_ADMITTED {
                self.sampling.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The top `n` of the refused (`refused`) or admitted keys, and the
    /// decisions the summary counted.
    pub(crate) fn top(&self, n: usize, refused: bool) -> (Vec<Heavy>, u64) {
        let summary = if refused {
            &self.refused
        } else {
            &self.admitted
        };
        let summary = crate::sync::lock(summary);
        (summary.top(n), summary.total())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100 000 keys seen once or twice, and 5 keys seen 3 000 times each,
    /// interleaved: the summary's top 5 are the 5.
    fn flood(distinct: u64) -> SpaceSaving {
        let mut s = SpaceSaving::new(COUNTERS);
        let heavy: Vec<String> = (0..5).map(|i| format!("key:heavy-{i}")).collect();
        let mut light = 0u64;
        for round in 0..3_000u64 {
            for h in &heavy {
                s.record(h, 1);
            }
            // Spread the distinct keys over the rounds.
            let per_round = distinct.div_ceil(3_000);
            for _ in 0..per_round {
                if light < distinct {
                    s.record(
                        &format!(
                            "ip:10.{}.{}.{}",
                            light >> 16,
                            (light >> 8) & 255,
                            light & 255
                        ),
                        1,
                    );
                    light += 1;
                }
            }
            let _ = round;
        }
        s
    }

    #[test]
    fn a_flood_of_100_000_keys_with_5_heavy_ones_finds_the_5() {
        let s = flood(100_000);
        let top: Vec<String> = s.top(5).into_iter().map(|h| h.key).collect();
        let mut top = top;
        top.sort();
        let want: Vec<String> = (0..5).map(|i| format!("key:heavy-{i}")).collect();
        assert_eq!(top, want);
        for h in s.top(5) {
            // Space-Saving's bound: the count is at most n/k over the truth.
            assert!(h.count >= 3_000, "{h:?}");
            assert!(h.count - h.error <= 3_000, "{h:?}");
            assert!(h.error <= s.total() / COUNTERS as u64, "{h:?}");
        }
    }

    #[test]
    fn every_decision_lands_on_one_counter_and_no_key_has_two() {
        let s = flood(20_000);
        let all = s.top(COUNTERS);
        assert_eq!(all.iter().map(|h| h.count).sum::<u64>(), s.total());
        let mut keys: Vec<&str> = all.iter().map(|h| h.key.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), all.len(), "a key counted in two counters");
    }

    #[test]
    fn memory_stays_flat_as_the_key_count_grows_tenfold() {
        let small = flood(10_000).heap_bytes();
        let large = flood(100_000).heap_bytes();
        assert!(small > 0);
        assert_eq!(
            small, large,
            "the summary holds k entries whatever the key count"
        );
        assert!(large <= COUNTERS * (std::mem::size_of::<Counter>() + MAX_KEPT));
    }

    /// Admissions are counted exactly up to `EXACT_ADMITTED`, then
    /// sampled: a heavy key's count stays near the truth (within 10%, over
    /// 20 standard deviations of the sample's), and light keys do not
    /// push it out.
    #[test]
    fn admissions_are_exact_at_first_then_sampled_near_the_truth() {
        let top = TopKeys::default();
        for _ in 0..EXACT_ADMITTED {
            top.record("key:heavy", false);
        }
        assert_eq!(top.top(1, false).0[0].count, EXACT_ADMITTED, "exact so far");
        assert!(top.sampling.load(Ordering::Relaxed));
        let more = 40_000;
        for i in 0..more {
            top.record("key:heavy", false);
            top.record(&format!("ip:10.0.{}.{}", i >> 8 & 255, i & 255), false);
        }
        let (heavy, counted) = top.top(1, false);
        let truth = EXACT_ADMITTED + more;
        assert_eq!(heavy[0].key, "key:heavy");
        let off = heavy[0].count.abs_diff(truth);
        assert!(off <= truth / 10, "{heavy:?}, truth {truth}");
        assert!(counted.abs_diff(EXACT_ADMITTED + 2 * more) <= 2 * more / 10);
        // Refusals stay exact.
        for _ in 0..3 {
            top.record("key:heavy", true);
        }
        assert_eq!(top.top(1, true).0[0].count, 3);
    }

    #[test]
    fn a_long_key_is_kept_cut_and_counted_as_itself() {
        let mut s = SpaceSaving::new(4);
        let long = "é".repeat(300);
        s.record(&long, 1);
        s.record(&long, 1);
        let top = s.top(1);
        assert_eq!(top[0].count, 2);
        assert!(top[0].key.len() <= MAX_KEPT);
    }
}
