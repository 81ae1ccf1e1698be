//! The direct API: check a key from any async code, HTTP or not.

use std::sync::Arc;

use crate::backend::{Backend, CheckRequest, GiveBackRequest, Reserved};
use crate::clock::Stopwatch;
use crate::decision::Decision;
use crate::metrics::DecisionMetrics;
use crate::quota_set::QuotaSet;

mod error;
mod reservation;
mod span;
mod with_room;

pub use error::Error;
pub use reservation::{Reservation, Settle};
pub use with_room::WithRoom;

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
    ///
    /// Limiters share counters only when asked: a [`Quota`](crate::Quota)
    /// passed alone makes a set without a name, whose counters belong to
    /// this limiter and its clones, so two limiters built from the same
    /// quota on one backend (one per route, say) count apart. Limiters
    /// whose [`QuotaSet::new`] sets have the same name and quotas share
    /// them, in this process and, on Redis, across the fleet.
    ///
    /// # Panics
    ///
    /// On a backend shared between processes ([`Backend::shared`], Redis)
    /// with a set that has no name: its counters would be this process's
    /// alone, and a fleet would admit the limit once per server. Name the
    /// set: `QuotaSet::new("login", [quota])?`.
    #[track_caller]
    pub fn new(backend: B, quotas: impl Into<QuotaSet>) -> Self {
        let quotas = quotas.into();
        assert!(
            quotas.is_named() || !backend.shared(),
            "quota {:?} has no set name, and the {} backend is shared between processes: \
             name it with QuotaSet::new(\"<name>\", [quota]) so that every server counts \
             under that name",
            quotas.name(),
            backend.name(),
        );
        let metrics = DecisionMetrics::new(quotas.name(), backend.name());
        Limiter {
            quotas: Arc::new(quotas),
            backend,
            metrics: Arc::new(metrics),
        }
    }

    /// Spends `cost` from `key`'s quotas if they all admit it. Elastic
    /// quotas enforce their limit (see [`with_room`](Limiter::with_room)).
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.with_room(false).check(key, cost).await
    }

    /// Whether `cost` would pass now, spending nothing.
    pub async fn peek(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.with_room(false).peek(key, cost).await
    }

    /// What `key` has left of every quota now, spending nothing: a peek at
    /// cost 0, whose decision reports each quota's remaining units and its
    /// reset. (Whether a request of some cost would pass, and its
    /// retry-after if not, is [`peek`](Limiter::peek) at that cost.)
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, MemoryBackend, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = Limiter::new(
    ///     MemoryBackend::new(),
    ///     Quota::fixed_window(2, Duration::from_secs(60)).build()?,
    /// );
    /// limiter.check("k", 1).await?;
    /// limiter.check("k", 1).await?;
    /// assert_eq!(limiter.inspect("k").await?.quotas()[0].remaining(), 0);
    /// assert!(limiter.peek("k", 1).await?.retry_after().is_some());
    /// limiter.reset("k").await?;
    /// assert_eq!(limiter.inspect("k").await?.quotas()[0].remaining(), 2);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<Decision, Error> {
        self.peek(key, 0).await
    }

    /// Forgets `key`'s state of every quota of this limiter's set, at once:
    /// afterwards the key means what a key never seen means, on every
    /// process sharing the backend ([`reset_quota`](Limiter::reset_quota)
    /// resets one quota). A backend without [`Backend::reset`] answers an
    /// `Unsupported` error.
    pub async fn reset(&self, key: &str) -> Result<(), Error> {
        Ok(self.backend.reset(key, &self.quotas).await?)
    }

    /// Forgets `key`'s state of the one quota named `quota`, leaving the
    /// set's other quotas as they are (a daily quota reset after a support
    /// call, its per-minute quota untouched). Returns whether the set has
    /// a quota of that name.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, MemoryBackend, Quota, QuotaSet};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let set = QuotaSet::new("api", [
    ///     Quota::sliding_log(5, Duration::from_secs(60)).name("minute").build()?,
    ///     Quota::sliding_window(100, Duration::from_secs(86_400)).build()?,
    /// ])?;
    /// let limiter = Limiter::new(MemoryBackend::new(), set);
    /// limiter.check("k", 3).await?;
    /// let day = limiter.quotas().quotas()[1].name().to_owned();
    /// assert!(limiter.reset_quota("k", &day).await?);
    /// assert!(!limiter.reset_quota("k", "no-such-quota").await?);
    /// let left = limiter.inspect("k").await?;
    /// assert_eq!(left.quotas()[0].remaining(), 2);
    /// assert_eq!(left.quotas()[1].remaining(), 100);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset_quota(&self, key: &str, quota: &str) -> Result<bool, Error> {
        let at = self.quotas.quotas().iter().position(|q| q.name() == quota);
        // A quota's state is keyed by its id alone: the quota alone, with
        // its id, names the same state.
        let Some(one) = at.and_then(|i| self.quotas.only(i)) else {
            return Ok(false);
        };
        self.backend.reset(key, &one).await?;
        Ok(true)
    }

    /// [`check`](Limiter::check) without waiting, when the backend can
    /// decide synchronously (see [`Backend::check_now`]); `None` when the
    /// request must be awaited.
    #[inline]
    pub fn check_now(&self, key: &str, cost: u64) -> Option<Result<Decision, Error>> {
        self.with_room(false).check_now(key, cost)
    }

    /// This limiter's checks, saying whether the server has `room`: with
    /// room, [elastic](crate::Mode::Elastic) quotas admit up to their
    /// ceiling; without, they enforce their limit, as [`check`](Limiter::check)
    /// does. The layer asks its load signal; without one, no room.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, MemoryBackend, Mode, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 2 a minute, up to 4 (100 % more) while the server has room.
    /// let quota = Quota::fixed_window(2, Duration::from_secs(60))
    ///     .mode(Mode::Elastic { percent: 100 })
    ///     .build()?;
    /// let limiter = Limiter::new(MemoryBackend::new(), quota);
    /// for _ in 0..4 {
    ///     assert!(limiter.with_room(true).check("k", 1).await?.allowed());
    /// }
    /// assert!(!limiter.check("k", 1).await?.allowed());
    /// # Ok(())
    /// # }
    /// ```
    #[inline]
    pub fn with_room(&self, room: bool) -> WithRoom<'_, B> {
        WithRoom {
            limiter: self,
            room,
        }
    }

    /// Reserves `cost` from `key`'s quotas: spends it now, as
    /// [`check`](Limiter::check) does, so that requests in flight hold
    /// what they took and the next one is refused when nothing is left;
    /// then, once the request's outcome is known,
    /// [`keep`](Reservation::keep) the units or
    /// [`give_back`](Reservation::give_back) them. A reservation dropped
    /// unsettled (the caller gave up, a task panicked) is kept. A refused
    /// reservation spent nothing, and settling it does nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, MemoryBackend, Quota};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Five failed sign-ins per 15 minutes; successes are free.
    /// let limiter = Limiter::new(
    ///     MemoryBackend::new(),
    ///     Quota::fixed_window(5, Duration::from_secs(900)).build()?,
    /// );
    /// let attempt = limiter.reserve("client:1", 1).await?;
    /// assert!(attempt.decision().allowed());
    /// let password_ok = true;
    /// if password_ok {
    ///     attempt.give_back().await?;
    /// } else {
    ///     attempt.keep();
    /// }
    /// assert_eq!(limiter.peek("client:1", 0).await?.remaining(), 5);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reserve(&self, key: &str, cost: u64) -> Result<Reservation<'_, B>, Error> {
        let reserved = self.with_room(false).reserve(key, cost).await?;
        Ok(Reservation {
            limiter: self,
            key: key.into(),
            cost,
            reserved,
        })
    }

    /// Gives back `cost` of `reserved`, made for `key`, and `requests` (1
    /// when the whole reservation goes back) to the quotas counting
    /// requests: what is left then (a refused reservation spent nothing:
    /// its own decision).
    pub(crate) async fn give_back_reserved(
        &self,
        key: &str,
        cost: u64,
        requests: u64,
        reserved: &Reserved,
    ) -> Result<Decision, Error> {
        if !reserved.decision().allowed() {
            return Ok(reserved.decision().clone());
        }
        let request = GiveBackRequest {
            key,
            quotas: &self.quotas,
            cost,
            requests,
            reserved,
        };
        Ok(self.backend.give_back(request).await?)
    }

    /// Settles `reserved`, made for `key` and `cost`, with the request's
    /// real cost `actual` ([`Settle::Actual`]).
    pub(crate) async fn settle_reserved(
        &self,
        key: &str,
        cost: u64,
        reserved: &Reserved,
        actual: u64,
    ) -> Result<Option<Decision>, Error> {
        if !reserved.decision().allowed() || actual == cost {
            return Ok(None);
        }
        if actual < cost {
            // The request was served: its request stays counted.
            let back = cost - actual;
            return self
                .give_back_reserved(key, back, 0, reserved)
                .await
                .map(Some);
        }
        self.charge(key, actual - cost).await.map(Some)
    }

    /// Spends `cost` on `key`'s quotas whatever is left (usage beyond a
    /// reservation; see [`Backend::charge`]); no cost is too high, as the
    /// units were used already.
    pub(crate) async fn charge(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        let request = CheckRequest {
            key,
            quotas: &self.quotas,
            cost,
            commit: true,
            room: false,
            started: Stopwatch::start(),
        };
        Ok(self.backend.charge(request).await?)
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
            cost: self.quotas.cost_of(cost, commit),
            commit,
            room,
            started,
        })
    }
}
