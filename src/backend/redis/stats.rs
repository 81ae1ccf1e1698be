//! What a Redis backend did: counters kept as it works, read as [`RedisStats`].

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::{Counter, Gauge, Unit, counter, describe_counter, describe_gauge, gauge};

use super::breaker::Breaker;
use crate::backend::BackendErrorKind;
use crate::metrics::{REDIS_CACHE_HITS, REDIS_CALLS, REDIS_CIRCUIT_OPEN, REDIS_FAILURES};

/// Counters of what a [`RedisBackend`](super::RedisBackend) did since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Calls made to Redis (each one round trip, or two when the script had
    /// to be sent again).
    pub calls: u64,
    /// Calls that failed, timeouts included.
    pub failures: u64,
    /// Calls that failed by timing out.
    pub timeouts: u64,
    /// Calls that Redis refused as misconfigured (see
    /// [`BackendErrorKind::Misconfigured`](crate::backend::BackendErrorKind::Misconfigured)).
    pub misconfigured: u64,
    /// Checks refused at once because the circuit breaker was open.
    pub short_circuits: u64,
    /// Checks answered from the denial cache.
    pub cache_hits: u64,
    /// Checks admitted from a lease held here, without calling Redis.
    pub lease_hits: u64,
    /// Leases taken: calls that took more units than their request's cost.
    pub leases: u64,
    /// Checks decided by the fallback backend.
    pub fallbacks: u64,
    /// Times Redis did not know the script (`NOSCRIPT`) and was sent it.
    pub script_loads: u64,
    /// Failures in a row now (0 while Redis answers).
    pub consecutive_failures: u32,
    /// Whether the circuit breaker is open now.
    pub circuit_open: bool,
}

#[derive(Default)]
/// What the backend counts as it works.
pub(super) struct Counters {
    pub(super) calls: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) misconfigured: AtomicU64,
    pub(super) short_circuits: AtomicU64,
    pub(super) cache_hits: AtomicU64,
    pub(super) lease_hits: AtomicU64,
    pub(super) leases: AtomicU64,
    pub(super) fallbacks: AtomicU64,
    pub(super) script_loads: AtomicU64,
}

/// Adds one to `counter`; returns the new count.
pub(super) fn bump(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed) + 1
}

impl Counters {
    /// The counters now, with the state of `breaker`.
    pub(super) fn stats(&self, breaker: &Breaker) -> RedisStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            calls: get(&self.calls),
            failures: get(&self.failures),
            timeouts: get(&self.timeouts),
            misconfigured: get(&self.misconfigured),
            short_circuits: get(&self.short_circuits),
            cache_hits: get(&self.cache_hits),
            lease_hits: get(&self.lease_hits),
            leases: get(&self.leases),
            fallbacks: get(&self.fallbacks),
            script_loads: get(&self.script_loads),
            consecutive_failures: breaker.consecutive_failures(),
            circuit_open: breaker.is_open(),
        }
    }
}

/// The Redis backend's calls, failures, denial-cache hits and breaker state.
#[derive(Debug, Clone)]
pub(crate) struct RedisMetrics {
    calls: Counter,
    /// By kind: timeout, unavailable, protocol, misconfigured.
    failures: [Counter; 5],
    cache_hits: Counter,
    circuit_open: Gauge,
}

/// The kinds of failure, in the order of `RedisMetrics::failures`.
const KINDS: [BackendErrorKind; 5] = [
    BackendErrorKind::Timeout,
    BackendErrorKind::Unavailable,
    BackendErrorKind::Protocol,
    BackendErrorKind::Misconfigured,
    BackendErrorKind::Unsupported,
];

impl RedisMetrics {
    pub(crate) fn new() -> Self {
        describe_counter!(REDIS_CALLS, Unit::Count, "Calls made to Redis.");
        describe_counter!(
            REDIS_FAILURES,
            Unit::Count,
            "Redis calls that failed, by kind: timeout, unavailable (down, unreachable, busy), protocol (a reply that makes no sense), misconfigured (Redis refuses the scripts: ACL, renamed commands, full under noeviction)."
        );
        describe_counter!(
            REDIS_CACHE_HITS,
            Unit::Count,
            "Checks answered from the denial cache without calling Redis."
        );
        describe_gauge!(
            REDIS_CIRCUIT_OPEN,
            "1 while the Redis circuit breaker is open (Redis not called), else 0."
        );
        let circuit_open = gauge!(REDIS_CIRCUIT_OPEN);
        circuit_open.set(0.0);
        RedisMetrics {
            calls: counter!(REDIS_CALLS),
            failures: KINDS.map(|k| counter!(REDIS_FAILURES, "kind" => k.name())),
            cache_hits: counter!(REDIS_CACHE_HITS),
            circuit_open,
        }
    }

    pub(crate) fn call(&self) {
        self.calls.increment(1);
    }

    pub(crate) fn failure(&self, kind: BackendErrorKind) {
        let i = match kind {
            BackendErrorKind::Timeout => 0,
            BackendErrorKind::Unavailable => 1,
            BackendErrorKind::Protocol => 2,
            BackendErrorKind::Misconfigured => 3,
            BackendErrorKind::Unsupported => 4,
        };
        self.failures[i].increment(1);
    }

    pub(crate) fn cache_hit(&self) {
        self.cache_hits.increment(1);
    }

    /// The breaker opened (`true`) or closed.
    pub(crate) fn circuit(&self, open: bool) {
        self.circuit_open.set(f64::from(u8::from(open)));
    }
}
