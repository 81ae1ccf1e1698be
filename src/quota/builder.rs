//! Building a [`Quota`]: the constructors, and the checks that refuse an
//! invalid one.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use super::error::QuotaError;
use super::quota::{Counts, Path, Quota};
use crate::algorithm::{Algorithm, Mode};
use crate::algorithm::{EXACT_MAX, Params};
use crate::calendar::Calendar;
use crate::clock::micros;

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

    /// A fixed window of `limit` per calendar period (a day, week, month or
    /// year in a time zone): see [`QuotaBuilder::calendar`].
    ///
    /// ```
    /// use tollgate::calendar::{Calendar, CalendarPeriod};
    /// use tollgate::Quota;
    ///
    /// let billing = Calendar::new(CalendarPeriod::Month { starts_on: 15 }, "Asia/Seoul")?;
    /// let quota = Quota::per_calendar(10_000, billing).build()?;
    /// assert_eq!(quota.name(), "10000-per-month");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn per_calendar(limit: u64, calendar: Calendar) -> QuotaBuilder {
        QuotaBuilder::new(Algorithm::FixedWindow, limit, calendar.longest()).calendar(calendar)
    }

    /// At least `interval` between two admitted actions: GCRA with one unit
    /// per interval and no burst.
    pub fn min_interval(interval: Duration) -> QuotaBuilder {
        let mut b = QuotaBuilder::new(Algorithm::Gcra, 1, interval).burst(1);
        b.name = Some(format!("min-interval-{}", period_label(interval)).into());
        b
    }
}

/// The longest quota name, in bytes.
const MAX_NAME_LEN: usize = 64;

/// Whether a name can be sent as an RFC 9651 string (sf-string): printable
/// ASCII, `"` and `\` escaped when written.
pub(super) fn valid_name(name: &str) -> bool {
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
    /// Whether `name` was given by the caller rather than made up (as
    /// `min_interval` does): a quota alone in a named set takes the set's
    /// name unless its own was given.
    named: bool,
    mode: Mode,
    count_rejected: bool,
    counts: Counts,
    calendar: Option<Calendar>,
}

impl QuotaBuilder {
    fn new(algorithm: Algorithm, limit: u64, period: Duration) -> Self {
        QuotaBuilder {
            algorithm,
            limit,
            period,
            burst: None,
            name: None,
            named: false,
            mode: Mode::Enforce,
            count_rejected: false,
            counts: Counts::Cost,
            calendar: None,
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
        self.named = true;
        self
    }

    /// Enforce (default), shadow, soft, or elastic.
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

    /// What the quota counts: the request's cost (the default) or
    /// requests, one each whatever the cost ([`Counts`]), so that one set
    /// holds a request quota and a token quota.
    pub fn counts(mut self, counts: Counts) -> Self {
        self.counts = counts;
        self
    }

    /// Fixed window only: windows that are `calendar`'s periods (a local
    /// day, a week from a weekday, a month from a day of the month, a year)
    /// rather than multiples of the period since the epoch. The period
    /// given to the constructor is replaced by the longest such period.
    /// [`build`](Self::build) refuses it for the other algorithms
    /// ([`QuotaError::CalendarNotApplicable`]).
    pub fn calendar(mut self, calendar: Calendar) -> Self {
        self.period = calendar.longest();
        self.calendar = Some(calendar);
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
        let Some(nonzero_period) = NonZeroU64::new(micros(self.period)) else {
            return Err(QuotaError::ZeroPeriod);
        };
        let period = nonzero_period.get();
        if self.limit == 0 {
            return Err(QuotaError::ZeroLimit);
        }
        if self.burst == Some(0) {
            return Err(QuotaError::BurstBelowOne);
        }
        if self.burst.is_some() && !a.has_burst() {
            return Err(QuotaError::BurstNotApplicable(a));
        }
        if self.calendar.is_some() && a != Algorithm::FixedWindow {
            return Err(QuotaError::CalendarNotApplicable(a));
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
        let elastic_margin = match self.mode {
            Mode::Elastic { percent } => (u128::from(capacity) * u128::from(percent) / 100)
                .try_into()
                .unwrap_or(u64::MAX),
            _ => 0,
        };
        let capacity = capacity.saturating_add(elastic_margin);
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
        let name = self.name.unwrap_or_else(|| match &self.calendar {
            Some(c) => format!("{}-per-{}", self.limit, c.period().unit()).into(),
            None => format!("{}-per-{}", self.limit, period_label(self.period)).into(),
        });
        let params = Params {
            calendar: self.calendar.as_ref().map(crate::calendar::Windows::of),
            period: nonzero_period,
            limit,
            capacity,
            reported_capacity: burst,
            interval,
            unit,
            refill,
            count_rejected: self.count_rejected,
            shadow: self.mode == Mode::Shadow,
            elastic_margin,
        };
        Ok(Quota {
            name,
            named: self.named,
            path: Path::of(a, &params),
            algorithm: a,
            limit: self.limit,
            period: self.period,
            burst,
            mode: self.mode,
            count_rejected: self.count_rejected,
            counts: self.counts,
            params,
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
