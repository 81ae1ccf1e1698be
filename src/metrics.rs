//! Metrics through the [`metrics`] facade: the application installs a
//! recorder (Prometheus, OpenTelemetry, statsd, ...) and tollgate reports to
//! it. Labels are policy and backend names, never client keys, so the number
//! of series stays bounded by the configuration.
//!
//! Handles are registered when a limiter or backend is built, so the recorder
//! must be installed before; without one every handle is a no-op, and an
//! event costs one branch. One function per event, called from the one place
//! that knows it. The names are all here; the handles of the layer's
//! decisions by reason and of the Redis backend live beside what they count
//! (`layer/reason.rs`, `backend/redis/stats.rs`), so this module imports
//! neither.

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};

use crate::clock::Stopwatch;
use crate::decision::Decision;

/// Decisions by outcome, labelled `policy` and `outcome`.
pub(crate) const DECISIONS: &str = "tollgate_decisions_total";
/// Decision latency in seconds, labelled `backend`.
pub(crate) const DECISION_SECONDS: &str = "tollgate_decision_duration_seconds";
/// States held by in-memory backends.
pub(crate) const MEMORY_STATES: &str = "tollgate_memory_states";
/// Redis round trips attempted.
#[cfg(feature = "redis")]
pub(crate) const REDIS_CALLS: &str = "tollgate_redis_calls_total";
/// Redis calls that failed, labelled `kind` (see `BackendErrorKind::name`).
#[cfg(feature = "redis")]
pub(crate) const REDIS_FAILURES: &str = "tollgate_redis_failures_total";
/// Checks answered from the Redis backend's denial cache.
#[cfg(feature = "redis")]
pub(crate) const REDIS_CACHE_HITS: &str = "tollgate_redis_cache_hits_total";
/// 1 while the Redis circuit breaker is open, else 0.
#[cfg(feature = "redis")]
pub(crate) const REDIS_CIRCUIT_OPEN: &str = "tollgate_redis_circuit_open";

/// One limiter's handles: its decisions by outcome, and its backend's
/// latency.
#[derive(Debug, Clone)]
pub(crate) struct DecisionMetrics {
    allowed: Counter,
    refused: Counter,
    shadow_refused: Counter,
    errored: Counter,
    latency: Histogram,
}

impl DecisionMetrics {
    /// Handles for the quota set `policy` decided by `backend`.
    pub(crate) fn new(policy: &str, backend: &'static str) -> Self {
        describe_counter!(
            DECISIONS,
            Unit::Count,
            "Rate-limit decisions by policy (quota set or rule) and outcome: allowed, refused, shadow_refused (admitted by a shadow quota that would have refused), errored (the limiter could not decide)."
        );
        describe_histogram!(
            DECISION_SECONDS,
            Unit::Seconds,
            "Time to reach a rate-limit decision, by backend."
        );
        let outcome =
            |o: &'static str| counter!(DECISIONS, "policy" => policy.to_owned(), "outcome" => o);
        DecisionMetrics {
            allowed: outcome("allowed"),
            refused: outcome("refused"),
            shadow_refused: outcome("shadow_refused"),
            errored: outcome("errored"),
            latency: histogram!(DECISION_SECONDS, "backend" => backend),
        }
    }

    /// Counts a decision (or a failure to decide) by its outcome, and records
    /// how long it took since `started`.
    pub(crate) fn decided<E>(&self, outcome: &Result<Decision, E>, started: Stopwatch) {
        match outcome {
            Ok(d) => self.decided_ok(d, started),
            Err(_) => self.counted(&self.errored, started),
        }
    }

    /// [`decided`](Self::decided) for a decision.
    #[inline]
    pub(crate) fn decided_ok(&self, decision: &Decision, started: Stopwatch) {
        let counter = if !decision.allowed() {
            &self.refused
        } else if decision.exceeded() {
            &self.shadow_refused
        } else {
            &self.allowed
        };
        self.counted(counter, started);
    }

    #[inline]
    fn counted(&self, counter: &Counter, started: Stopwatch) {
        counter.increment(1);
        // The clock is read only if a recorder takes the value: with none
        // installed, timing would be most of what the metrics cost.
        self.latency.record(Elapsed(started));
    }
}

/// The time since a stopwatch started, read when the histogram converts it.
struct Elapsed(Stopwatch);

impl metrics::IntoF64 for Elapsed {
    fn into_f64(self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// Decisions of the layer and the rules by reason, labelled `reason`.
pub(crate) const DECISION_REASONS: &str = "tollgate_decision_reasons_total";
/// Admitted decisions above the near-limit share of a quota, labelled
/// `policy`.
pub(crate) const NEAR_LIMIT: &str = "tollgate_near_limit_total";

/// The near-limit counter of the quota set `policy`.
pub(crate) fn near_limit(policy: &str) -> Counter {
    describe_counter!(
        NEAR_LIMIT,
        Unit::Count,
        "Admitted decisions that used more than the near-limit share (0.8 by default) of a quota, by policy (quota set or rule)."
    );
    counter!(NEAR_LIMIT, "policy" => policy.to_owned())
}

/// The in-memory backends' size: one gauge for all of them, moved by each
/// insertion and removal rather than by a scan.
#[derive(Debug, Clone)]
pub(crate) struct MemoryMetrics {
    states: Gauge,
}

impl MemoryMetrics {
    pub(crate) fn new() -> Self {
        describe_gauge!(
            MEMORY_STATES,
            Unit::Count,
            "Rate-limit states (one per key and quota) held by in-memory backends, expired ones not yet swept included."
        );
        MemoryMetrics {
            states: gauge!(MEMORY_STATES),
        }
    }

    /// The number of states stored changed by `delta`.
    pub(crate) fn states_changed(&self, delta: isize) {
        if delta != 0 {
            self.states.increment(delta as f64);
        }
    }
}

/// Reads of a rules file's content.
#[cfg(feature = "rules")]
pub(crate) const RULES_READS: &str = "tollgate_rules_reads_total";
/// Rules file versions met, by outcome: applied, invalid, refused.
#[cfg(feature = "rules")]
pub(crate) const RULES_RELOADS: &str = "tollgate_rules_reloads_total";

/// Describes the rules file's counters and registers them at zero, so that
/// a scrape shows them before anything happened.
#[cfg(feature = "rules")]
pub(crate) fn rules_registered() {
    describe_counter!(
        RULES_READS,
        Unit::Count,
        "Reads of the rules file's content (the watcher reads it only when its size, time or inode changed)."
    );
    describe_counter!(
        RULES_RELOADS,
        Unit::Count,
        "Rules file versions by outcome: applied (now in force), invalid (kept out: not valid rules), refused (not read: not a regular file, too large, unreadable)."
    );
    counter!(RULES_READS).increment(0);
    for outcome in ["applied", "invalid", "refused"] {
        counter!(RULES_RELOADS, "outcome" => outcome).increment(0);
    }
}

/// The rules file's content was read.
#[cfg(feature = "rules")]
pub(crate) fn rules_file_read() {
    counter!(RULES_READS).increment(1);
}

/// A version of the rules file met `outcome`.
#[cfg(feature = "rules")]
pub(crate) fn rules_reloaded(outcome: &'static str) {
    counter!(RULES_RELOADS, "outcome" => outcome).increment(1);
}
