//! Where the time comes from.
//!
//! The algorithms never read a clock: the backend reads one and hands the
//! time in. [`SystemClock`] is the default; [`ManualClock`] lets tests move
//! time by hand so every decision is deterministic.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time, in whole microseconds since the Unix epoch.
///
/// Microseconds are what Redis `TIME` reports, and a microsecond timestamp
/// stays below 2^53, so Lua scripts (whose numbers are doubles) can do the
/// same integer arithmetic as the in-memory backend, exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// A timestamp `secs` seconds after the Unix epoch.
    pub const fn from_secs(secs: u64) -> Self {
        Timestamp(secs * 1_000_000)
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// This timestamp moved `by` later (saturating).
    pub fn after(self, by: Duration) -> Self {
        Timestamp(self.0.saturating_add(micros(by)))
    }
}

/// A duration in whole microseconds, saturating at `u64::MAX`.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
///
/// Wall time (not a monotonic clock) because fixed windows are aligned to the
/// Unix epoch and because state shared through Redis must mean the same on
/// every server. A clock that steps backwards is tolerated: the algorithms
/// treat a time earlier than their state as "no time has passed".
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        // A clock before 1970 is a misconfigured host; treat it as the epoch
        // rather than failing a request over it.
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(micros(since))
    }
}

/// A clock that only moves when told to, for tests.
///
/// Clones share one time, so a test can keep a handle and advance the clock a
/// backend is using.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, ManualClock, Timestamp};
///
/// let clock = ManualClock::new(Timestamp::from_secs(60));
/// clock.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now(), Timestamp::from_micros(61_500_000));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start.0)))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(micros(by), Ordering::SeqCst);
    }

    /// Sets the clock to `to`, which may be earlier than now.
    pub fn set(&self, to: Timestamp) {
        self.0.store(to.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}
