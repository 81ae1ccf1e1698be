//! Why a quota could not be built, or an algorithm's name not read.

use std::fmt;
use std::time::Duration;

use crate::algorithm::Algorithm;

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
    /// A calendar was given to an algorithm other than the fixed window.
    CalendarNotApplicable(Algorithm),
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
                "{limit} per {period:?} is more than one per microsecond, the most GCRA and the leaky bucket can space (1 000 000 a second); the token bucket and the windows count exactly up to 2^53 per period, so use one of them (a token bucket with the same burst enforces the same rate)"
            ),
            QuotaError::CalendarNotApplicable(a) => {
                write!(f, "calendar periods apply to fixed_window only, not {a}")
            }
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

impl std::str::FromStr for Algorithm {
    type Err = QuotaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| QuotaError::UnknownAlgorithm(s.to_owned()))
    }
}
