//! Adapting the rate to what the provider says.

use std::time::Duration;

use super::schedule::{Plan, micros};

/// How a [`Pacer`](super::Pacer) adapts its rate to the provider, within
/// bounds: on a refusal (429) the rate is multiplied by `decrease` (once
/// for all the requests scheduled before the cut, however many of them
/// are refused), then regains `increase` units a second each second, up to
/// the quota's rate (additive increase, multiplicative decrease: AIMD);
/// a rate the provider announces (`RateLimit-Policy: "p";q=100;w=60`) is
/// taken as it is, within the bounds. The rate never goes below
/// `min_rate`, nor above the quota's. On a shared store the cut rate is
/// the fleet's. A cut is forgotten `forget_after` it was made (10 minutes
/// by default), and the quota's rate returns.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
/// use tollgate::outbound::{Adapt, MemoryPace, Pacer};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pacer = Pacer::new(MemoryPace::new(), &Quota::gcra(100, Duration::from_secs(1)).build()?)
///     .adapt(Adapt::aimd(10, Duration::from_secs(1)).decrease(0.5).increase(1.0));
/// # let _ = pacer;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Adapt {
    slowest: u64,
    decrease: f64,
    increase: f64,
    forget: Duration,
    announced: bool,
}

impl Adapt {
    /// AIMD down to `min_limit` units a `per` at the slowest: halves the
    /// rate on a refusal, regains nothing on its own (see
    /// [`increase`](Adapt::increase)), follows announced rates.
    pub fn aimd(min_limit: u64, per: Duration) -> Self {
        Adapt {
            slowest: micros(per).div_ceil(min_limit.max(1)).max(1),
            decrease: 0.5,
            increase: 0.0,
            forget: Duration::from_secs(600),
            announced: true,
        }
    }

    /// The factor a refusal multiplies the rate by (0.5 by default),
    /// between 0.01 and 1 (1: refusals pause, but cut nothing).
    pub fn decrease(mut self, factor: f64) -> Self {
        self.decrease = if factor.is_finite() {
            factor.clamp(0.01, 1.0)
        } else {
            0.5
        };
        self
    }

    /// Units a second the rate regains each second after a cut (0 by
    /// default: it stays cut until forgotten or announced otherwise).
    pub fn increase(mut self, per_second: f64) -> Self {
        self.increase = if per_second.is_finite() {
            per_second.max(0.0)
        } else {
            0.0
        };
        self
    }

    /// How long a cut lasts at most (10 minutes by default).
    pub fn forget_after(mut self, forget: Duration) -> Self {
        self.forget = forget;
        self
    }

    /// Whether a rate announced in `RateLimit-Policy` is followed (yes by
    /// default).
    pub fn follow_announcements(mut self, yes: bool) -> Self {
        self.announced = yes;
        self
    }

    pub(crate) fn follows_announcements(&self) -> bool {
        self.announced
    }

    pub(crate) fn apply(&self, plan: &mut Plan) {
        plan.max_interval = self.slowest.max(plan.interval);
        plan.min_interval = plan.interval;
        plan.decrease = self.decrease;
        plan.increase = self.increase;
        plan.forget = micros(self.forget).max(1);
    }
}
