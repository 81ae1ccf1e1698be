//! Why a check could not give a decision.

use std::fmt;

use crate::backend::BackendError;

/// Why a check could not give a decision.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The cost is more than the quota could admit even when untouched: no
    /// amount of waiting would let it pass.
    CostTooHigh {
        /// The quota's name.
        quota: String,
        /// The cost asked for.
        cost: u64,
        /// The most that quota admits at once.
        max: u64,
    },
    /// The backend failed.
    Backend(BackendError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::CostTooHigh { quota, cost, max } => write!(
                f,
                "a cost of {cost} can never pass quota {quota:?}, which admits at most {max} at once"
            ),
            Error::Backend(e) => write!(f, "rate-limit backend failed: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Backend(e) => Some(e),
            Error::CostTooHigh { .. } => None,
        }
    }
}

impl From<BackendError> for Error {
    fn from(e: BackendError) -> Self {
        Error::Backend(e)
    }
}
