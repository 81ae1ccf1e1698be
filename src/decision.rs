//! What a limiter answers.

use std::time::Duration;

use smallvec::SmallVec;

/// One quota's answer to one request.
///
/// Kept as the algorithm's integers (microseconds for times); the durations
/// are made when read, so a caller that only asks
/// [`Decision::allowed`] pays for none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaDecision {
    limit: u64,
    remaining: u64,
    reset: u64,
    replenish: u64,
    /// Allowed: the delay before its turn (leaky bucket); refused: the
    /// retry-after. One field, since a decision has only one of them.
    wait: u64,
    allowed: bool,
    shadow: bool,
}

impl QuotaDecision {
    /// A quota's answer from its numbers, times in microseconds.
    #[allow(clippy::too_many_arguments)] // one per field, all named at the one caller
    pub(crate) fn new(
        allowed: bool,
        shadow: bool,
        limit: u64,
        remaining: u64,
        reset: u64,
        replenish: u64,
        retry_after: u64,
        delay: u64,
    ) -> Self {
        QuotaDecision {
            limit,
            remaining,
            reset,
            replenish,
            wait: if allowed { delay } else { retry_after },
            allowed,
            shadow,
        }
    }

    /// Whether this quota admits the request (for a shadow quota: whether it
    /// would, if it were enforced).
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// The quota's capacity as clients are told it (the burst for the bucket
    /// algorithms, the limit for the windows; the nominal one in soft mode).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units left after this request (before it, when nothing was spent).
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the quota is fully restored, with no further traffic.
    pub fn reset(&self) -> Duration {
        Duration::from_micros(self.reset)
    }

    /// Time until more quota is available than [`remaining`](Self::remaining):
    /// the effective window of draft-11's `t`, within which the client can
    /// use no more than `remaining` units. Per algorithm: GCRA, leaky and
    /// token bucket, until the next unit returns; fixed window, until the
    /// window ends; sliding window, until the weighted estimate next falls;
    /// sliding log, until the oldest live entry expires. (The README has the
    /// table, with what `r` means for each.)
    pub fn replenish(&self) -> Duration {
        Duration::from_micros(self.replenish)
    }

    /// When refused: time until the same request would pass.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then(|| Duration::from_micros(self.wait))
    }

    /// Leaky bucket: how long the admitted request waits for its turn.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_micros())
    }

    fn delay_micros(&self) -> u64 {
        if self.allowed { self.wait } else { 0 }
    }

    /// Whether the quota is in shadow mode: it reports, but never refuses.
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// The answer as it reads `elapsed` microseconds later (a cached
    /// refusal): waits and resets shortened, and a quota whose wait is over
    /// admits.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // the denial cache ages refusals
    pub(crate) fn aged(&self, elapsed: u64) -> Self {
        let retry_after = if self.allowed {
            0
        } else {
            self.wait.saturating_sub(elapsed)
        };
        QuotaDecision {
            reset: self.reset.saturating_sub(elapsed),
            replenish: self.replenish.saturating_sub(elapsed),
            allowed: self.allowed || retry_after == 0,
            wait: retry_after,
            ..*self
        }
    }
}

/// The answer to one check: whether the request may proceed, and what each
/// quota reported, in the order of the limiter's quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    /// Whether any quota refused, shadow ones included: kept, as the
    /// metrics ask it of every decision.
    exceeded: bool,
    quotas: SmallVec<[QuotaDecision; 1]>,
}

impl Decision {
    pub(crate) fn new(allowed: bool, quotas: SmallVec<[QuotaDecision; 1]>) -> Self {
        let exceeded = quotas.iter().any(|q| !q.allowed);
        Decision {
            allowed,
            exceeded,
            quotas,
        }
    }

    /// The decision of a set of one quota.
    #[inline]
    pub(crate) fn one(allowed: bool, quota: QuotaDecision) -> Self {
        let mut quotas = SmallVec::new();
        quotas.push(quota);
        Decision {
            allowed,
            exceeded: !quota.allowed,
            quotas,
        }
    }

    /// Whether the request may proceed. Shadow quotas never make this false.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Whether any quota refused the request or would have (in shadow mode):
    /// what enforcing every quota would have done, inverted.
    pub fn exceeded(&self) -> bool {
        self.exceeded
    }

    /// Each quota's answer, in the order the quotas were given.
    pub fn quotas(&self) -> &[QuotaDecision] {
        &self.quotas
    }

    /// The indices of the enforced quotas that refused.
    pub fn violated(&self) -> impl Iterator<Item = usize> + '_ {
        self.quotas
            .iter()
            .enumerate()
            .filter(|(_, q)| !q.allowed && !q.shadow)
            .map(|(i, _)| i)
    }

    /// When refused: the time until the same request would pass, the longest
    /// wait among the enforced quotas that refused it. (A shadow quota's wait
    /// is in its own [`QuotaDecision`].)
    pub fn retry_after(&self) -> Option<Duration> {
        if self.allowed {
            return None;
        }
        self.quotas
            .iter()
            .filter(|q| !q.allowed && !q.shadow)
            .map(|q| q.wait)
            .max()
            .map(Duration::from_micros)
    }

    /// How long an admitted request must wait for its turn (leaky bucket).
    pub fn delay(&self) -> Duration {
        self.quotas
            .iter()
            .map(QuotaDecision::delay_micros)
            .max()
            .map_or(Duration::ZERO, Duration::from_micros)
    }

    /// The quota closest to refusing: least remaining, then longest reset.
    /// Its numbers are the ones to report when only one set fits.
    pub fn binding(&self) -> Option<&QuotaDecision> {
        self.quotas
            .iter()
            .min_by(|a, b| a.remaining.cmp(&b.remaining).then(b.reset.cmp(&a.reset)))
    }

    /// Units left on the binding quota.
    pub fn remaining(&self) -> u64 {
        self.binding().map_or(0, |q| q.remaining)
    }
}
