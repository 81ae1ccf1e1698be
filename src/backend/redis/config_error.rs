//! Why a Redis backend could not be built.

use std::fmt;

/// Why a [`RedisBackend`](super::RedisBackend) could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// The URL (or cluster or sentinel URLs) could not make a connection
    /// pool. Passwords in URLs are never quoted.
    Pool(String),
    /// The TLS certificates given could not be used (the CA or client
    /// certificate has no PEM certificate in it, the key no PEM key), or
    /// they were given for URLs that are not `rediss://`.
    Tls(String),
    /// The key prefix contains `{` or `}`.
    BracesInPrefix(String),
    /// A lease setting out of range.
    Lease(String),
    /// Leases are on and a quota of the set needs every arrival (a sliding
    /// log or a leaky bucket).
    LeaseUnsupported {
        /// The quota's name.
        quota: String,
        /// Its algorithm.
        algorithm: crate::quota::Algorithm,
    },
    /// Leases are on and a quota of the set is elastic: a lease taken while
    /// the server has room would be spent when it has none.
    LeaseElastic {
        /// The quota's name.
        quota: String,
    },
}

impl fmt::Display for RedisConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisConfigError::Pool(e) => write!(f, "cannot make a Redis connection pool: {e}"),
            RedisConfigError::Tls(e) => write!(f, "Redis TLS: {e}"),
            RedisConfigError::BracesInPrefix(p) => write!(
                f,
                "the key prefix {p:?} contains a brace, which would change the keys' cluster hash tag"
            ),
            RedisConfigError::Lease(e) => write!(f, "lease: {e}"),
            RedisConfigError::LeaseUnsupported { quota, algorithm } => write!(
                f,
                "quota {quota:?} is a {algorithm}, which needs every arrival and cannot be leased; turn leases off (lease: off) or use a token bucket, GCRA, fixed or sliding window"
            ),
            RedisConfigError::LeaseElastic { quota } => write!(
                f,
                "quota {quota:?} is elastic: its answer depends on the load at each request, so it cannot be leased; turn leases off (lease: off) or the quota's elastic mode"
            ),
        }
    }
}

impl std::error::Error for RedisConfigError {}
