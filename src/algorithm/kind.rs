//! Which algorithm a quota runs, and what it does with a request it would
//! reject.

use std::fmt;

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
    /// Elastic throttling: while the server has room (the layer's
    /// [load signal](crate::layer::LoadSignal) is under 0.8), admit up to
    /// `percent` per cent over the capacity; without room, or with no signal
    /// to tell, refuse as [`Enforce`](Mode::Enforce) does. What is admitted
    /// over the limit counts: a key that used its extra must wait until its
    /// use is back under the limit before a request passes without room.
    /// The capacity raised is the burst for the bucket algorithms (whose
    /// refill rate stays the limit) and the count per window for the window
    /// algorithms. The reported limit stays the nominal one.
    Elastic {
        /// How far over the capacity, in per cent of it (rounded down).
        percent: u16,
    },
}
