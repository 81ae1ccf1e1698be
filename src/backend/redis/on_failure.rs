//! What a Redis backend does when Redis cannot decide.

use crate::backend::MemoryBackend;

/// What to do when Redis cannot decide (timeout, connection failure, open
/// circuit breaker, unexpected answer).
///
/// The HTTP layer has its own policy for a backend's errors (let the request
/// through by default, or answer 503); [`OnFailure::Error`] leaves the choice
/// to it. To always admit or always refuse while Redis is down, keep
/// `Error` and set that policy on the layer (or match on the error when
/// calling [`Limiter`](crate::Limiter) directly).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum OnFailure {
    /// Return the error (kind [`Timeout`](crate::backend::BackendErrorKind::Timeout),
    /// [`Unavailable`](crate::backend::BackendErrorKind::Unavailable),
    /// [`Protocol`](crate::backend::BackendErrorKind::Protocol) or
    /// [`Misconfigured`](crate::backend::BackendErrorKind::Misconfigured)) and let the caller decide.
    #[default]
    Error,
    /// Decide with this in-memory backend instead: limits hold per server
    /// rather than fleet-wide until Redis is back.
    Fallback(MemoryBackend),
}
