//! What decides: a [`Policy`] turns a request's head into a [`Verdict`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response, StatusCode};

use super::headers::{Headers, problem, rate_limit_headers, retry_after_secs};
use super::{
    CostFn, HeaderStyle, OnBackendError, OnDelay, OnMissingKey, QUOTA_EXCEEDED, RejectFn, Rejection,
};
use crate::backend::{Backend, BackendError, BackendErrorKind};
use crate::decision::Decision;
use crate::key::{Key, KeyError, KeyExtractor};
use crate::limiter::{Error, Limiter};
use crate::quota_set::QuotaSet;

mod sealed {
    pub trait Sealed {}
}

/// Decides what becomes of each request. Implemented by [`LimitPolicy`]
/// (one limiter and key) and, with the `rules` feature, by the rules policy;
/// sealed, because the [`Verdict`] it returns is the layer's own.
pub trait Policy: sealed::Sealed + Send + Sync + 'static {
    /// The verdict, if it can be reached without waiting. Returning `None`
    /// must have changed nothing, since [`decide`](Policy::decide) follows.
    fn decide_now(&self, parts: &Parts) -> Option<Verdict>;

    /// The verdict, waiting for keys and backends as needed.
    fn decide<'a>(&'a self, parts: &'a Parts) -> impl Future<Output = Verdict> + Send + 'a;
}

/// What becomes of a request: pass it on (maybe after a delay, adding
/// headers), or answer it.
pub struct Verdict(pub(crate) VerdictKind);

pub(crate) enum VerdictKind {
    Pass { headers: Headers, delay: Duration },
    Respond(Response<Bytes>),
}

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            VerdictKind::Pass { delay, .. } => {
                f.debug_struct("Pass").field("delay", delay).finish()
            }
            VerdictKind::Respond(r) => f.debug_tuple("Respond").field(&r.status()).finish(),
        }
    }
}

impl Verdict {
    pub(crate) fn pass(headers: Headers) -> Self {
        Verdict(VerdictKind::Pass {
            headers,
            delay: Duration::ZERO,
        })
    }

    pub(crate) fn respond(response: Response<Bytes>) -> Self {
        Verdict(VerdictKind::Respond(response))
    }

    /// Whether the request is answered by the layer rather than passed on.
    pub fn is_response(&self) -> bool {
        matches!(self.0, VerdictKind::Respond(_))
    }

    #[cfg(feature = "rules")]
    /// Combines the verdicts of several limits on one request: the first
    /// response wins; otherwise the request passes after the longest delay
    /// with every limit's headers.
    pub(crate) fn and(self, other: Verdict) -> Verdict {
        match (self.0, other.0) {
            (VerdictKind::Respond(r), _) | (_, VerdictKind::Respond(r)) => Verdict::respond(r),
            (
                VerdictKind::Pass { headers, delay },
                VerdictKind::Pass {
                    headers: more,
                    delay: later,
                },
            ) => {
                let mut headers = headers;
                headers.extend(more);
                Verdict(VerdictKind::Pass {
                    headers,
                    delay: delay.max(later),
                })
            }
        }
    }
}

/// How decisions are told to clients, and what failures mean.
#[derive(Clone, Default)]
pub(crate) struct Signals {
    pub header_style: HeaderStyle,
    pub on_backend_error: OnBackendError,
    pub on_delay: OnDelay,
    pub rejection: Option<Arc<RejectFn>>,
}

impl Signals {
    /// Turns the limiter's answer into what happens to the request. The one
    /// place that decides, whatever the policy and path.
    pub(crate) fn judge(
        &self,
        quotas: &QuotaSet,
        key: &Key,
        outcome: Result<Decision, Error>,
    ) -> Verdict {
        let decision = match outcome {
            Ok(decision) => decision,
            Err(error) => return self.failed(key, &error),
        };
        let mut headers = rate_limit_headers(self.header_style, quotas, &decision);
        if decision.allowed() {
            if decision.exceeded() {
                tracing::info!(key = %key, set = quotas.name(), "shadow quota would have refused the request");
            }
            let delay = decision.delay();
            if delay.is_zero() || self.on_delay == OnDelay::Wait {
                return Verdict(VerdictKind::Pass { headers, delay });
            }
            let wait = retry_after_secs(delay);
            headers.push((http::header::RETRY_AFTER, HeaderValue::from(wait)));
            let detail = format!("Queued; retry in {wait} seconds.");
            let response = problem(StatusCode::TOO_MANY_REQUESTS, QUOTA_EXCEEDED, &detail, &[]);
            return Verdict::respond(with_headers(response, headers));
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
        Verdict::respond(with_headers(response, headers))
    }

    fn failed(&self, key: &Key, error: &Error) -> Verdict {
        match error {
            Error::CostTooHigh { .. } => {
                tracing::error!(key = %key, %error, "rate-limit cost misconfigured")
            }
            _ => {
                static UNDECIDED: crate::log_limit::LogLimit = crate::log_limit::LogLimit::new();
                if let Some(more) = UNDECIDED.admit() {
                    tracing::warn!(key = %key, %error, policy = ?self.on_backend_error, "rate limiter could not decide{more}")
                }
            }
        }
        match self.on_backend_error {
            OnBackendError::Allow => Verdict::pass(Headers::new()),
            OnBackendError::Reject => Verdict::respond(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "about:blank",
                "The rate limiter is unavailable.",
                &[],
            )),
        }
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

/// What a request's key means for it. The verdict is large because its
/// headers are kept inline, which saves an allocation per request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum KeyOutcome {
    /// Limit it under this key.
    Limit(Key),
    /// Let it through unlimited, or answer it, without asking the limiter.
    Settled(Verdict),
}

/// The longest key accepted by default, in bytes.
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 256;

/// Checks an extracted key against the length limit and the missing-key
/// policy.
pub(crate) fn admit_key(
    key: Result<Key, KeyError>,
    max_len: usize,
    policy: OnMissingKey,
) -> KeyOutcome {
    let error = match key {
        Ok(key) if key.as_str().len() <= max_len => return KeyOutcome::Limit(key),
        Ok(key) => KeyError::TooLong {
            len: key.as_str().len(),
            max: max_len,
        },
        Err(e) => e,
    };
    match policy {
        OnMissingKey::Allow => {
            tracing::debug!(%error, "no rate-limit key; request passes unlimited");
            KeyOutcome::Settled(Verdict::pass(Headers::new()))
        }
        OnMissingKey::Reject => {
            if error.status().is_server_error() {
                tracing::error!(%error, "no rate-limit key");
            } else {
                tracing::debug!(%error, "no rate-limit key");
            }
            let detail = format!("No rate-limit key: {error}.");
            KeyOutcome::Settled(Verdict::respond(problem(
                error.status(),
                "about:blank",
                &detail,
                &[],
            )))
        }
    }
}

/// Asks the limiter, within `timeout` when the backend must be awaited.
pub(crate) async fn check_within<B: Backend>(
    limiter: &Limiter<B>,
    key: &Key,
    cost: u64,
    timeout: Duration,
) -> Result<Decision, Error> {
    if let Some(outcome) = limiter.check_now(key.as_str(), cost) {
        return outcome;
    }
    tokio::time::timeout(timeout, limiter.check(key.as_str(), cost))
        .await
        .unwrap_or_else(|_| {
            Err(Error::Backend(BackendError::new(
                BackendErrorKind::Timeout,
                format!("no answer within {timeout:?}"),
            )))
        })
}

/// One limiter, one key extractor: what [`RateLimitLayer::new`](super::RateLimitLayer::new)
/// and its builder make.
pub struct LimitPolicy<B, K> {
    pub(crate) limiter: Limiter<B>,
    pub(crate) key: K,
    pub(crate) signals: Signals,
    pub(crate) on_missing_key: OnMissingKey,
    pub(crate) timeout: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) cost: Option<Arc<CostFn>>,
}

impl<B, K> LimitPolicy<B, K> {
    /// The limiter.
    pub fn limiter(&self) -> &Limiter<B> {
        &self.limiter
    }

    fn cost(&self, parts: &Parts) -> u64 {
        self.cost.as_ref().map_or(1, |f| f(parts))
    }
}

impl<B, K> fmt::Debug for LimitPolicy<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitPolicy")
            .field("quotas", &self.limiter.quotas().name())
            .field("header_style", &self.signals.header_style)
            .finish_non_exhaustive()
    }
}

impl<B, K> sealed::Sealed for LimitPolicy<B, K> {}

impl<B: Backend, K: KeyExtractor> Policy for LimitPolicy<B, K> {
    fn decide_now(&self, parts: &Parts) -> Option<Verdict> {
        if !self.limiter.backend().decides_now() {
            return None;
        }
        let key = self.key.extract(parts).into_ready().ok()?;
        let key = match admit_key(key, self.max_key_len, self.on_missing_key) {
            KeyOutcome::Limit(key) => key,
            KeyOutcome::Settled(verdict) => return Some(verdict),
        };
        let outcome = self.limiter.check_now(key.as_str(), self.cost(parts))?;
        Some(self.signals.judge(self.limiter.quotas(), &key, outcome))
    }

    async fn decide(&self, parts: &Parts) -> Verdict {
        let key = self.key.extract(parts).await;
        let key = match admit_key(key, self.max_key_len, self.on_missing_key) {
            KeyOutcome::Limit(key) => key,
            KeyOutcome::Settled(verdict) => return verdict,
        };
        let outcome = check_within(&self.limiter, &key, self.cost(parts), self.timeout).await;
        self.signals.judge(self.limiter.quotas(), &key, outcome)
    }
}

#[cfg(feature = "rules")]
pub(crate) use sealed::Sealed;
