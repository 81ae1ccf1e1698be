//! The span of one decision: its set, its key's hash, its cost, its outcome.

use std::fmt;
use std::hash::BuildHasher;

use tracing::Span;

use super::{Error, Limiter};
use crate::decision::Decision;

/// Records a decision's outcome on its span.
pub(super) fn record(span: &Span, outcome: &Result<Decision, Error>) {
    if !span.is_disabled() {
        span.record("outcome", outcome_name(outcome.as_ref()));
    }
}

/// `allowed`, `refused`, or `errored` (the backend failed or the cost can
/// never pass): what the span of a decision says.
pub(super) fn outcome_name(outcome: Result<&Decision, &Error>) -> &'static str {
    match outcome {
        Ok(d) if d.allowed() => "allowed",
        Ok(_) => "refused",
        Err(_) => "errored",
    }
}

/// A key's hash as a span shows it: 16 hex digits, the same for the same
/// key in one process, keyed by a secret drawn at start, so that a log
/// cannot be searched for a guessed key (an IP address is easily guessed).
struct KeyHash(u64);

impl KeyHash {
    fn of(key: &str) -> KeyHash {
        static SECRET: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
        KeyHash(
            SECRET
                .get_or_init(std::hash::RandomState::new)
                .hash_one(key),
        )
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl<B: crate::backend::Backend> Limiter<B> {
    /// The span of one decision (level DEBUG, target `tollgate`): its set,
    /// the hash of its key (never the key, which may be an API key), its
    /// cost and, once known, its outcome. Without a subscriber at that level
    /// it is `Span::none()`: a span made disabled by `debug_span!` still
    /// carries its metadata for the `log` crate (tracing's `log` feature,
    /// which other crates turn on), and entering, leaving and dropping it
    /// cost about 360 instructions a check, more than the decision itself.
    #[inline]
    pub(super) fn span(&self, key: &str, cost: u64, op: &'static str) -> Span {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return Span::none();
        }
        let span = tracing::debug_span!(
            "tollgate.decision",
            op,
            set = self.quotas.name(),
            backend = self.backend.name(),
            key_hash = tracing::field::Empty,
            cost,
            outcome = tracing::field::Empty,
        );
        if !span.is_disabled() {
            span.record("key_hash", tracing::field::display(KeyHash::of(key)));
        }
        span
    }
}
