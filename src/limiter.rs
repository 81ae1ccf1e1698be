//! The direct API: check a key from any async code, HTTP or not.

use std::fmt;
use std::sync::Arc;

use crate::backend::{Backend, BackendError, CheckRequest};
use crate::clock::Stopwatch;
use crate::decision::Decision;
use crate::metrics::DecisionMetrics;
use crate::quota_set::QuotaSet;

/// A set of quotas bound to a backend. Cheap to clone (the quotas are shared;
/// clone the backend's handle as it clones).
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Limiter, MemoryBackend, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::new(
///     MemoryBackend::new(),
///     Quota::gcra(2, Duration::from_secs(60)).build()?,
/// );
/// assert!(limiter.check("user:42", 1).await?.allowed());
/// assert!(limiter.check("user:42", 1).await?.allowed());
/// let third = limiter.check("user:42", 1).await?;
/// assert!(!third.allowed());
/// assert!(third.retry_after().unwrap() <= Duration::from_secs(30));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Limiter<B> {
    quotas: Arc<QuotaSet>,
    backend: B,
    metrics: Arc<DecisionMetrics>,
}

impl<B: Clone> Clone for Limiter<B> {
    fn clone(&self) -> Self {
        Limiter {
            quotas: Arc::clone(&self.quotas),
            backend: self.backend.clone(),
            metrics: Arc::clone(&self.metrics),
        }
    }
}

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

impl<B> Limiter<B> {
    /// The quotas.
    pub fn quotas(&self) -> &QuotaSet {
        &self.quotas
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Its metrics handles, for a caller that gives up on a check (a
    /// timeout) to count the failure the check could not.
    pub(crate) fn metrics(&self) -> &DecisionMetrics {
        &self.metrics
    }
}

impl<B: Backend> Limiter<B> {
    /// A limiter of `quotas` (one [`Quota`](crate::Quota) or a [`QuotaSet`])
    /// on `backend`.
    ///
    /// Its metrics ([`guide::metrics`](crate::guide::metrics)) are
    /// registered now, with the recorder installed at this moment.
    pub fn new(backend: B, quotas: impl Into<QuotaSet>) -> Self {
        let quotas = quotas.into();
        let metrics = DecisionMetrics::new(quotas.name(), backend.name());
        Limiter {
            quotas: Arc::new(quotas),
            backend,
            metrics: Arc::new(metrics),
        }
    }

    /// Spends `cost` from `key`'s quotas if they all admit it. Elastic
    /// quotas enforce their limit (see [`check_with_room`](Limiter::check_with_room)).
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.check_with_room(key, cost, false).await
    }

    /// [`check`](Limiter::check), saying whether the server has room:
    /// with room, [elastic](crate::Mode::Elastic) quotas admit up to their
    /// ceiling. The layer asks its load signal; without one, no room.
    pub async fn check_with_room(
        &self,
        key: &str,
        cost: u64,
        room: bool,
    ) -> Result<Decision, Error> {
        let started = Stopwatch::start();
        let outcome = self.decide(key, cost, true, room, started).await;
        self.metrics.decided(&outcome, started);
        outcome
    }

    /// Whether `cost` would pass now, spending nothing.
    pub async fn peek(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.peek_with_room(key, cost, false).await
    }

    /// [`peek`](Limiter::peek), saying whether the server has room (see
    /// [`check_with_room`](Limiter::check_with_room)).
    pub async fn peek_with_room(
        &self,
        key: &str,
        cost: u64,
        room: bool,
    ) -> Result<Decision, Error> {
        self.decide(key, cost, false, room, Stopwatch::start())
            .await
    }

    /// [`check`](Limiter::check) without waiting, when the backend can
    /// decide synchronously (see [`Backend::check_now`]); `None` otherwise.
    #[inline]
    pub fn check_now(&self, key: &str, cost: u64) -> Option<Result<Decision, Error>> {
        self.check_now_with_room(key, cost, false)
    }

    /// [`check_now`](Limiter::check_now), saying whether the server has room
    /// (see [`check_with_room`](Limiter::check_with_room)).
    #[inline]
    pub fn check_now_with_room(
        &self,
        key: &str,
        cost: u64,
        room: bool,
    ) -> Option<Result<Decision, Error>> {
        let started = Stopwatch::start();
        let failed = |e: Error| {
            let outcome = Err(e);
            self.metrics.decided(&outcome, started);
            Some(outcome)
        };
        let request = match self.request(key, cost, true, room, started) {
            Ok(request) => request,
            Err(e) => return failed(e),
        };
        // One match over what the backend returned: through `?` and an
        // early return, the decision was copied twice more on its way out.
        match self.backend.check_now(request) {
            Some(Ok(decision)) => {
                self.metrics.decided_ok(&decision, started);
                Some(Ok(decision))
            }
            Some(Err(e)) => failed(Error::Backend(e)),
            None => None,
        }
    }

    async fn decide(
        &self,
        key: &str,
        cost: u64,
        commit: bool,
        room: bool,
        started: Stopwatch,
    ) -> Result<Decision, Error> {
        let request = self.request(key, cost, commit, room, started)?;
        Ok(self.backend.check(request).await?)
    }

    fn request<'a>(
        &'a self,
        key: &'a str,
        cost: u64,
        commit: bool,
        room: bool,
        started: Stopwatch,
    ) -> Result<CheckRequest<'a>, Error> {
        if let Some(q) = self.quotas.too_costly(cost) {
            return Err(Error::CostTooHigh {
                quota: q.name().to_owned(),
                cost,
                max: q.max_cost(),
            });
        }
        Ok(CheckRequest {
            key,
            quotas: &self.quotas,
            cost,
            commit,
            room,
            started,
        })
    }
}
