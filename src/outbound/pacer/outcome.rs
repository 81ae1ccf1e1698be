//! What a wait for a turn ends in: the turn, or why none was given.

use std::fmt;
use std::time::Duration;

use crate::backend::BackendError;

/// Why no turn was given.
#[derive(Debug)]
#[non_exhaustive]
pub enum WaitError {
    /// The turn would come after more than the longest wait accepted;
    /// nothing was reserved, and the caller heard at once.
    TooLong {
        /// How long the wait would have been.
        would_wait: Duration,
    },
    /// The store failed: no turn could be scheduled, so none is given.
    Store(BackendError),
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::TooLong { would_wait } => write!(
                f,
                "the turn would come in {would_wait:?}, after the longest wait accepted"
            ),
            WaitError::Store(e) => write!(f, "the pacing store failed: {e}"),
        }
    }
}

impl std::error::Error for WaitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitError::Store(e) => Some(e),
            WaitError::TooLong { .. } => None,
        }
    }
}

/// A turn, taken: the request may go now.
#[derive(Debug, Clone, Copy)]
pub struct Turned {
    /// When it was scheduled, on the store's clock (microseconds).
    pub(super) scheduled_at: u64,
    pub(super) waited: Duration,
}

impl Turned {
    /// How long the caller slept for its turn.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}
