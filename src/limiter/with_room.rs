//! [`WithRoom`]: a limiter's checks made saying whether the server has
//! room, and the one way a decision made now is returned.

use std::fmt;

use tracing::Instrument;

use super::span::{outcome_name, record};
use super::{Error, Limiter};
use crate::backend::{Backend, Now, Reserved};
use crate::clock::Stopwatch;
use crate::decision::Decision;

/// A [`Limiter`]'s checks made saying whether the server has room: made
/// by [`Limiter::with_room`].
pub struct WithRoom<'a, B> {
    pub(super) limiter: &'a Limiter<B>,
    pub(super) room: bool,
}

// By hand: derived, they would ask `B: Clone` (or `Debug`) of the backend.
impl<B> Clone for WithRoom<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for WithRoom<'_, B> {}

impl<B> fmt::Debug for WithRoom<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithRoom")
            .field("room", &self.room)
            .finish_non_exhaustive()
    }
}

impl<'a, B: Backend> WithRoom<'a, B> {
    /// [`Limiter::check`], with or without room.
    pub async fn check(self, key: &str, cost: u64) -> Result<Decision, Error> {
        let limiter = self.limiter;
        let started = Stopwatch::start();
        let span = limiter.span(key, cost, "check");
        // The backend's future awaited here, not in a helper's: with a
        // Redis backend's futures inside, one async layer more (beside the
        // span's) makes the layer's future too deep for rustc's default
        // recursion limit to lay out, in the app that serves it.
        let outcome = match limiter.request(key, cost, true, self.room, started) {
            Ok(request) => (limiter
                .backend
                .check(request)
                .instrument(span.clone())
                .await)
                .map_err(Error::from),
            Err(e) => Err(e),
        };
        record(&span, &outcome);
        limiter.metrics.decided(&outcome, started);
        outcome
    }

    /// [`Limiter::peek`], with or without room.
    pub async fn peek(self, key: &str, cost: u64) -> Result<Decision, Error> {
        let limiter = self.limiter;
        let span = limiter.span(key, cost, "peek");
        let outcome = match limiter.request(key, cost, false, self.room, Stopwatch::start()) {
            Ok(request) => (limiter
                .backend
                .check(request)
                .instrument(span.clone())
                .await)
                .map_err(Error::from),
            Err(e) => Err(e),
        };
        record(&span, &outcome);
        outcome
    }

    /// [`Limiter::check_now`], with or without room.
    #[inline]
    pub fn check_now(self, key: &str, cost: u64) -> Option<Result<Decision, Error>> {
        self.now(key, cost)
    }

    /// [`check_now`](WithRoom::check_now), saying also whether the backend
    /// ever decides now ([`Now::Never`]): the layer remembers that, and
    /// stops preparing requests for it.
    #[inline]
    pub(crate) fn now<A: Answer>(self, key: &str, cost: u64) -> A {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return self.decide_now(key, cost);
        }
        let span = self.limiter.span(key, cost, "check");
        let outcome: A = span.in_scope(|| self.decide_now(key, cost));
        match outcome.decided() {
            Some(outcome) => record(&span, outcome),
            // The awaited check that follows has a span of its own.
            None => {
                span.record("outcome", "deferred");
            }
        }
        outcome
    }

    /// [`now`](WithRoom::now) without its span: the decision at once,
    /// timed and counted.
    #[inline]
    fn decide_now<A: Answer>(self, key: &str, cost: u64) -> A {
        let limiter = self.limiter;
        let started = Stopwatch::start();
        let failed = |e: Error| {
            let outcome = Err(e);
            limiter.metrics.decided(&outcome, started);
            A::new(Now::Decided(outcome))
        };
        let request = match limiter.request(key, cost, true, self.room, started) {
            Ok(request) => request,
            Err(e) => return failed(e),
        };
        // One match over what the backend returned: through `?` and an
        // early return, the decision was copied twice more on its way out.
        match limiter.backend.check_now(request) {
            Now::Decided(Ok(decision)) => {
                limiter.metrics.decided_ok(&decision, started);
                A::new(Now::Decided(Ok(decision)))
            }
            Now::Decided(Err(e)) => failed(Error::Backend(e)),
            Now::Later => A::new(Now::Later),
            Now::Never => A::new(Now::Never),
        }
    }

    /// The reservation behind [`Limiter::reserve`], counted in the metrics
    /// as a check.
    pub(crate) async fn reserve(self, key: &str, cost: u64) -> Result<Reserved, Error> {
        let limiter = self.limiter;
        let started = Stopwatch::start();
        let span = limiter.span(key, cost, "reserve");
        let outcome = match limiter.request(key, cost, true, self.room, started) {
            Ok(request) => (limiter
                .backend
                .reserve(request)
                .instrument(span.clone())
                .await)
                .map_err(Error::from),
            Err(e) => Err(e),
        };
        if !span.is_disabled() {
            span.record(
                "outcome",
                outcome_name(outcome.as_ref().map(Reserved::decision)),
            );
        }
        match &outcome {
            Ok(reserved) => limiter.metrics.decided_ok(reserved.decision(), started),
            Err(_) => limiter.metrics.decided(&Err::<Decision, ()>(()), started),
        }
        outcome
    }
}

/// What a decision made without waiting is returned as: the public
/// `Option` of [`Limiter::check_now`], or the [`Now`] the layer reads to
/// stop asking a backend that never decides now. Each is built where the
/// decision is made: a `Now` converted into an `Option` afterwards copied
/// the whole decision on every check (~40 instructions of GCRA's ~330).
pub(crate) trait Answer: Sized {
    /// The answer for what the backend said.
    fn new(now: Now<Error>) -> Self;
    /// The decision, if one was made now.
    fn decided(&self) -> Option<&Result<Decision, Error>>;
}

impl Answer for Option<Result<Decision, Error>> {
    #[inline(always)]
    fn new(now: Now<Error>) -> Self {
        now.decided()
    }

    #[inline(always)]
    fn decided(&self) -> Option<&Result<Decision, Error>> {
        self.as_ref()
    }
}

impl Answer for Now<Error> {
    #[inline(always)]
    fn new(now: Now<Error>) -> Self {
        now
    }

    #[inline(always)]
    fn decided(&self) -> Option<&Result<Decision, Error>> {
        match self {
            Now::Decided(outcome) => Some(outcome),
            Now::Later | Now::Never => None,
        }
    }
}
