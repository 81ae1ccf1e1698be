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
}

/// A duration in whole microseconds, saturating at `u64::MAX`.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of the current time.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// The current time, given `system`: the system clock's reading at the
    /// start of this request, which the limiter takes anyway. The system
    /// clock returns it rather than read itself again; any other clock
    /// (the default) reads its own time.
    #[inline]
    fn now_given(&self, system: Timestamp) -> Timestamp {
        let _ = system;
        self.now()
    }
}

/// The operating system's wall clock.
///
/// Wall time (not a monotonic clock) because fixed windows are aligned to the
/// Unix epoch and because state shared through Redis must mean the same on
/// every server. A clock that steps backwards is tolerated: the windows and
/// the log treat a time earlier than their state as "no time has passed";
/// the buckets and GCRA, whose state is when they are full again, find
/// themselves that much further from full (spends recorded later still
/// count).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        // The wall clock costs a system-call path per read (over 100
        // instructions, most of a hot-key decision). The CPU's counter,
        // through quanta, costs a few, and is mapped to epoch time by an
        // anchor taken once and again every few seconds, so it stays within
        // the wall clock's own NTP slewing of it.
        Anchor::now()
    }

    #[inline]
    fn now_given(&self, system: Timestamp) -> Timestamp {
        system
    }
}

/// The CPU counter mapped to epoch time: `now = offset + counter since
/// origin`. One atomic offset, so no reader can pair an old reading with a
/// new one.
struct Anchor {
    clock: quanta::Clock,
    origin: u64,
    /// Microseconds per tick of the counter, times 2^64: quanta's own
    /// scale, read once, so a reading maps to microseconds with one
    /// multiplication.
    scale: u64,
    /// Epoch microseconds at `origin`, as of the last wall-clock reading.
    offset: AtomicU64,
    /// Microseconds since `origin` at which to read the wall clock again.
    next: AtomicU64,
}

/// How long an offset serves before the wall clock is read again.
const REANCHOR_MICROS: u64 = 4_000_000;

fn wall_micros() -> u64 {
    // A clock before 1970 is a misconfigured host; treat it as the epoch
    // rather than failing a request over it.
    micros(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO),
    )
}

impl Anchor {
    fn get() -> &'static Anchor {
        static ANCHOR: std::sync::OnceLock<Anchor> = std::sync::OnceLock::new();
        ANCHOR.get_or_init(|| {
            let clock = quanta::Clock::new();
            // quanta maps ticks to nanoseconds linearly; its nanoseconds
            // for 2^32 ticks give the scale to within a part in 10^9, far
            // below a microsecond over a re-anchoring interval. (A counter
            // slower than a tick a microsecond, which quanta never uses,
            // would saturate.)
            let nanos_per_2_32 = u128::from(clock.delta_as_nanos(0, 1 << 32));
            let scale = u64::try_from((nanos_per_2_32 << 32) / 1_000).unwrap_or(u64::MAX);
            Anchor {
                origin: clock.raw(),
                scale,
                offset: AtomicU64::new(wall_micros()),
                next: AtomicU64::new(REANCHOR_MICROS),
                clock,
            }
        })
    }

    fn now() -> Timestamp {
        Anchor::at(Anchor::get().clock.raw())
    }

    /// The epoch time of a reading of the CPU counter.
    #[inline]
    fn at(raw: u64) -> Timestamp {
        let a = Anchor::get();
        // A reading before the origin (another core's counter a hair
        // behind) counts as the origin.
        let ticks = u128::from(raw.saturating_sub(a.origin));
        let micros = ((ticks * u128::from(a.scale)) >> 64) as u64;
        if micros >= a.next.load(Ordering::Relaxed) {
            a.next.store(micros + REANCHOR_MICROS, Ordering::Relaxed);
            // Follow the wall clock forward (NTP slewing, the counter's
            // drift), never back: time read here does not step back when the
            // wall clock does, and racing re-anchors keep the later one.
            let offset = wall_micros().saturating_sub(micros);
            a.offset.fetch_max(offset, Ordering::Relaxed);
        }
        Timestamp(a.offset.load(Ordering::Relaxed) + micros)
    }
}

/// Times a decision for the latency histogram on the CPU counter: two reads
/// of `Instant` cost over 100 instructions, a third of a hot-key decision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch(u64);

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Self {
        Stopwatch(Anchor::get().clock.raw())
    }

    /// The moment it started, as [`SystemClock`] tells it: so that a check
    /// timed by the limiter reads the counter once for both.
    #[inline]
    pub(crate) fn started_at(self) -> Timestamp {
        Anchor::at(self.0)
    }

    pub(crate) fn elapsed(self) -> Duration {
        let clock = &Anchor::get().clock;
        Duration::from_nanos(clock.delta_as_nanos(self.0, clock.raw()))
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

    fn now_given(&self, system: Timestamp) -> Timestamp {
        (**self).now_given(system)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_keeps_to_the_wall_clock_and_never_steps_back() {
        // Bracketed by two wall-clock reads: the first read calibrates the
        // counter, which takes longer on a busy machine.
        let within = |read: &dyn Fn() -> u64| {
            let before = wall_micros();
            let now = read();
            let after = wall_micros();
            assert!(
                before.saturating_sub(5_000) <= now && now <= after + 5_000,
                "{now} read between {before} and {after} on the wall clock"
            );
            now
        };
        let now = within(&|| SystemClock.now().as_micros());
        let mut last = now;
        for _ in 0..10_000 {
            let t = SystemClock.now().as_micros();
            assert!(t >= last, "stepped back from {last} to {t}");
            last = t;
        }
        std::thread::sleep(Duration::from_millis(50));
        let slept = SystemClock.now().as_micros() - now;
        assert!(
            (50_000..1_000_000).contains(&slept),
            "50 ms read as {slept} us"
        );
        within(&|| SystemClock.now().as_micros());
    }
}
