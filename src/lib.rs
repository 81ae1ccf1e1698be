//! Rate limiting for tower and axum services, in one process or across a
//! fleet that shares Redis.
//!
//! The heart of the crate decides "may this key spend this much now?": a
//! [`Quota`] (limit per period, burst, algorithm, mode) or several at once in
//! a [`QuotaSet`], kept in a [`Backend`], asked through a [`Limiter`]. Each
//! algorithm is plain arithmetic on the stored state, the cost and the time,
//! with no clock or I/O inside, so the in-memory and Redis backends share one
//! meaning and one test suite.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Limiter, MemoryBackend, Quota, QuotaSet};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // At most 10 notifications a minute, and 3 s between two of them.
//! let quotas = QuotaSet::new("push", [
//!     Quota::sliding_log(10, Duration::from_secs(60)).build()?,
//!     Quota::min_interval(Duration::from_secs(3)).build()?,
//! ])?;
//! let limiter = Limiter::new(MemoryBackend::new(), quotas);
//!
//! let decision = limiter.check("teacher:17", 1).await?;
//! if decision.allowed() {
//!     // send the notification
//! } else if let Some(wait) = decision.retry_after() {
//!     // try again after `wait`
//! #   let _ = wait;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Choosing an algorithm
//!
//! | algorithm | state per key | allows bursts | exact over any rolling period | pick it for |
//! |---|---|---|---|---|
//! | [`Gcra`](Algorithm::Gcra) | one timestamp | up to `burst` | no (burst + rate) | the default: smooth rate with a burst, least state |
//! | [`TokenBucket`](Algorithm::TokenBucket) | tokens + timestamp | up to `burst` | no (burst + rate) | the same behaviour in the familiar terms; exact fractional rates |
//! | [`LeakyBucket`](Algorithm::LeakyBucket) | one timestamp | no: queued | output evenly spaced | protecting a backend that needs a steady rate; delays instead of refusing |
//! | [`FixedWindow`](Algorithm::FixedWindow) | counter + window | 2x at a boundary | no | cheapest, easiest to explain ("100 per calendar minute") |
//! | [`SlidingWindow`](Algorithm::SlidingWindow) | two counters + window | no | approximately | rolling limits at fixed cost (Cloudflare measured 0.003% error) |
//! | [`SlidingLog`](Algorithm::SlidingLog) | up to `limit` timestamps | no | yes | small limits that must never be exceeded (notifications, logins) |
//!
//! A [`Mode`] makes a quota shadow (report, never refuse), soft (admit a
//! percentage over the limit) or elastic (admit a percentage over it while
//! the server has room); [`Quota::min_interval`] spaces actions apart.

#![warn(missing_docs)]

mod algorithm;
pub mod backend;
mod clock;
mod decision;
pub mod key;
pub mod layer;
mod limiter;
mod log_limit;
mod metrics;
mod quota;
mod quota_set;
#[cfg(feature = "rls")]
pub mod rls;
#[cfg(feature = "rules")]
pub mod rules;
mod state;
mod sync;

// The names a user writes in ordinary use; the rest are in their modules
// (`tollgate::backend`, `tollgate::layer`, `tollgate::key`, `tollgate::rules`).
pub use backend::{Backend, BackendError, MemoryBackend};
#[cfg(feature = "redis")]
pub use backend::{Lease, OnFailure, RedisBackend};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use decision::{Decision, QuotaDecision};
pub use layer::{
    ConcurrencyQuota, CountStatus, HeaderStyle, OnBackendError, OnDelay, OnMissingKey,
    PartitionKey, Priority, RateLimitLayer, Shedding,
};
pub use limiter::{Error, Limiter};
pub use quota::{Algorithm, Mode, Quota, QuotaBuilder, QuotaError};
pub use quota_set::{QuotaSet, QuotaSetError};
pub use state::{QuotaState, StateError};

/// The README's examples, compiled and run as doctests (they use every
/// feature, as CI's `--all-features` run does).
#[cfg(all(doctest, feature = "redis", feature = "rules"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
