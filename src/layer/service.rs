//! The rate-limiting service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::future::{Gate, ResponseFuture};
use super::headers::Headers;
use super::{KeyOutcome, Shared, Verdict, timed_out};
use crate::backend::Backend;
use crate::key::KeyExtractor;

/// A service rate-limited by a [`RateLimitLayer`](super::RateLimitLayer).
pub struct RateLimit<S, B, K> {
    inner: S,
    shared: Arc<Shared<B, K>>,
}

impl<S, B, K> RateLimit<S, B, K> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<B, K>>) -> Self {
        RateLimit { inner, shared }
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

impl<S: Clone, B, K> Clone for RateLimit<S, B, K> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, B, K> fmt::Debug for RateLimit<S, B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, B, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
    B: Backend,
    K: KeyExtractor,
{
    type Response = Response<super::ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone is left behind; the instance that was polled ready serves
        // this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = &self.shared;
        let (parts, body) = request.into_parts();
        let cost = shared.cost(&parts);
        let key = match shared.key.extract(&parts).into_ready() {
            Ok(key) => key,
            Err(pending) => {
                let shared = Arc::clone(shared);
                return ResponseFuture::gate(inner, async move {
                    match shared.admit_key(pending.await) {
                        KeyOutcome::Limit(key) => {
                            decide_async(&shared, key, cost, parts, body).await
                        }
                        KeyOutcome::Unlimited => Gate::Admit {
                            request: Request::from_parts(parts, body),
                            headers: Headers::new(),
                        },
                        KeyOutcome::Respond(response) => Gate::Respond(response),
                    }
                });
            }
        };
        let key = match shared.admit_key(key) {
            KeyOutcome::Limit(key) => key,
            KeyOutcome::Respond(response) => return ResponseFuture::respond(response),
            KeyOutcome::Unlimited => {
                let request = Request::from_parts(parts, body);
                return ResponseFuture::inner(inner.call(request), Headers::new());
            }
        };
        match shared.limiter.check_now(key.as_str(), cost) {
            Some(outcome) => match shared.judge(&key, outcome) {
                Verdict::Pass { headers, delay } if delay.is_zero() => {
                    ResponseFuture::inner(inner.call(Request::from_parts(parts, body)), headers)
                }
                Verdict::Respond(response) => ResponseFuture::respond(response),
                pass_later => ResponseFuture::gate(inner, async move {
                    Gate::after(pass_later, parts, body).await
                }),
            },
            None => {
                let shared = Arc::clone(shared);
                ResponseFuture::gate(inner, async move {
                    decide_async(&shared, key, cost, parts, body).await
                })
            }
        }
    }
}

async fn decide_async<B: Backend, K, ReqBody>(
    shared: &Shared<B, K>,
    key: crate::key::Key,
    cost: u64,
    parts: http::request::Parts,
    body: ReqBody,
) -> Gate<ReqBody> {
    let outcome = tokio::time::timeout(shared.timeout, shared.limiter.check(key.as_str(), cost))
        .await
        .unwrap_or_else(|_| Err(timed_out(shared.timeout)));
    Gate::after(shared.judge(&key, outcome), parts, body).await
}
