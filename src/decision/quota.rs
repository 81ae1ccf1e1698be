//! One quota's answer: the algorithm's integers, made durations when read.

use std::fmt;
use std::time::Duration;

use crate::algorithm::{gcra, sliding_window, token_bucket};
use crate::quota::Params;

/// One quota's answer to one request.
///
/// Kept as the algorithm's integers (microseconds for times); the durations
/// are made when read, and for an arrival-time quota decided alone (GCRA,
/// the leaky bucket, a token bucket of whole microseconds per token) so are
/// `remaining` and `replenish`, so a caller that only asks
/// [`Decision::allowed`](super::Decision::allowed) pays for none of them.
#[derive(Clone, Copy)]
pub struct QuotaDecision {
    limit: u64,
    reset: u64,
    /// Allowed: the delay before its turn (leaky bucket); refused: the
    /// retry-after. One field, since a decision has only one of them.
    pub(super) wait: u64,
    /// What `remaining` and `replenish` are made of (see [`Left`]).
    left: (u64, u64),
    pub(super) allowed: bool,
    pub(super) shadow: bool,
    form: Left,
    /// Counted form: whether the admission took units beyond the reported
    /// limit (a soft quota's margin, an elastic quota's extra), kept
    /// because `remaining` no longer tells (it stops at 0 there). The other
    /// forms derive it when read.
    over: bool,
}

/// How a [`QuotaDecision`] keeps what is left of its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Left {
    /// `left` is `(remaining, replenish)`.
    Counted,
    /// `left` is an arrival time's `(capacity, interval)`: remaining and
    /// replenish follow from them and `reset`, as GCRA computes them.
    /// (The capacity rather than the tolerance: soft mode's margin is then
    /// a subtraction, not a division.)
    Arrival,
    /// A sliding window that admits: `left` is its counters `(prev, curr)`
    /// after the request (or as they were, when another quota of its set
    /// refused it), `wait` how far into their window it came and `reset`
    /// the period; remaining, reset and replenish follow from them
    /// (`sliding_window::Admitted`).
    SlidingWindow,
    /// A token bucket of two numbers that admits, whose capacity is the
    /// one reported: `left` is what it lacks of full after the request and
    /// its `unit`, `reset` its `refill`; remaining, reset and replenish
    /// follow from them (`token_bucket::left`), each with a division.
    Bucket,
}

impl QuotaDecision {
    /// A quota's answer from its numbers, times in microseconds.
    #[inline]
    #[allow(clippy::too_many_arguments)] // one per field
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
            reset,
            wait: if allowed { delay } else { retry_after },
            left: (remaining, replenish),
            allowed,
            shadow,
            form: Left::Counted,
            over: false,
        }
    }

    /// The same answer, saying whether it took units beyond the reported
    /// limit (see [`over_limit`](Self::over_limit)).
    #[inline]
    pub(crate) fn over(self, over: bool) -> Self {
        QuotaDecision { over, ..self }
    }

    /// The answer of an arrival-time quota (GCRA, leaky bucket, a token
    /// bucket of whole microseconds per token) whose
    /// remaining and replenish are computed only when read, from its
    /// effective `capacity` (soft mode's margin included) and `interval`;
    /// `limit` is the capacity reported (soft mode's margin off).
    #[inline]
    #[allow(clippy::too_many_arguments)] // as `new`, with the two numbers `left` keeps
    pub(crate) fn arrival(
        allowed: bool,
        shadow: bool,
        limit: u64,
        reset: u64,
        retry_after: u64,
        delay: u64,
        capacity: u64,
        interval: u64,
    ) -> Self {
        QuotaDecision {
            left: (capacity, interval),
            form: Left::Arrival,
            ..QuotaDecision::new(allowed, shadow, limit, 0, reset, 0, retry_after, delay)
        }
    }

    /// The answer of a sliding window of params `p` that admits, whose
    /// numbers are computed only when read from the counters `admitted`
    /// keeps; its limit is the capacity reported (soft mode's margin off).
    #[inline]
    pub(crate) fn sliding_window(p: &Params, admitted: sliding_window::Admitted) -> Self {
        let c = admitted.counters;
        QuotaDecision {
            limit: p.reported_capacity,
            reset: p.period.get(),
            wait: admitted.elapsed,
            left: (c.prev, c.curr),
            allowed: true,
            shadow: p.shadow,
            form: Left::SlidingWindow,
            over: false,
        }
    }

    /// The answer of a token bucket of params `p` that admits, lacking
    /// `after` units of full after the request, whose numbers are computed
    /// only when read. Only for a quota whose capacity is the one reported
    /// (no soft mode's margin): its limit is then the capacity, and it
    /// never takes units beyond it.
    #[inline]
    pub(crate) fn bucket(p: &Params, after: u64) -> Self {
        debug_assert_eq!(p.capacity, p.reported_capacity);
        QuotaDecision {
            limit: p.capacity,
            reset: p.refill,
            wait: 0,
            left: (after, p.unit),
            allowed: true,
            shadow: p.shadow,
            form: Left::Bucket,
            over: false,
        }
    }

    /// A token bucket's `(remaining, replenish)` (see [`Left::Bucket`]). Out
    /// of line, as its reset is: inlined into the readers of every form,
    /// they cost a GCRA quota's headers ~20 instructions.
    #[inline(never)]
    fn bucket_left(&self) -> (u64, u64) {
        let (after, unit) = self.left;
        token_bucket::left(after, self.limit, unit, self.reset)
    }

    /// A token bucket's reset (see [`Left::Bucket`]).
    #[inline(never)]
    fn bucket_reset(&self) -> u64 {
        token_bucket::reset(self.left.0, self.reset)
    }

    /// What a sliding window's form keeps (see [`Left::SlidingWindow`]).
    fn sliding_window_admitted(&self) -> sliding_window::Admitted {
        let (prev, curr) = self.left;
        sliding_window::Admitted {
            // Its numbers are offsets into the window: its start is not read.
            counters: sliding_window::Counters {
                start: 0,
                prev,
                curr,
            },
            elapsed: self.wait,
        }
    }

    /// `(remaining, replenish)` in microseconds, for a caller that reads
    /// both (each may take a division). For an arrival time, as
    /// `gcra::schedule` reports them, with soft mode's margin taken off the
    /// remaining units.
    pub(crate) fn left(&self) -> (u64, u64) {
        match self.form {
            Left::Counted => self.left,
            Left::Arrival => {
                let (capacity, interval) = self.left;
                let tolerance = capacity.saturating_mul(interval);
                let (effective, replenish) = gcra::left(self.reset, tolerance, interval.max(1));
                let soft_margin = capacity.saturating_sub(self.limit);
                (effective.saturating_sub(soft_margin), replenish)
            }
            Left::SlidingWindow => self.sliding_window_admitted().left(self.limit, self.reset),
            Left::Bucket => self.bucket_left(),
        }
    }

    /// Whether this admission took units beyond the limit reported (the
    /// margin of a quota in [`Mode::Soft`](crate::Mode::Soft), the extra of
    /// one in [`Mode::Elastic`](crate::Mode::Elastic)): fewer units than
    /// that margin are left. Only read for such quotas: for an arrival
    /// time it takes a division.
    pub(crate) fn over_limit(&self) -> bool {
        match self.form {
            Left::Counted => self.over,
            Left::Arrival => {
                let (capacity, interval) = self.left;
                let tolerance = capacity.saturating_mul(interval);
                let (effective, _) = gcra::left(self.reset, tolerance, interval.max(1));
                effective < capacity.saturating_sub(self.limit)
            }
            Left::SlidingWindow => self.sliding_window_admitted().used(self.reset) > self.limit,
            // Its capacity is the one reported.
            Left::Bucket => false,
        }
    }

    /// Microseconds until the quota is fully restored.
    pub(crate) fn reset_micros(&self) -> u64 {
        match self.form {
            Left::SlidingWindow => self.sliding_window_admitted().reset(self.reset),
            Left::Bucket => self.bucket_reset(),
            Left::Counted | Left::Arrival => self.reset,
        }
    }

    /// The retry-after when refused, the delay when admitted.
    fn wait_micros(&self) -> u64 {
        match self.form {
            // `wait` keeps how far into its window it came; it never delays.
            Left::SlidingWindow | Left::Bucket => 0,
            Left::Counted | Left::Arrival => self.wait,
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
        self.left().0
    }

    /// Time until the quota is fully restored, with no further traffic.
    pub fn reset(&self) -> Duration {
        Duration::from_micros(self.reset_micros())
    }

    /// Time until more quota is available than [`remaining`](Self::remaining):
    /// the effective window of draft-11's `t`, within which the client can
    /// use no more than `remaining` units. Per algorithm: GCRA, leaky and
    /// token bucket, until the next unit returns; fixed window, until the
    /// window ends; sliding window, until the weighted estimate next falls;
    /// sliding log, until the oldest live entry expires. (The
    /// [headers chapter](crate::guide::headers) has the table, with what `r`
    /// means for each.)
    pub fn replenish(&self) -> Duration {
        Duration::from_micros(self.left().1)
    }

    /// When refused: time until the same request would pass.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then(|| Duration::from_micros(self.wait_micros()))
    }

    /// Leaky bucket: how long the admitted request waits for its turn.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_micros())
    }

    pub(super) fn delay_micros(&self) -> u64 {
        if self.allowed { self.wait_micros() } else { 0 }
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
            self.wait_micros().saturating_sub(elapsed)
        };
        let (remaining, replenish) = self.left();
        QuotaDecision {
            reset: self.reset_micros().saturating_sub(elapsed),
            left: (remaining, replenish.saturating_sub(elapsed)),
            form: Left::Counted,
            allowed: self.allowed || retry_after == 0,
            wait: retry_after,
            over: self.over_limit(),
            ..*self
        }
    }

    /// What a caller can read of it, for equality and `Debug`: the same
    /// answer compares equal however it is kept.
    fn seen(&self) -> (bool, bool, u64, u64, u64, u64, u64) {
        let (remaining, replenish) = self.left();
        (
            self.allowed,
            self.shadow,
            self.limit,
            remaining,
            self.reset_micros(),
            replenish,
            self.wait_micros(),
        )
    }
}

impl PartialEq for QuotaDecision {
    fn eq(&self, other: &Self) -> bool {
        self.seen() == other.seen()
    }
}

impl Eq for QuotaDecision {}

impl fmt::Debug for QuotaDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (allowed, shadow, limit, remaining, reset, replenish, wait) = self.seen();
        f.debug_struct("QuotaDecision")
            .field("limit", &limit)
            .field("remaining", &remaining)
            .field("reset", &reset)
            .field("replenish", &replenish)
            .field("wait", &wait)
            .field("allowed", &allowed)
            .field("shadow", &shadow)
            .finish()
    }
}
