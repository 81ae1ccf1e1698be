//! The tower layer: `.layer(RateLimitLayer::new(limiter, key))`.

mod body;
mod future;
mod headers;
mod service;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response, StatusCode};
use tower_layer::Layer;

pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use headers::{HeaderStyle, QUOTA_EXCEEDED};
pub use service::RateLimit;

use crate::backend::{Backend, BackendError, BackendErrorKind};
use crate::decision::Decision;
use crate::key::{Key, KeyError, KeyExtractor};
use crate::limiter::{Error, Limiter};
use crate::quota_set::QuotaSet;
use headers::{Headers, problem, rate_limit_headers, retry_after_secs};

/// What to do with a request when the backend fails or does not answer in
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBackendError {
    /// Let it through, unlimited (the default: if unsure, do not limit).
    #[default]
    Allow,
    /// Answer 503 Service Unavailable.
    Reject,
}

/// What to do with a request whose key cannot be found (no such header, a
/// malformed `X-Forwarded-For`, a key over the length limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissingKey {
    /// Answer with the key error's status (400 when the request is at fault,
    /// 500 when the server is misconfigured) and a problem-details body. The
    /// default, so that a client cannot dodge its limit by sending a bad key.
    #[default]
    Reject,
    /// Let it through, unlimited.
    Allow,
}

/// What to do when a leaky-bucket quota admits a request with a delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDelay {
    /// Hold the request for the delay, then pass it on (the default): the
    /// inner service sees evenly spaced requests.
    #[default]
    Wait,
    /// Answer 429 at once with the delay as `Retry-After`. The request's
    /// place in the queue is spent; use a queue of one (`burst(1)`) to never
    /// delay instead.
    Reject,
}

type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
type RejectFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;

/// A refused request, for a custom response (see
/// [`RateLimitLayerBuilder::rejection_response`]).
#[derive(Debug)]
pub struct Rejection<'a> {
    /// The decision.
    pub decision: &'a Decision,
    /// The quotas, in the order of `decision.quotas()`.
    pub quotas: &'a QuotaSet,
    /// The key that was limited.
    pub key: &'a Key,
}

impl Rejection<'_> {
    /// The names of the quotas that refused.
    pub fn violated(&self) -> Vec<&str> {
        self.decision
            .violated()
            .filter_map(|i| self.quotas.quotas().get(i).map(|q| q.name()))
            .collect()
    }
}

/// Rate-limits a tower service: picks each request's key, asks the limiter,
/// and answers refused requests with 429, `Retry-After` and rate-limit
/// headers.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use tollgate::{Limiter, MemoryBackend, Quota, RateLimitLayer};
/// use tollgate::key::PeerIp;
///
/// # fn main() -> Result<(), tollgate::QuotaError> {
/// let limiter = Limiter::new(MemoryBackend::new(), Quota::gcra(100, Duration::from_secs(60)).build()?);
/// let app: Router = Router::new()
///     .route("/", get(|| async { "hello" }))
///     .layer(RateLimitLayer::new(limiter, PeerIp::new()));
/// # Ok(())
/// # }
/// ```
pub struct RateLimitLayer<B, K> {
    shared: Arc<Shared<B, K>>,
}

impl<B, K> Clone for RateLimitLayer<B, K> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B, K> fmt::Debug for RateLimitLayer<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("quotas", &self.shared.limiter.quotas().name())
            .field("header_style", &self.shared.header_style)
            .finish_non_exhaustive()
    }
}

impl<B: Backend, K: KeyExtractor> RateLimitLayer<B, K> {
    /// Limits each request by `key` with `limiter`, with the defaults: IETF
    /// headers, cost 1, let requests through if the backend fails or takes
    /// over 100 ms, reject requests without a key.
    pub fn new(limiter: Limiter<B>, key: K) -> Self {
        RateLimitLayer::builder(limiter, key).build()
    }

    /// A builder for everything beyond the defaults.
    pub fn builder(limiter: Limiter<B>, key: K) -> RateLimitLayerBuilder<B, K> {
        RateLimitLayerBuilder {
            shared: Shared {
                limiter,
                key,
                header_style: HeaderStyle::default(),
                on_backend_error: OnBackendError::default(),
                on_missing_key: OnMissingKey::default(),
                on_delay: OnDelay::default(),
                timeout: Duration::from_millis(100),
                max_key_len: 256,
                cost: None,
                rejection: None,
            },
        }
    }
}

impl<S, B, K> Layer<S> for RateLimitLayer<B, K> {
    type Service = RateLimit<S, B, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.shared))
    }
}

/// Builds a [`RateLimitLayer`].
#[must_use = "call .build() to get the layer"]
pub struct RateLimitLayerBuilder<B, K> {
    shared: Shared<B, K>,
}

impl<B, K> fmt::Debug for RateLimitLayerBuilder<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .finish_non_exhaustive()
    }
}

impl<B: Backend, K: KeyExtractor> RateLimitLayerBuilder<B, K> {
    /// Which rate-limit headers responses carry ([`HeaderStyle::Ietf`] by default).
    pub fn header_style(mut self, style: HeaderStyle) -> Self {
        self.shared.header_style = style;
        self
    }

    /// What to do when the backend fails or times out ([`OnBackendError::Allow`] by default).
    pub fn on_backend_error(mut self, policy: OnBackendError) -> Self {
        self.shared.on_backend_error = policy;
        self
    }

    /// What to do with a request that has no key ([`OnMissingKey::Reject`] by default).
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.shared.on_missing_key = policy;
        self
    }

    /// What to do with a leaky-bucket delay ([`OnDelay::Wait`] by default).
    pub fn on_delay(mut self, policy: OnDelay) -> Self {
        self.shared.on_delay = policy;
        self
    }

    /// How long to wait for a backend that answers asynchronously (100 ms by
    /// default); past it, [`on_backend_error`](Self::on_backend_error)
    /// applies. The in-memory backend answers at once.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.shared.timeout = timeout;
        self
    }

    /// The longest key accepted, in bytes (256 by default); longer keys are a
    /// [`KeyError::TooLong`].
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.shared.max_key_len = bytes;
        self
    }

    /// What each request costs (1 by default), from its head: heavier
    /// operations spend more of the quota.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.shared.cost = Some(Arc::new(cost));
        self
    }

    /// Replaces the default 429 response (problem details). The layer still
    /// adds `Retry-After` and the rate-limit headers.
    pub fn rejection_response(
        mut self,
        respond: impl Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.shared.rejection = Some(Arc::new(respond));
        self
    }

    /// The layer.
    pub fn build(self) -> RateLimitLayer<B, K> {
        RateLimitLayer {
            shared: Arc::new(self.shared),
        }
    }
}

/// Everything a service shares with its clones.
pub(crate) struct Shared<B, K> {
    pub(crate) limiter: Limiter<B>,
    pub(crate) key: K,
    header_style: HeaderStyle,
    on_backend_error: OnBackendError,
    on_missing_key: OnMissingKey,
    on_delay: OnDelay,
    pub(crate) timeout: Duration,
    max_key_len: usize,
    cost: Option<Arc<CostFn>>,
    rejection: Option<Arc<RejectFn>>,
}

/// What a request's key means for it.
pub(crate) enum KeyOutcome {
    /// Limit it under this key.
    Limit(Key),
    /// It has no key, and passes unlimited.
    Unlimited,
    /// It has no key, and gets this answer.
    Respond(Response<Bytes>),
}

/// What becomes of a request.
pub(crate) enum Verdict {
    /// Pass it on, after `delay`, adding `headers` to the response.
    Pass { headers: Headers, delay: Duration },
    /// Answer it with this response.
    Respond(Response<Bytes>),
}

impl<B: Backend, K> Shared<B, K> {
    pub(crate) fn cost(&self, parts: &Parts) -> u64 {
        self.cost.as_ref().map_or(1, |f| f(parts))
    }

    /// What becomes of a request with this extraction result.
    pub(crate) fn admit_key(&self, key: Result<Key, KeyError>) -> KeyOutcome {
        let error = match key {
            Ok(key) if key.as_str().len() <= self.max_key_len => return KeyOutcome::Limit(key),
            Ok(key) => KeyError::TooLong {
                len: key.as_str().len(),
                max: self.max_key_len,
            },
            Err(e) => e,
        };
        match self.on_missing_key {
            OnMissingKey::Allow => {
                tracing::debug!(%error, "no rate-limit key; request passes unlimited");
                KeyOutcome::Unlimited
            }
            OnMissingKey::Reject => {
                if error.status().is_server_error() {
                    tracing::error!(%error, "no rate-limit key");
                } else {
                    tracing::debug!(%error, "no rate-limit key");
                }
                let detail = format!("No rate-limit key: {error}.");
                KeyOutcome::Respond(problem(error.status(), "about:blank", &detail, &[]))
            }
        }
    }

    /// Turns the limiter's answer into what happens to the request. The one
    /// place that decides, for the synchronous and the asynchronous path.
    pub(crate) fn judge(&self, key: &Key, outcome: Result<Decision, Error>) -> Verdict {
        let decision = match outcome {
            Ok(decision) => decision,
            Err(error) => return self.failed(key, &error),
        };
        let quotas = self.limiter.quotas();
        let mut headers = rate_limit_headers(self.header_style, quotas, &decision);
        if decision.allowed() {
            if decision.exceeded() {
                tracing::info!(key = %key, "shadow quota would have refused the request");
            }
            let delay = decision.delay();
            if delay.is_zero() || self.on_delay == OnDelay::Wait {
                return Verdict::Pass { headers, delay };
            }
            headers.push((
                http::header::RETRY_AFTER,
                HeaderValue::from(retry_after_secs(delay)),
            ));
            let detail = format!("Queued; retry in {} seconds.", retry_after_secs(delay));
            return Verdict::Respond(with_headers(
                problem(StatusCode::TOO_MANY_REQUESTS, QUOTA_EXCEEDED, &detail, &[]),
                headers,
            ));
        }
        let rejection = Rejection {
            decision: &decision,
            quotas,
            key,
        };
        tracing::debug!(key = %key, violated = ?rejection.violated(), "rate limited");
        let response = match &self.rejection {
            Some(respond) => respond(&rejection),
            None => {
                let wait = decision.retry_after().map_or(1, retry_after_secs);
                let detail = format!("Quota exceeded; retry in {wait} seconds.");
                problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    QUOTA_EXCEEDED,
                    &detail,
                    &rejection.violated(),
                )
            }
        };
        Verdict::Respond(with_headers(response, headers))
    }

    fn failed(&self, key: &Key, error: &Error) -> Verdict {
        match error {
            Error::CostTooHigh { .. } => {
                tracing::error!(key = %key, %error, "rate-limit cost misconfigured")
            }
            _ => {
                tracing::warn!(key = %key, %error, policy = ?self.on_backend_error, "rate limiter could not decide")
            }
        }
        match self.on_backend_error {
            OnBackendError::Allow => pass(),
            OnBackendError::Reject => Verdict::Respond(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "about:blank",
                "The rate limiter is unavailable.",
                &[],
            )),
        }
    }
}

/// The error of a backend that did not answer in time.
pub(crate) fn timed_out(timeout: Duration) -> Error {
    Error::Backend(BackendError::new(
        BackendErrorKind::Timeout,
        format!("no answer within {timeout:?}"),
    ))
}

fn pass() -> Verdict {
    Verdict::Pass {
        headers: Headers::new(),
        delay: Duration::ZERO,
    }
}

/// Adds headers the response does not set itself.
fn with_headers(mut response: Response<Bytes>, headers: Headers) -> Response<Bytes> {
    for (name, value) in headers {
        if !response.headers().contains_key(&name) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
