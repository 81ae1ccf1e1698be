//! Leases: a batch of a key's units taken from Redis in one script call and
//! spent here, so that a hot key costs Redis one call per batch instead of
//! one per request.
//!
//! The units are spent in Redis when leased, so the fleet never admits more
//! than Redis would have. What a lease can cost is the other way round:
//! units parked in a process that does not use them are refused to the rest
//! of the fleet until they are given back or lapse.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use smallvec::SmallVec;

use crate::clock::micros;
use crate::decision::Decision;
use crate::quota::Algorithm;
use crate::quota_set::{QuotaSet, RawQuotaDecision};

/// How many units a [`RedisBackend`](super::RedisBackend) takes from Redis
/// at once for one key: its lease mode (`backend.redis.lease` in a rules
/// file, `--redis-lease` for the gateway).
///
/// Leases apply to the token bucket, GCRA, fixed window and sliding window
/// counter. The sliding log and the leaky bucket need to see every arrival:
/// sets holding one are refused by the rules and the gateway when leases are
/// on, and checked one request at a time (as with `Off`) through the direct
/// API ([`RedisBackend::supports_leases`](super::RedisBackend::supports_leases)
/// tells which).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Lease {
    /// Every decision is one Redis call (the default).
    #[default]
    Off,
    /// Leases sized to the key's traffic, up to [`Lease::AUTO_MAX`] units
    /// and an eighth of the smallest capacity in the quota set.
    Auto,
    /// Leases sized to the key's traffic, up to this many units and an
    /// eighth of the smallest capacity in the quota set (1 leases nothing
    /// beyond the request: every decision is a Redis call).
    Max(u64),
}

impl Lease {
    /// The largest lease in `Auto` mode.
    pub const AUTO_MAX: u64 = 1_000;
    /// The largest lease that can be asked for.
    pub const LIMIT: u64 = 1_000_000_000;

    /// The most units one lease may hold; `None` when off.
    pub fn max_units(self) -> Option<u64> {
        match self {
            Lease::Off => None,
            Lease::Auto => Some(Lease::AUTO_MAX),
            Lease::Max(n) => Some(n),
        }
    }

    /// Whether `algorithm` can be leased: it must not need every arrival.
    pub fn leases(algorithm: Algorithm) -> bool {
        !matches!(algorithm, Algorithm::SlidingLog | Algorithm::LeakyBucket)
    }
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lease::Off => f.write_str("off"),
            Lease::Auto => f.write_str("auto"),
            Lease::Max(n) => write!(f, "{n}"),
        }
    }
}

/// `off`, `auto`, or the most units a lease may hold (1 to
/// [`Lease::LIMIT`]).
impl FromStr for Lease {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Lease::Off),
            "auto" => Ok(Lease::Auto),
            n => match n.parse::<u64>() {
                Ok(n) if (1..=Lease::LIMIT).contains(&n) => Ok(Lease::Max(n)),
                _ => Err(format!(
                    "lease {s:?}: expected off, auto, or a number of units from 1 to {}",
                    Lease::LIMIT
                )),
            },
        }
    }
}

/// Lease mode as the backend runs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Policy {
    /// The most units one lease holds.
    pub max: u64,
    /// The slice of a key's traffic one lease should cover (microseconds).
    pub slice: u64,
    /// How long leased units stay usable (microseconds).
    pub lifetime: u64,
}

/// Growth of a lease from one to the next, at most: a burst of requests
/// close together does not take a large lease on one sample.
const GROWTH: u64 = 4;

/// A lease holds at most this fraction (1 / `CAPACITY_SHARE`) of the
/// smallest capacity in its set, and at least 1 unit. Parked units are what
/// leases cost the fleet (at most lease size x processes): an eighth keeps
/// one process from parking a small quota's whole allowance, so up to 8
/// processes can all be admitted from a hot key's capacity at once, while a
/// saturated key still takes 8 units' worth of traffic per Redis call once
/// its capacity reaches 64.
const CAPACITY_SHARE: u64 = 8;

impl Policy {
    pub(crate) fn new(lease: Lease, slice: Duration, lifetime: Duration) -> Option<Policy> {
        Some(Policy {
            max: lease.max_units()?,
            slice: micros(slice).max(1),
            lifetime: micros(lifetime).max(1),
        })
    }

    /// The most units one lease of `quotas` holds: the mode's maximum, and
    /// a share of the smallest capacity in the set (see [`CAPACITY_SHARE`]).
    pub(crate) fn most(&self, quotas: &QuotaSet) -> u64 {
        let smallest = quotas.quotas().iter().map(|q| q.max_cost()).min();
        let share = smallest.map_or(1, |c| c / CAPACITY_SHARE).max(1);
        self.max.min(share)
    }

    /// Units to ask for a request of `cost` of `quotas` at `now`, given the
    /// key's last lease here: enough for a slice at the pace that lease was
    /// spent, up to [`most`](Self::most). A key with no recent lease asks
    /// for the cost alone, as without leases, and so does any request
    /// costing more than a lease may hold.
    pub(crate) fn want(
        &self,
        cost: u64,
        last: Option<&Leased>,
        quotas: &QuotaSet,
        now: u64,
    ) -> u64 {
        // A cost of 0 asks how things stand: it takes nothing.
        let Some(last) = last.filter(|_| cost > 0) else {
            return cost;
        };
        let used = last.size - last.units;
        let elapsed = now.saturating_sub(last.taken).max(1);
        let paced = u64::try_from(
            (u128::from(used) * u128::from(self.slice)).div_ceil(u128::from(elapsed)),
        )
        .unwrap_or(u64::MAX);
        paced
            .clamp(
                1,
                self.most(quotas)
                    .min(last.size.saturating_mul(GROWTH))
                    .max(1),
            )
            .max(cost)
    }
}

/// Units leased from Redis and held here for one key.
#[derive(Debug, Clone)]
pub(crate) struct Leased {
    /// Units left.
    pub units: u64,
    /// Units the lease took, the request that took it included.
    pub size: u64,
    /// When it was asked for, and until when its units may be spent
    /// (microseconds on the backend's local clock).
    pub taken: u64,
    pub expires: u64,
    /// Redis's time when it was taken: given back units are weighed by it.
    pub redis_at: u64,
    /// Redis's verdicts on the lease, for what local decisions report.
    pub verdicts: SmallVec<[RawQuotaDecision; 2]>,
}

impl Leased {
    /// Spends `cost` if the lease holds that much and is still live. An
    /// empty lease (one that took the request alone) answers nothing, not
    /// even a cost of 0: Redis's numbers have moved on since.
    pub(crate) fn spend(&mut self, cost: u64, now: u64, quotas: &QuotaSet) -> Option<Decision> {
        if now >= self.expires || self.units == 0 || self.units < cost {
            return None;
        }
        self.units -= cost;
        Some(self.decision(now, quotas))
    }

    /// The decision an admission from this lease reports: what Redis had
    /// left, plus what the lease holds; resets shortened by the time passed.
    pub(crate) fn decision(&self, now: u64, quotas: &QuotaSet) -> Decision {
        let elapsed = now.saturating_sub(self.taken);
        let seen = |v: &RawQuotaDecision| RawQuotaDecision {
            remaining: v.remaining.saturating_add(self.units),
            reset: v.reset.saturating_sub(elapsed),
            ..*v
        };
        // One quota, the common case, on the stack: collecting into a
        // SmallVec costs more than the rest of the decision (callgrind).
        match &self.verdicts[..] {
            [v] => quotas.decision_from(&[seen(v)]),
            verdicts => {
                let verdicts: SmallVec<[RawQuotaDecision; 2]> = verdicts.iter().map(seen).collect();
                quotas.decision_from(&verdicts)
            }
        }
    }

    /// The units to give back to Redis, and the Redis time they were taken.
    pub(crate) fn give_back(&self) -> Option<(u64, u64)> {
        (self.units > 0).then_some((self.units, self.redis_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(size: u64, units: u64, taken: u64) -> Leased {
        Leased {
            units,
            size,
            taken,
            expires: taken + 50_000,
            redis_at: 0,
            verdicts: SmallVec::new(),
        }
    }

    #[test]
    fn lease_modes_parse_and_refuse_nonsense() {
        assert_eq!("off".parse(), Ok(Lease::Off));
        assert_eq!("auto".parse(), Ok(Lease::Auto));
        assert_eq!("250".parse(), Ok(Lease::Max(250)));
        for bad in [
            "0",
            "-1",
            "",
            "Auto",
            "1e3",
            "1000000001",
            "99999999999999999999",
        ] {
            assert!(bad.parse::<Lease>().is_err(), "{bad:?}");
        }
        assert_eq!(Lease::Max(250).to_string(), "250");
        assert_eq!(Lease::Off.max_units(), None);
        assert!(!Lease::leases(Algorithm::SlidingLog));
        assert!(!Lease::leases(Algorithm::LeakyBucket));
        assert!(Lease::leases(Algorithm::Gcra));
    }

    fn gcra(capacity: u64) -> QuotaSet {
        let quota = crate::Quota::gcra(capacity, Duration::from_secs(1));
        QuotaSet::single(quota.build().unwrap())
    }

    #[test]
    fn a_quiet_key_asks_for_its_cost_and_a_hot_one_for_a_slice_of_its_traffic() {
        let policy = Policy::new(
            Lease::Max(500),
            Duration::from_millis(10),
            Duration::from_millis(50),
        )
        .unwrap();
        let set = gcra(1_000_000);
        assert_eq!(policy.want(1, None, &set, 0), 1, "no history: the cost");
        assert_eq!(policy.want(3, None, &set, 0), 3);
        assert_eq!(policy.want(0, Some(&held(100, 0, 0)), &set, 10_000), 0);
        // One unit a second: a 10 ms slice holds less than one.
        assert_eq!(policy.want(1, Some(&held(1, 0, 0)), &set, 1_000_000), 1);
        // 100 units spent in 10 ms (10 000/s): 100 for the next 10 ms.
        assert_eq!(policy.want(1, Some(&held(100, 0, 0)), &set, 10_000), 100);
        // Faster still, but growth is bounded per lease, and by the maximum.
        assert_eq!(policy.want(1, Some(&held(2, 0, 0)), &set, 10), 8);
        assert_eq!(policy.want(1, Some(&held(400, 0, 0)), &set, 10), 500);
        // A request costing more than the lease would be still asks its cost.
        assert_eq!(policy.want(600, Some(&held(400, 0, 0)), &set, 10), 600);
    }

    #[test]
    fn a_lease_holds_at_most_an_eighth_of_the_smallest_capacity() {
        let auto = Policy::new(
            Lease::Auto,
            Duration::from_millis(10),
            Duration::from_millis(50),
        )
        .unwrap();
        let hot = held(400, 0, 0);
        assert_eq!(auto.most(&gcra(10)), 1, "a quota of 10: no lease at all");
        assert_eq!(auto.want(1, Some(&hot), &gcra(10), 10), 1);
        assert_eq!(auto.want(1, Some(&hot), &gcra(80), 10), 10);
        assert_eq!(auto.want(1, Some(&hot), &gcra(7), 10), 1, "at least 1");
        assert_eq!(auto.most(&gcra(1_000_000)), Lease::AUTO_MAX);
        // The smallest quota of a set bounds it.
        let both = QuotaSet::new(
            "both",
            [
                crate::Quota::gcra(1_000, Duration::from_secs(1))
                    .build()
                    .unwrap(),
                crate::Quota::fixed_window(160, Duration::from_secs(60))
                    .build()
                    .unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(auto.want(1, Some(&hot), &both, 10), 20);
        // A request costing more than a lease may hold asks its cost.
        assert_eq!(auto.want(5, Some(&hot), &gcra(10), 10), 5);
        let fixed = Policy::new(
            Lease::Max(500),
            Duration::from_millis(10),
            Duration::from_millis(50),
        )
        .unwrap();
        assert_eq!(fixed.most(&gcra(80)), 10, "an explicit maximum too");
    }
}
