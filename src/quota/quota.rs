//! A validated quota and what it tells.

use std::sync::Arc;
use std::time::Duration;

use super::algorithm::{Algorithm, Mode};
use super::params::Params;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    pub(super) name: Arc<str>,
    pub(super) algorithm: Algorithm,
    pub(super) limit: u64,
    pub(super) period: Duration,
    pub(super) burst: u64,
    pub(super) mode: Mode,
    pub(super) count_rejected: bool,
    pub(crate) params: Params,
}

impl Quota {
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
