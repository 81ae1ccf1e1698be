//! What decides: a [`Policy`] turns a request's head into a [`Verdict`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use super::count_status::CountStatus;
use super::limit::Limit;
use super::pipeline::{
    Check, DEFAULT_MAX_KEY_LEN, KeyOutcome, LimitRef, Pipeline, Waits, admit_key,
};
use super::reason::ReasonMetrics;
use super::respond::ResponsePolicy;
use super::usage::CostFromResponse;
use super::verdict::Verdict;
use crate::backend::Backend;
use crate::key::{Key, KeyError, KeyExtractor};
use crate::layer::protect::Protection;
use crate::limiter::Limiter;

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

pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// One limiter, one key extractor: what [`RateLimitLayer::new`](super::RateLimitLayer::new)
/// and its builder make (or no limiter: a concurrency quota alone, from
/// [`RateLimitLayer::concurrency_builder`](super::RateLimitLayer::concurrency_builder)).
pub struct LimitPolicy<B, K> {
    /// The rate quotas; `None` with only a concurrency quota.
    pub(crate) limit: Option<Arc<Limit<B>>>,
    pub(crate) key: K,
    pub(crate) respond: ResponsePolicy,
    pub(crate) on_missing_key: OnMissingKey,
    pub(crate) timeout: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) cost: Option<Arc<CostFn>>,
    /// Response-aware: reserve before the request, keep only for responses
    /// with these statuses.
    pub(crate) count_status: Option<CountStatus>,
    pub(crate) protect: Protection,
    /// Whether a passed request carries its decision in its extensions.
    pub(crate) decision_in_extensions: bool,
    pub(crate) reasons: ReasonMetrics,
    /// The cost known from the response: an estimate reserved, settled
    /// with the real cost when the response body ends.
    pub(crate) cost_from_response: Option<Arc<CostFromResponse>>,
    pub(crate) waits: Waits,
}

impl<B, K> LimitPolicy<B, K> {
    pub(crate) fn new(limiter: Option<Limiter<B>>, key: K) -> Self {
        LimitPolicy {
            limit: limiter.map(|l| Arc::new(Limit::new(l))),
            key,
            respond: ResponsePolicy::default(),
            on_missing_key: OnMissingKey::default(),
            timeout: Duration::from_millis(100),
            max_key_len: DEFAULT_MAX_KEY_LEN,
            cost: None,
            count_status: None,
            protect: Protection::default(),
            decision_in_extensions: false,
            reasons: ReasonMetrics::new(),
            cost_from_response: None,
            waits: Waits::default(),
        }
    }

    /// The limiter; `None` for a layer with only a concurrency quota.
    pub fn limiter(&self) -> Option<&Limiter<B>> {
        self.limit.as_ref().map(|l| &l.limiter)
    }

    fn cost(&self, parts: &Parts) -> u64 {
        if let Some(from) = &self.cost_from_response {
            return from.estimate(&parts.headers);
        }
        self.cost.as_ref().map_or(1, |f| f(parts))
    }

    /// The steps after the key, with this policy's settings.
    fn pipeline(&self) -> Pipeline<'_> {
        Pipeline {
            respond: &self.respond,
            protect: &self.protect,
            timeout: self.timeout,
            decisions: self.decision_in_extensions,
            reasons: &self.reasons,
            waits: &self.waits,
        }
    }

    /// The request's one check, or its verdict when its key settles it.
    #[allow(clippy::result_large_err)] // a verdict's headers are inline
    fn check(&self, key: Result<Key, KeyError>, parts: &Parts) -> Result<Check<'_, B>, Verdict> {
        let key = match admit_key(key, self.max_key_len, self.on_missing_key) {
            KeyOutcome::Limit(key) => key,
            KeyOutcome::Settled(verdict) => return Err(verdict),
        };
        Ok(Check {
            limit: self.limit.as_ref().map(LimitRef::Borrowed),
            watch: None,
            cost: if self.limit.is_some() {
                self.cost(parts)
            } else {
                1
            },
            key,
            count_status: self.count_status.as_ref(),
            cost_from_response: self.cost_from_response.as_ref(),
            concurrency: self.protect.concurrency.as_ref().map(|_| &self.protect),
        })
    }
}

impl<B, K> fmt::Debug for LimitPolicy<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitPolicy")
            .field("quotas", &self.limiter().map(|l| l.quotas().name()))
            .field("header_style", &self.respond.header_style)
            .finish_non_exhaustive()
    }
}

impl<B, K> sealed::Sealed for LimitPolicy<B, K> {}

impl<B: Backend, K: KeyExtractor> Policy for LimitPolicy<B, K> {
    fn decide_now(&self, parts: &Parts) -> Option<Verdict> {
        // Asked before the key is extracted, so that a request bound for
        // `decide` is not prepared twice.
        if self.waits.always() || self.count_status.is_some() {
            return None;
        }
        let pipeline = self.pipeline();
        if let Some(shed) = self.protect.shed(parts) {
            return Some(pipeline.settled(shed));
        }
        let key = self.key.extract(parts).into_ready().ok()?;
        match self.check(key, parts) {
            Ok(check) => pipeline.decide_one_now(&check),
            Err(settled) => Some(pipeline.settled(settled)),
        }
    }

    async fn decide(&self, parts: &Parts) -> Verdict {
        let pipeline = self.pipeline();
        if let Some(shed) = self.protect.shed(parts) {
            return pipeline.settled(shed);
        }
        let key = self.key.extract(parts).await;
        match self.check(key, parts) {
            Ok(check) => pipeline.decide(smallvec::smallvec![check]).await,
            Err(settled) => pipeline.settled(settled),
        }
    }
}

#[cfg(feature = "rules")]
pub(crate) use sealed::Sealed;
