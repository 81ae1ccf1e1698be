//! Where the state lives: [`MemoryBackend`] in this process, or (with the
//! `redis` feature) Redis, shared by a fleet; or a store of your own, which
//! implements [`Backend`] with [`QuotaSet::decide`](crate::QuotaSet::decide)
//! over [`QuotaState`](crate::QuotaState)s it keeps.

mod any;
mod batch;
mod memory;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(any(feature = "redis", feature = "rules"))]
mod redis_url;
#[cfg(any(feature = "redis", feature = "rules"))]
pub(crate) use redis_url::redis_url_redacted;
mod slots;
mod table;

use std::fmt;
use std::future::Future;

pub use any::{AnyBackend, AnyBackendError};
pub use batch::{BatchBackend, BatchBackendBuilder};
pub use memory::{MemoryBackend, MemoryBackendBuilder};
#[cfg(feature = "redis")]
pub use redis::{
    CircuitBreaker, Lease, OnFailure, RedisBackend, RedisBackendBuilder, RedisConfigError,
    RedisSlots, RedisStats,
};

pub use slots::{Acquired, MemorySlots, Slot, SlotFuture, SlotStore};

use crate::clock::Timestamp;
use crate::decision::Decision;
use crate::quota_set::QuotaSet;

/// One decision asked of a backend. Built by [`Limiter`](crate::Limiter),
/// which has already refused costs no quota could ever admit.
#[derive(Debug, Clone, Copy)]
pub struct CheckRequest<'a> {
    pub(crate) key: &'a str,
    pub(crate) quotas: &'a QuotaSet,
    pub(crate) cost: u64,
    pub(crate) commit: bool,
    pub(crate) room: bool,
    /// When the limiter began the check: the memory backend on the system
    /// clock reads its time from it rather than from the clock again.
    pub(crate) started: crate::clock::Stopwatch,
}

impl<'a> CheckRequest<'a> {
    /// The client key.
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The quotas to check.
    pub fn quotas(&self) -> &'a QuotaSet {
        self.quotas
    }

    /// How much the request spends.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// False for a peek: decide, but change nothing.
    pub fn commit(&self) -> bool {
        self.commit
    }

    /// Whether the server has room for elastic quotas' extra
    /// ([`Mode::Elastic`](crate::Mode::Elastic)); without it they enforce
    /// their limit. A store passes it to
    /// [`QuotaSet::decide_with_room`](crate::QuotaSet::decide_with_room).
    pub fn room(&self) -> bool {
        self.room
    }
}

/// A reservation as a backend made it (see [`Backend::reserve`]): the
/// decision, and the moment on the store's clock it was made, which giving
/// it back needs (a window that has rolled over since gives nothing back).
#[derive(Debug, Clone)]
pub struct Reserved {
    decision: Decision,
    at: Timestamp,
    /// Made by the Redis backend's fallback store, while Redis failed: given
    /// back there.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fallback: bool,
}

impl Reserved {
    /// A reservation made at `at`, the store's time of `decision`.
    pub fn new(decision: Decision, at: Timestamp) -> Self {
        Reserved {
            decision,
            at,
            fallback: false,
        }
    }

    /// The decision: whether the reservation was admitted, and what each
    /// quota reported.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// When it was made, on the store's clock.
    pub fn at(&self) -> Timestamp {
        self.at
    }

    /// The decision, taken out.
    pub fn into_decision(self) -> Decision {
        self.decision
    }
}

/// A reservation to give back, asked of a backend (see
/// [`Backend::give_back`]). A store applies it with
/// [`QuotaSet::give_back`](crate::QuotaSet::give_back).
#[derive(Debug, Clone, Copy)]
pub struct GiveBackRequest<'a> {
    pub(crate) key: &'a str,
    pub(crate) quotas: &'a QuotaSet,
    pub(crate) cost: u64,
    pub(crate) requests: u64,
    pub(crate) reserved: &'a Reserved,
}

impl<'a> GiveBackRequest<'a> {
    /// The client key.
    pub fn key(&self) -> &'a str {
        self.key
    }

    /// The quotas reserved on.
    pub fn quotas(&self) -> &'a QuotaSet {
        self.quotas
    }

    /// The units to give back to the quotas counting the cost: the
    /// reservation's cost, or what of it the request did not use.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The requests to give back to the quotas counting requests
    /// ([`Counts::Requests`](crate::Counts::Requests)): 1 when the whole
    /// reservation goes back, 0 when the request was served and only part
    /// of its cost goes back.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// The reservation, as [`Backend::reserve`] made it.
    pub fn reserved(&self) -> &'a Reserved {
        self.reserved
    }
}

/// A store of rate-limit state that decides atomically: the check and the
/// update of all of a key's quotas happen as one step, with no race against
/// other callers (other tasks, or other servers sharing the store).
///
/// The backend owns the clock: [`MemoryBackend`] reads its [`Clock`](crate::Clock),
/// the Redis backend reads Redis's `TIME`, so callers never pass a time.
pub trait Backend: Send + Sync + 'static {
    /// Decides one request.
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a;

    /// Decides without waiting, when the backend can: in-memory backends
    /// can, and the HTTP layer then decides inside `call` with no
    /// allocation. One answer says both whether this request was decided
    /// and whether asking is worth it at all: [`Now::Never`] (the default)
    /// tells callers that only [`check`](Backend::check) decides here, and
    /// they stop asking (the layer then extracts each request's key once,
    /// for `check` alone).
    #[inline]
    fn check_now(&self, request: CheckRequest<'_>) -> Now {
        let _ = request;
        Now::Never
    }

    /// Decides one request, as [`check`](Backend::check) does with
    /// `commit`, and says when: a reservation, which
    /// [`give_back`](Backend::give_back) may undo once the request's
    /// outcome is known. The default checks and takes the time from the
    /// system clock; a store that gives back implements both, on its own
    /// clock.
    fn reserve<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Reserved, BackendError>> + Send + 'a {
        async move {
            let at = crate::clock::Clock::now(&crate::clock::SystemClock);
            Ok(Reserved::new(self.check(request).await?, at))
        }
    }

    /// Gives back what a reservation spent, atomically, as
    /// [`QuotaSet::give_back`](crate::QuotaSet::give_back) says, and
    /// returns what is left then (as a peek at cost 0 would). The default
    /// cannot, and says so with a [`BackendErrorKind::Unsupported`] error:
    /// the units stay spent, and the caller hears of it.
    fn give_back<'a>(
        &'a self,
        request: GiveBackRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        let _ = request;
        std::future::ready(Err(BackendError::new(
            BackendErrorKind::Unsupported,
            "this backend cannot give back a reservation (Backend::give_back is not implemented)",
        )))
    }

    /// Forgets `key`'s state under `quotas`, atomically: afterwards the key
    /// means what a key never seen means (every quota full). On Redis, one
    /// script deletes all of the key's states at once. The default cannot,
    /// and says so with a [`BackendErrorKind::Unsupported`] error.
    fn reset<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a QuotaSet,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a {
        let _ = (key, quotas);
        std::future::ready(Err(BackendError::new(
            BackendErrorKind::Unsupported,
            "this backend cannot reset a key (Backend::reset is not implemented)",
        )))
    }

    /// Spends `request.cost` on every quota of the key whatever is left,
    /// atomically: usage reported beyond a reservation (an LLM answer that
    /// took more tokens than reserved), which was served and so counts. A
    /// quota taken past its limit is in debt: it refuses until the debt
    /// has returned, and says how long in its reset. Returns the decision
    /// the charge leaves (as a peek at cost 0 would report it). The
    /// default cannot, and says so with a
    /// [`BackendErrorKind::Unsupported`] error.
    fn charge<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        let _ = request;
        std::future::ready(Err(BackendError::new(
            BackendErrorKind::Unsupported,
            "this backend cannot charge usage beyond a reservation (Backend::charge is not implemented)",
        )))
    }

    /// Whether other processes read and write this backend's state (Redis
    /// does; memory does not, nor the default). A limiter refuses a
    /// [`QuotaSet`] without a name on a shared backend, since such a set's
    /// state is private to this process (see [`Limiter::new`](crate::Limiter::new)):
    /// a store shared by a fleet says true.
    fn shared(&self) -> bool {
        false
    }

    /// The backend's name in metrics (the `backend` label of
    /// `tollgate_decision_duration_seconds`): `"memory"`, `"redis"`, or
    /// `"custom"` (the default). A constant: labels must stay few.
    fn name(&self) -> &'static str {
        "custom"
    }
}

/// What [`Backend::check_now`] answers (and, with the limiter's
/// [`Error`](crate::Error), what the layer hears from a limiter).
#[derive(Debug)]
pub enum Now<E = BackendError> {
    /// Decided here, without waiting.
    Decided(Result<Decision, E>),
    /// Not this request: ask [`check`](Backend::check) (the Redis backend
    /// when no lease covers it). Another request may be decided now.
    Later,
    /// Not any request: this backend decides only in
    /// [`check`](Backend::check). Say it for every request or for none,
    /// since callers remember it and stop asking.
    Never,
}

impl<E> Now<E> {
    /// The decision, if made now; `None` for both [`Now::Later`] and
    /// [`Now::Never`].
    #[inline]
    pub fn decided(self) -> Option<Result<Decision, E>> {
        match self {
            Now::Decided(outcome) => Some(outcome),
            Now::Later | Now::Never => None,
        }
    }
}

/// What kind of failure a backend met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// No answer within the time allowed.
    Timeout,
    /// The store could not be reached, or refused the call (a circuit breaker
    /// is open, a pool is exhausted).
    Unavailable,
    /// The store answered something that makes no sense.
    Protocol,
    /// The store answered, but refuses what the backend asks of it: a
    /// misconfiguration, which lasts until an operator fixes it, not an
    /// outage (a Redis user without the commands the scripts need, a
    /// scripting command renamed away, a Redis full under `noeviction`).
    Misconfigured,
    /// The backend cannot do what was asked (a custom backend without
    /// [`Backend::give_back`]).
    Unsupported,
}

impl BackendErrorKind {
    /// Its name in metrics and logs: `timeout`, `unavailable`, `protocol`,
    /// `misconfigured` or `unsupported`.
    pub fn name(self) -> &'static str {
        match self {
            BackendErrorKind::Timeout => "timeout",
            BackendErrorKind::Unavailable => "unavailable",
            BackendErrorKind::Protocol => "protocol",
            BackendErrorKind::Misconfigured => "misconfigured",
            BackendErrorKind::Unsupported => "unsupported",
        }
    }
}

/// A backend could not decide. Callers fall back to their failure policy
/// (let the request through, by default).
#[derive(Debug)]
pub struct BackendError {
    kind: BackendErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl BackendError {
    /// An error of `kind` described by `message`.
    pub fn new(kind: BackendErrorKind, message: impl Into<String>) -> Self {
        BackendError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// What kind of failure it was.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}
