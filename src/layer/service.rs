//! The rate-limiting service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use tower_service::Service;

use super::body::ResponseBody;
use super::future::{ResponseFuture, after_delay};
use super::grpc::{is_grpc, to_grpc};
use super::policy::Policy;
use super::verdict::{Verdict, VerdictKind};

/// A service rate-limited by a [`RateLimitLayer`](super::RateLimitLayer).
pub struct RateLimit<S, P> {
    inner: S,
    policy: Arc<P>,
}

impl<S, P> RateLimit<S, P> {
    pub(crate) fn new(inner: S, policy: Arc<P>) -> Self {
        RateLimit { inner, policy }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, P> Clone for RateLimit<S, P> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            policy: Arc::clone(&self.policy),
        }
    }
}

impl<S: fmt::Debug, P> fmt::Debug for RateLimit<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, P, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, P>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    P: Policy,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        let Some(verdict) = self.policy.decide_now(&parts) else {
            let policy = Arc::clone(&self.policy);
            return ResponseFuture::deciding(self.take_ready(), async move {
                let mut verdict = for_grpc(&parts, policy.decide(&parts).await);
                hand_over(&mut parts, &mut verdict);
                after_delay(verdict, Request::from_parts(parts, body)).await
            });
        };
        let mut verdict = for_grpc(&parts, verdict);
        hand_over(&mut parts, &mut verdict);
        // The request is rebuilt where it is passed on, so that it is built
        // in place rather than copied there (224 bytes, a `memcpy` call).
        match verdict.0 {
            // Decided at once: the service polled ready is called now, and
            // not cloned (for axum, a boxed route: an allocation).
            VerdictKind::Pass {
                headers,
                delay,
                held,
                ..
            } if delay.is_zero() => ResponseFuture::inner(
                self.inner.call(Request::from_parts(parts, body)),
                headers,
                held,
            ),
            VerdictKind::Respond(response) => ResponseFuture::respond(response),
            pass_later => ResponseFuture::deciding(
                self.take_ready(),
                after_delay(Verdict(pass_later), Request::from_parts(parts, body)),
            ),
        }
    }
}

impl<S: Clone, P> RateLimit<S, P> {
    /// The service polled ready, for a request called later: a clone is
    /// left in its place, as tower's contract asks of a service that calls
    /// its inner one after `call` returns.
    fn take_ready(&mut self) -> S {
        let clone = self.inner.clone();
        std::mem::replace(&mut self.inner, clone)
    }
}

/// Puts the decision a passing verdict carries (see
/// [`decision_in_extensions`](super::RateLimitLayerBuilder::decision_in_extensions))
/// in the request's extensions, for the inner service.
#[inline]
fn hand_over(parts: &mut Parts, verdict: &mut Verdict) {
    if let Some((decision, reason)) = verdict.take_hand_over() {
        if let Some(decision) = decision {
            parts.extensions.insert(decision);
        }
        parts.extensions.insert(reason);
    }
    if let Some(usage) = verdict.usage() {
        parts.extensions.insert(usage);
    }
}

/// A verdict for a gRPC call: the layer's own answers in gRPC's terms. The
/// request's content type is looked up only for an answer, not for the
/// requests passed on.
#[inline]
fn for_grpc(parts: &Parts, verdict: Verdict) -> Verdict {
    match verdict.0 {
        VerdictKind::Respond(response) if is_grpc(&parts.headers) => {
            // The response's parts, its reason among its extensions, are kept.
            Verdict(VerdictKind::Respond(Box::new(to_grpc(*response))))
        }
        other => Verdict(other),
    }
}
