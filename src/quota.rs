//! Quotas: how much a key may spend, over what period, by which algorithm.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::micros;

/// The largest integer a Lua number (a double) holds exactly. Every value an
/// algorithm stores or compares stays below it, so the Redis scripts compute
/// exactly what the in-memory backend computes.
pub(crate) const EXACT_MAX: u64 = 1 << 53;

/// The rate-limiting algorithms. See the crate documentation for which to
/// pick for what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// A bucket of `burst` tokens refilled continuously at `limit` per
    /// `period`; a request spends `cost` tokens. Allows bursts, smooth
    /// average.
    TokenBucket,
    /// A queue of `burst` places drained at `limit` per `period`: an admitted
    /// request is given a delay until its turn, so the output is evenly spaced.
    LeakyBucket,
    /// A counter per window of `period`, windows aligned to multiples of the
    /// period since the Unix epoch. Cheap, but up to twice the limit can pass
    /// around a window boundary.
    FixedWindow,
    /// The timestamps of the admitted requests within the last `period` (at
    /// most `limit` of them). Exact: no rolling period ever admits more than
    /// `limit`.
    SlidingLog,
    /// Cloudflare's sliding window counter: the previous window's count,
    /// weighted by how much of it is still inside the rolling period, plus the
    /// current window's count. Close to exact for the memory of two counters.
    SlidingWindow,
    /// The generic cell rate algorithm: one timestamp per key (the
    /// "theoretical arrival time"), as governor and redis-cell use. Behaves as
    /// a token bucket of `burst` with one number of state.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in the order of the documentation.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ];

    /// The name used in configuration files and logs (`token_bucket`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Whether `burst` means anything to this algorithm (the window
    /// algorithms count to `limit` and have no separate burst).
    pub const fn has_burst(self) -> bool {
        matches!(
            self,
            Algorithm::TokenBucket | Algorithm::LeakyBucket | Algorithm::Gcra
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = QuotaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| QuotaError::UnknownAlgorithm(s.to_owned()))
    }
}

/// What a quota does with a request it would reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Reject it.
    #[default]
    Enforce,
    /// Let it through, but report that it would have been rejected. The
    /// quota's state evolves as if it were enforced, so the reports show what
    /// enforcing would do.
    Shadow,
    /// Admit up to `percent` per cent over the limit (soft throttling). The
    /// reported limit stays the nominal one.
    Soft {
        /// How far over the limit, in per cent of the limit (rounded down).
        percent: u16,
    },
}

/// Why a quota could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The period is shorter than one microsecond.
    ZeroPeriod,
    /// The limit is zero: a quota that admits nothing is a denylist, not a quota.
    ZeroLimit,
    /// The burst is zero.
    BurstBelowOne,
    /// A burst was given to an algorithm that has none.
    BurstNotApplicable(Algorithm),
    /// Counting rejected attempts was asked of an algorithm other than the sliding log.
    CountRejectedNotApplicable(Algorithm),
    /// More than one request per microsecond cannot be spaced out.
    RateTooHigh {
        /// The limit.
        limit: u64,
        /// The period.
        period: Duration,
    },
    /// The numbers are too large to be computed exactly (in Redis's Lua too).
    TooLarge,
    /// A name that is not one of the algorithms.
    UnknownAlgorithm(String),
    /// A quota name that clients could not be sent: 1 to 64 printable ASCII
    /// characters are allowed.
    InvalidName(String),
    /// An elastic concurrency quota's ceiling is below its limit.
    CeilingBelowLimit {
        /// The limit.
        limit: u64,
        /// The ceiling.
        ceiling: u64,
    },
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::ZeroPeriod => f.write_str("the period must be at least one microsecond"),
            QuotaError::ZeroLimit => f.write_str("the limit must be at least 1"),
            QuotaError::BurstBelowOne => f.write_str("the burst must be at least 1"),
            QuotaError::BurstNotApplicable(a) => write!(
                f,
                "{a} has no burst (only token_bucket, leaky_bucket and gcra do); remove it"
            ),
            QuotaError::CountRejectedNotApplicable(a) => write!(
                f,
                "counting rejected attempts applies to sliding_log only, not {a}"
            ),
            QuotaError::RateTooHigh { limit, period } => write!(
                f,
                "{limit} per {period:?} is more than one per microsecond; use a longer period"
            ),
            QuotaError::TooLarge => f.write_str(
                "burst x period is too large to compute exactly; use a smaller burst or period",
            ),
            QuotaError::CeilingBelowLimit { limit, ceiling } => {
                write!(
                    f,
                    "the ceiling ({ceiling}) must be at least the limit ({limit})"
                )
            }
            QuotaError::InvalidName(n) => write!(
                f,
                "quota name {n:?} must be 1 to 64 printable ASCII characters"
            ),
            QuotaError::UnknownAlgorithm(s) => {
                write!(f, "unknown algorithm {s:?}; valid algorithms are ")?;
                for (i, a) in Algorithm::ALL.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(a.name())?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for QuotaError {}

/// A validated quota: `limit` per `period` (with a `burst` for the bucket
/// algorithms), its algorithm, name and mode.
///
/// Built with one of the constructors and [`QuotaBuilder::build`], which
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    name: Arc<str>,
    algorithm: Algorithm,
    limit: u64,
    period: Duration,
    burst: u64,
    mode: Mode,
    count_rejected: bool,
    pub(crate) params: Params,
}

/// The integers the algorithms compute with, derived once when the quota is
/// built (and sent as-is to the Redis scripts). Soft mode is folded in here:
/// the algorithms only ever see the effective capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Params {
    /// The period in microseconds.
    pub period: u64,
    /// The effective limit per period.
    pub limit: u64,
    /// The effective capacity: the burst for the bucket algorithms, the limit
    /// for the window algorithms. No single request may cost more.
    pub capacity: u64,
    /// The nominal capacity, reported to clients.
    pub reported_capacity: u64,
    /// Microseconds between two units at the effective rate, rounded up
    /// (GCRA and leaky bucket).
    pub interval: u64,
    /// Token bucket: the stored level is in units of `1/unit` token ...
    pub unit: u64,
    /// ... and `refill` of those units arrive every microsecond.
    pub refill: u64,
    /// Sliding log: rejected attempts are logged too.
    pub count_rejected: bool,
    /// Shadow mode: a rejection here does not reject the request.
    pub shadow: bool,
}

impl Quota {
    /// A token bucket of `limit` per `period`, burst `limit` unless set.
    pub fn token_bucket(limit: u64, period: Duration) -> QuotaBuilder {
        QuotaBuilder::new(Algorithm::TokenBucket, limit, period)
    }

    /// A leaky bucket (queue) draining `limit` per `period`, holding `limit`
    /// requests unless a burst is set. `burst(1)` means "never wait".
    pub fn leaky_bucket(limit: u64, period: Duration) -> QuotaBuilder {
        QuotaBuilder::new(Algorithm::LeakyBucket, limit, period)
    }

    /// A fixed window counter of `limit` per `period`.
    pub fn fixed_window(limit: u64, period: Duration) -> QuotaBuilder {
        QuotaBuilder::new(Algorithm::FixedWindow, limit, period)
    }

    /// A sliding window log of `limit` per `period`.
    pub fn sliding_log(limit: u64, period: Duration) -> QuotaBuilder {
        QuotaBuilder::new(Algorithm::SlidingLog, limit, period)
    }

    /// A sliding window counter of `limit` per `period`.
    pub fn sliding_window(limit: u64, period: Duration) -> QuotaBuilder {
        QuotaBuilder::new(Algorithm::SlidingWindow, limit, period)
    }

    /// GCRA at `limit` per `period`, burst `limit` unless set.
    pub fn gcra(limit: u64, period: Duration) -> QuotaBuilder {
        QuotaBuilder::new(Algorithm::Gcra, limit, period)
    }

    /// Any algorithm, chosen at run time (from a configuration file, say).
    pub fn builder(algorithm: Algorithm, limit: u64, period: Duration) -> QuotaBuilder {
        QuotaBuilder::new(algorithm, limit, period)
    }

    /// At least `interval` between two admitted actions: GCRA with one unit
    /// per interval and no burst.
    pub fn min_interval(interval: Duration) -> QuotaBuilder {
        let mut b = QuotaBuilder::new(Algorithm::Gcra, 1, interval).burst(1);
        b.name = Some(format!("min-interval-{}", period_label(interval)).into());
        b
    }

    /// The name clients see in headers and problem details.
    pub fn name(&self) -> &str {
        &self.name
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

    /// Whether rejected attempts are counted (sliding log only).
    pub fn counts_rejected(&self) -> bool {
        self.count_rejected
    }

    /// The largest cost one request can have: more can never be admitted.
    pub fn max_cost(&self) -> u64 {
        self.params.capacity
    }
}

/// The longest quota name, in bytes.
const MAX_NAME_LEN: usize = 64;

/// Whether a name can be sent as an RFC 9651 string (sf-string): printable
/// ASCII, `"` and `\` escaped when written.
fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME_LEN).contains(&name.len()) && name.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// Builds a [`Quota`]; see [`Quota::token_bucket`] and its siblings.
#[derive(Debug, Clone)]
#[must_use = "call .build() to get the quota"]
pub struct QuotaBuilder {
    algorithm: Algorithm,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
    name: Option<Arc<str>>,
    mode: Mode,
    count_rejected: bool,
}

impl QuotaBuilder {
    fn new(algorithm: Algorithm, limit: u64, period: Duration) -> Self {
        QuotaBuilder {
            algorithm,
            limit,
            period,
            burst: None,
            name: None,
            mode: Mode::Enforce,
            count_rejected: false,
        }
    }

    /// The bucket size (token bucket, GCRA) or queue size (leaky bucket).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The name clients see (`RateLimit-Policy`, `violated-policies`). The
    /// default is `<limit>-per-<period>`, such as `10-per-60s`. It is sent as
    /// an RFC 9651 string, so [`build`](Self::build) refuses a name that is
    /// empty, over 64 bytes, or not printable ASCII (space to `~`)
    /// ([`QuotaError::InvalidName`]).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Enforce (default), shadow, or soft.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Sliding log only: log rejected attempts too, so a client that keeps
    /// retrying stays limited (ClassDojo's variant).
    pub fn count_rejected(mut self, yes: bool) -> Self {
        self.count_rejected = yes;
        self
    }

    /// Validates the quota.
    pub fn build(self) -> Result<Quota, QuotaError> {
        let a = self.algorithm;
        if let Some(name) = &self.name {
            if !valid_name(name) {
                return Err(QuotaError::InvalidName(name.to_string()));
            }
        }
        let period = micros(self.period);
        if period == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        if self.limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if self.burst == Some(0) {
            return Err(QuotaError::BurstBelowOne);
        }
        if self.burst.is_some() && !a.has_burst() {
            return Err(QuotaError::BurstNotApplicable(a));
        }
        if self.count_rejected && a != Algorithm::SlidingLog {
            return Err(QuotaError::CountRejectedNotApplicable(a));
        }
        if matches!(a, Algorithm::Gcra | Algorithm::LeakyBucket) && self.limit > period {
            return Err(QuotaError::RateTooHigh {
                limit: self.limit,
                period: self.period,
            });
        }
        let burst = self.burst.unwrap_or(self.limit);
        let soft = |n: u64| match self.mode {
            Mode::Soft { percent } => {
                n.saturating_add((u128::from(n) * u128::from(percent) / 100) as u64)
            }
            _ => n,
        };
        let limit = soft(self.limit);
        let capacity = soft(burst);
        let interval = period.div_ceil(limit);
        let g = gcd(period, limit);
        let (unit, refill) = (period / g, limit / g);
        let too_large = match a {
            Algorithm::TokenBucket => capacity.checked_mul(unit).is_none_or(|c| c >= EXACT_MAX),
            Algorithm::Gcra | Algorithm::LeakyBucket => capacity
                .checked_mul(interval)
                .is_none_or(|c| c >= EXACT_MAX),
            Algorithm::SlidingLog => capacity > 1 << 24,
            _ => capacity >= EXACT_MAX || period >= EXACT_MAX / 4,
        };
        if too_large {
            return Err(QuotaError::TooLarge);
        }
        let name = self
            .name
            .unwrap_or_else(|| format!("{}-per-{}", self.limit, period_label(self.period)).into());
        Ok(Quota {
            name,
            algorithm: a,
            limit: self.limit,
            period: self.period,
            burst,
            mode: self.mode,
            count_rejected: self.count_rejected,
            params: Params {
                period,
                limit,
                capacity,
                reported_capacity: burst,
                interval,
                unit,
                refill,
                count_rejected: self.count_rejected,
                shadow: self.mode == Mode::Shadow,
            },
        })
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `60s`, `1500ms`, `250us`: the shortest exact label.
fn period_label(d: Duration) -> String {
    let us = micros(d);
    if us % 1_000_000 == 0 {
        format!("{}s", us / 1_000_000)
    } else if us % 1_000 == 0 {
        format!("{}ms", us / 1_000)
    } else {
        format!("{us}us")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn names_clients_could_not_be_sent_are_refused() {
        let named = |n: &str| Quota::gcra(10, MIN).name(n.to_owned()).build();
        for bad in [
            "",
            "tab\there",
            "new\nline",
            "caf\u{e9}",
            "nul\0",
            &"x".repeat(65),
        ] {
            assert_eq!(
                named(bad),
                Err(QuotaError::InvalidName(bad.to_owned())),
                "{bad:?}"
            );
        }
        for good in ["per-minute", "a b \"c\" \\d ~", &"x".repeat(64)] {
            assert_eq!(
                named(good).map(|q| q.name().to_owned()),
                Ok(good.to_owned())
            );
        }
    }

    #[test]
    fn invalid_quotas_are_refused_when_built() {
        assert_eq!(
            Quota::gcra(10, Duration::ZERO).build(),
            Err(QuotaError::ZeroPeriod)
        );
        assert_eq!(Quota::gcra(0, MIN).build(), Err(QuotaError::ZeroLimit));
        assert_eq!(
            Quota::token_bucket(5, MIN).burst(0).build(),
            Err(QuotaError::BurstBelowOne)
        );
        assert_eq!(
            Quota::fixed_window(5, MIN).burst(3).build(),
            Err(QuotaError::BurstNotApplicable(Algorithm::FixedWindow))
        );
        assert_eq!(
            Quota::gcra(5, MIN).count_rejected(true).build(),
            Err(QuotaError::CountRejectedNotApplicable(Algorithm::Gcra))
        );
        assert!(matches!(
            Quota::gcra(2_000_000, Duration::from_secs(1)).build(),
            Err(QuotaError::RateTooHigh { .. })
        ));
    }

    #[test]
    fn unknown_algorithm_names_the_valid_ones() {
        let err = "token-bucket".parse::<Algorithm>().unwrap_err();
        let text = err.to_string();
        for a in Algorithm::ALL {
            assert!(text.contains(a.name()), "{text}");
        }
        assert_eq!("gcra".parse::<Algorithm>(), Ok(Algorithm::Gcra));
    }

    #[test]
    fn soft_mode_raises_the_effective_capacity_only() {
        let q = Quota::fixed_window(10, MIN)
            .mode(Mode::Soft { percent: 20 })
            .build()
            .unwrap();
        assert_eq!(q.limit(), 10);
        assert_eq!(q.params.capacity, 12);
        assert_eq!(q.params.reported_capacity, 10);
    }

    #[test]
    fn default_names_are_readable() {
        let q = Quota::gcra(5, Duration::from_millis(1500)).build().unwrap();
        assert_eq!(q.name(), "5-per-1500ms");
        let q = Quota::min_interval(Duration::from_secs(3)).build().unwrap();
        assert_eq!(q.name(), "min-interval-3s");
    }

    #[test]
    fn large_daily_quotas_are_exact() {
        // A million a day reduces to 86 400 units per token, refilled one per µs.
        let q = Quota::token_bucket(1_000_000, Duration::from_secs(86_400))
            .build()
            .unwrap();
        assert_eq!((q.params.unit, q.params.refill), (86_400, 1));
    }
}
