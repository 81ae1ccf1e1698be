//! The circuit breaker: while Redis is failing, answer at once instead of
//! making every request wait out the timeout.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::clock::micros;

/// When the circuit breaker opens, and for how long.
///
/// After `failures` failed calls in a row, the breaker opens: checks fail at
/// once with [`BackendErrorKind::Unavailable`](crate::backend::BackendErrorKind::Unavailable)
/// (or go to the fallback) without calling Redis. After `open_for`, one
/// check is let through as a probe: if it succeeds the breaker closes, if it
/// fails the breaker stays open for another `open_for`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitBreaker {
    /// Consecutive failures that open the breaker (at least 1).
    pub failures: u32,
    /// How long it stays open before a probe.
    pub open_for: Duration,
}

impl Default for CircuitBreaker {
    /// Opens after 5 failures in a row, probes after 1 s.
    fn default() -> Self {
        CircuitBreaker {
            failures: 5,
            open_for: Duration::from_secs(1),
        }
    }
}

/// What the breaker lets a call do.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Call Redis.
    Call,
    /// Call Redis as the one probe of a half-open breaker.
    Probe,
    /// Do not call Redis.
    Refuse,
}

/// The breaker's state, shared by every check of one backend: lock-free, as
/// it is consulted on every call.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: CircuitBreaker,
    base: Instant,
    consecutive_failures: AtomicU32,
    /// Microseconds since `base` until which the breaker is open; 0: closed.
    open_until: AtomicU64,
    probing: AtomicBool,
}

/// What happened when a state changed, for the log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    Opened,
    Reopened,
    Closed,
}

impl Breaker {
    pub(crate) fn new(config: CircuitBreaker) -> Self {
        Breaker {
            config: CircuitBreaker {
                failures: config.failures.max(1),
                ..config
            },
            base: Instant::now(),
            consecutive_failures: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        // Never 0, which means "closed".
        micros(self.base.elapsed()).max(1)
    }

    fn reopen_at(&self) -> u64 {
        self.now().saturating_add(micros(self.config.open_for))
    }

    pub(crate) fn permit(&self) -> Permit {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Permit::Call;
        }
        if self.now() < until {
            return Permit::Refuse;
        }
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Permit::Probe,
            Err(_) => Permit::Refuse,
        }
    }

    /// A call succeeded: Redis answers, so the breaker closes.
    pub(crate) fn success(&self, probe: bool) -> Transition {
        self.consecutive_failures.store(0, Ordering::Release);
        let was_open = self.open_until.swap(0, Ordering::AcqRel) != 0;
        if probe {
            self.probing.store(false, Ordering::Release);
        }
        if was_open {
            Transition::Closed
        } else {
            Transition::None
        }
    }

    /// A call failed (or a probe was abandoned).
    pub(crate) fn failure(&self, probe: bool) -> Transition {
        let failures = self
            .consecutive_failures
            .fetch_add(1, Ordering::AcqRel)
            .saturating_add(1);
        if probe {
            self.open_until.store(self.reopen_at(), Ordering::Release);
            self.probing.store(false, Ordering::Release);
            return Transition::Reopened;
        }
        if failures >= self.config.failures
            && self
                .open_until
                .compare_exchange(0, self.reopen_at(), Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            return Transition::Opened;
        }
        Transition::None
    }

    /// How long the breaker stays open before a probe.
    pub(crate) fn open_for(&self) -> Duration {
        self.config.open_for
    }

    /// Consecutive failures so far.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Acquire)
    }

    /// Whether checks are being refused now (open, or half-open with its
    /// probe under way).
    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }
}

/// Ends a probe that was dropped before it finished (the caller's future was
/// cancelled), so the breaker does not wait forever for its result.
pub(crate) struct ProbeGuard<'a> {
    pub(crate) breaker: &'a Breaker,
    pub(crate) armed: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.breaker.failure(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_recloses_after_a_good_probe() {
        let b = Breaker::new(CircuitBreaker {
            failures: 2,
            open_for: Duration::from_millis(20),
        });
        assert_eq!(b.permit(), Permit::Call);
        assert_eq!(b.failure(false), Transition::None);
        b.success(false);
        assert_eq!(b.failure(false), Transition::None);
        assert_eq!(b.failure(false), Transition::Opened);
        assert_eq!(b.permit(), Permit::Refuse);
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(b.permit(), Permit::Probe);
        // Only one probe at a time.
        assert_eq!(b.permit(), Permit::Refuse);
        assert_eq!(b.failure(true), Transition::Reopened);
        assert_eq!(b.permit(), Permit::Refuse);
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(b.permit(), Permit::Probe);
        assert_eq!(b.success(true), Transition::Closed);
        assert_eq!(b.permit(), Permit::Call);
    }

    #[test]
    fn an_abandoned_probe_reopens_the_breaker() {
        let b = Breaker::new(CircuitBreaker {
            failures: 1,
            open_for: Duration::ZERO,
        });
        b.failure(false);
        assert_eq!(b.permit(), Permit::Probe);
        drop(ProbeGuard {
            breaker: &b,
            armed: true,
        });
        assert_eq!(b.permit(), Permit::Probe);
    }
}
