//! A validated quota and what it tells.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Params;
use crate::algorithm::{Algorithm, Mode, fixed_window, token_bucket, word};

/// A validated quota: `limit` per `period` (with a `burst` for the bucket
/// algorithms), its algorithm, name and mode.
///
/// Built with one of the constructors and [`QuotaBuilder::build`](super::QuotaBuilder::build), which
/// refuses invalid quotas, so nothing is checked again at request time.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
///
/// let per_minute = Quota::sliding_window(10, Duration::from_secs(60)).build()?;
/// let bursty = Quota::token_bucket(100, Duration::from_secs(1)).burst(200).build()?;
/// let spaced = Quota::min_interval(Duration::from_secs(3)).build()?;
/// assert_eq!(per_minute.name(), "10-per-60s");
/// # let _ = (bursty, spaced);
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
///
/// # Ceilings
///
/// Time is whole microseconds (Redis `TIME`'s unit), and every number stays
/// below 2^53 so the Redis scripts compute exactly what memory does. So, per
/// key, in memory and in Redis alike:
///
/// | algorithm | highest rate | what else is bounded |
/// |---|---|---|
/// | GCRA, leaky bucket | 1 unit per microsecond (1 000 000 a second): one unit's interval is at least 1 µs | burst x interval < 2^53 µs |
/// | token bucket | burst x (period / gcd(limit, period)) < 2^53, period in µs: 10^9 a second with a burst of 10^9 fits | |
/// | fixed and sliding window | limit < 2^53 per period | period < 2^51 µs |
/// | sliding log | limit <= 2^24 (each admission is logged) | |
///
/// A quota past its ceiling is refused by [`build`](super::QuotaBuilder::build)
/// ([`QuotaError::RateTooHigh`](super::QuotaError::RateTooHigh) or
/// [`TooLarge`](super::QuotaError::TooLarge)), never silently rounded.
/// For a fleet-wide limit above a million a second, use a token bucket: with
/// the same limit and burst it enforces the same rate as GCRA.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Quota, QuotaError};
///
/// assert!(matches!(
///     Quota::gcra(1_000_000_000, Duration::from_secs(1)).build(),
///     Err(QuotaError::RateTooHigh { .. })
/// ));
/// assert!(Quota::token_bucket(1_000_000_000, Duration::from_secs(1)).build().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    pub(super) name: Arc<str>,
    /// Whether the name was given ([`QuotaBuilder::name`](super::QuotaBuilder::name)),
    /// not made from the limit and period.
    pub(super) named: bool,
    pub(super) algorithm: Algorithm,
    pub(super) limit: u64,
    pub(super) period: Duration,
    pub(super) burst: u64,
    pub(super) mode: Mode,
    pub(super) count_rejected: bool,
    pub(super) counts: Counts,
    pub(crate) params: Params,
    /// How a backend may keep and decide it (alone in its set; in a set of
    /// several, which quotas report numbers derived when read), worked out
    /// once, so that choosing the path costs a request one comparison.
    pub(crate) path: Path,
}

/// What a quota counts: the request's cost (the default), or requests,
/// one each whatever the cost. In one set, "60 requests and 100 000
/// tokens a minute" is a quota counting requests beside one counting the
/// cost (the tokens): both decide each request atomically, and what a
/// reservation settles later (the real token count) moves only the
/// quotas counting the cost.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Counts, Quota, QuotaSet};
///
/// let llm = QuotaSet::new("llm", [
///     Quota::fixed_window(60, Duration::from_secs(60)).counts(Counts::Requests).build()?,
///     Quota::fixed_window(100_000, Duration::from_secs(60)).name("tokens").build()?,
/// ])?;
/// assert_eq!(llm.quotas()[0].counts(), Counts::Requests);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Counts {
    /// Each request spends its cost (1 unless the caller says more).
    #[default]
    Cost,
    /// Each request spends 1, whatever its cost; usage settled after the
    /// request (a charge, or a reservation partly given back) spends or
    /// returns nothing here. Giving a whole reservation back returns its
    /// request.
    Requests,
}

/// How the memory backend keeps and decides a quota alone in its set,
/// decided when the quota is built, so that a check pays one comparison
/// for it; in a set of several, `Arrival` and `SlidingWindow` say which
/// quotas report numbers derived when read (`QuotaSet::evaluate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// One arrival time (GCRA, the leaky bucket, a token bucket with one
    /// unit refilled per microsecond), swapped without a lock.
    Arrival,
    /// A fixed window under one unit a microsecond, not elastic: one
    /// number, swapped without a lock, though not as an arrival time,
    /// counted inside the loop in plain numbers (`fixed_window::Counted`).
    Window,
    /// Any other fixed window not elastic (a million a second or more, a
    /// calendar's): two numbers swapped without a lock, counted as
    /// [`Window`](Path::Window) is.
    WindowPair,
    /// A sliding window, not elastic: two numbers swapped without a lock,
    /// its admissions' numbers computed only when read, alone in its set
    /// or with others.
    SlidingWindow,
    /// A token bucket refilling 2 to 31 units a microsecond (most
    /// fractional rates: 3 a second, 7 a minute), not elastic: one number
    /// (`algorithm::word`), swapped without a lock, decided as an arrival
    /// time is on the bucket's clock, its report computed as
    /// [`Bucket`](Path::Bucket)'s.
    BucketWord,
    /// A token bucket refilling more than 31 units a microsecond, not
    /// elastic: two numbers swapped without a lock, decided inside the
    /// loop in plain numbers (`token_bucket::Taken`), its report computed
    /// once the swap holds.
    Bucket,
    /// An elastic token bucket, fixed or sliding window: two numbers
    /// swapped without a lock where they fit, decided in full in the loop.
    Pair,
    /// Decided under the write lock as any set is: the sliding log, and
    /// any algorithm given no lock-free form.
    Locked,
}

impl Path {
    /// The path of a quota of `algorithm` with `params`.
    pub(super) fn of(algorithm: Algorithm, params: &Params) -> Path {
        let elastic = params.elastic_margin != 0;
        match algorithm {
            Algorithm::Gcra | Algorithm::LeakyBucket => Path::Arrival,
            // A token bucket with one unit refilled per microsecond.
            Algorithm::TokenBucket if token_bucket::kept_as_arrival(params) => Path::Arrival,
            Algorithm::FixedWindow if !elastic && fixed_window::kept_as_one_number(params) => {
                Path::Window
            }
            Algorithm::FixedWindow if !elastic => Path::WindowPair,
            Algorithm::SlidingWindow if !elastic => Path::SlidingWindow,
            Algorithm::TokenBucket if word::keeps_bucket(params) => Path::BucketWord,
            Algorithm::TokenBucket if !elastic => Path::Bucket,
            Algorithm::TokenBucket | Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                Path::Pair
            }
            // The sliding log, and any algorithm given no lock-free form:
            // the write lock decides every state.
            _ => Path::Locked,
        }
    }
}

impl Quota {
    /// The name clients see in headers and problem details: the one given
    /// to [`QuotaBuilder::name`](super::QuotaBuilder::name), else, alone in
    /// a [`QuotaSet::new`](crate::QuotaSet::new), the set's name, else
    /// `<limit>-per-<period>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This quota under `set`'s name, when it is alone in that set and its
    /// own name was made up: so that the one name a user gave shows in
    /// headers and metrics alike. A set name that cannot be sent in a header
    /// (see [`QuotaBuilder::name`](super::QuotaBuilder::name)) leaves the
    /// quota's own.
    pub(crate) fn alone_in(mut self, set: &Arc<str>) -> Quota {
        if !self.named && super::builder::valid_name(set) {
            self.name = Arc::clone(set);
        }
        self
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The nominal limit per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The nominal burst (the limit, for the window algorithms).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// What the quota counts: the cost, or requests.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The units this quota spends of a call spending `cost` units of
    /// cost and `requests` requests (see [`Counts`]).
    #[inline]
    pub(crate) fn units(&self, cost: u64, requests: u64) -> u64 {
        match self.counts {
            Counts::Cost => cost,
            Counts::Requests => requests,
        }
    }

    /// Whether rejected attempts are counted (sliding log only).
    pub fn counts_rejected(&self) -> bool {
        self.count_rejected
    }

    /// The calendar whose periods are this fixed window's windows, if any
    /// ([`QuotaBuilder::calendar`](super::QuotaBuilder::calendar)).
    pub fn calendar(&self) -> Option<&crate::calendar::Calendar> {
        self.params.calendar.map(|w| &w.calendar)
    }

    /// The largest cost one request can have: more can never be admitted.
    pub fn max_cost(&self) -> u64 {
        self.params.capacity
    }
}
