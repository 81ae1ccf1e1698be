//! The integers the algorithms compute with.

use std::num::NonZeroU64;

/// The largest integer a Lua number (a double) holds exactly. Every value an
/// algorithm stores or compares stays below it, so the Redis scripts compute
/// exactly what the in-memory backend computes.
pub(crate) const EXACT_MAX: u64 = 1 << 53;

/// The integers the algorithms compute with, derived once when the quota is
/// built (and sent as-is to the Redis scripts). Soft mode is folded in here:
/// the algorithms only ever see the effective capacity. Elastic mode keeps
/// the state for its ceiling too, and asks for the margin on top of the cost
/// when there is no room (see `Quota::check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Params {
    /// Fixed window: windows that are a calendar's periods rather than
    /// multiples of `period` (then the longest such period) since the
    /// epoch.
    pub calendar: Option<&'static crate::calendar::Windows>,
    /// The period in microseconds, never 0: a division by it needs no
    /// check.
    pub period: NonZeroU64,
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
    /// Elastic mode: units of `capacity` usable only while the server has
    /// room (0 otherwise). Without room a request must leave this many
    /// units unspent.
    pub elastic_margin: u64,
}
