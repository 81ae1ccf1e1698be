//! The layer and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::request::Parts;
use tower_layer::Layer;

use super::count_status::CountStatus;
use super::headers::HeaderStyle;
use super::partition_key::PartitionKey;
use super::policy::{LimitPolicy, OnMissingKey, Policy};
use super::respond::{OnBackendError, OnDelay, Rejection};
use super::service::RateLimit;
use crate::backend::{Backend, MemoryBackend};
use crate::key::KeyExtractor;
use crate::layer::protect::concurrency::ConcurrencyQuota;
use crate::layer::protect::load::{LoadSignal, MeasuredLoad};
use crate::layer::protect::shed::Shedding;
use crate::limiter::Limiter;

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
///
/// The type parameter is the [`Policy`] that decides: one limiter and key
/// ([`LimitPolicy`], from [`new`](RateLimitLayer::new) and
/// [`builder`](RateLimitLayer::builder)), or a rules file (with the `rules`
/// feature).
pub struct RateLimitLayer<P> {
    policy: Arc<P>,
}

impl<P> Clone for RateLimitLayer<P> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            policy: Arc::clone(&self.policy),
        }
    }
}

impl<P> fmt::Debug for RateLimitLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer").finish_non_exhaustive()
    }
}

impl<P: Policy> RateLimitLayer<P> {
    /// A layer deciding by `policy`.
    pub fn from_policy(policy: P) -> Self {
        RateLimitLayer {
            policy: Arc::new(policy),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }
}

impl<B: Backend, K: KeyExtractor> RateLimitLayer<LimitPolicy<B, K>> {
    /// Limits each request by `key` with `limiter`, with the defaults: IETF
    /// headers, cost 1, let requests through if the backend fails or takes
    /// over 100 ms, reject requests without a key.
    pub fn new(limiter: Limiter<B>, key: K) -> Self {
        RateLimitLayer::builder(limiter, key).build()
    }

    /// A builder for everything beyond the defaults.
    pub fn builder(limiter: Limiter<B>, key: K) -> RateLimitLayerBuilder<B, K> {
        RateLimitLayerBuilder {
            policy: LimitPolicy::new(Some(limiter), key),
        }
    }
}

impl<K: KeyExtractor> RateLimitLayer<LimitPolicy<MemoryBackend, K>> {
    /// A builder for a layer with a concurrency quota and no rate quota: at
    /// most so many requests of one key under way, however many come one
    /// after another. (The backend type is only a placeholder: there are no
    /// rate quotas to keep, so `cost` and `count_status` change nothing.)
    ///
    /// ```
    /// use tollgate::RateLimitLayer;
    /// use tollgate::key::PeerIp;
    /// use tollgate::layer::ConcurrencyQuota;
    ///
    /// let layer = RateLimitLayer::concurrency_builder(ConcurrencyQuota::new(4)?, PeerIp::new())
    ///     .build();
    /// assert!(layer.policy().limiter().is_none());
    /// # Ok::<(), tollgate::QuotaError>(())
    /// ```
    pub fn concurrency_builder(
        quota: ConcurrencyQuota,
        key: K,
    ) -> RateLimitLayerBuilder<MemoryBackend, K> {
        let mut policy = LimitPolicy::new(None, key);
        policy.protect.concurrency = Some(quota);
        RateLimitLayerBuilder { policy }
    }
}

impl<S, P> Layer<S> for RateLimitLayer<P> {
    type Service = RateLimit<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.policy))
    }
}

/// Builds a [`RateLimitLayer`] for one limiter.
#[must_use = "call .build() to get the layer"]
pub struct RateLimitLayerBuilder<B, K> {
    policy: LimitPolicy<B, K>,
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
        self.policy.respond.header_style = style;
        self
    }

    /// Sends draft-11's `pk` on each `RateLimit` item: a keyed hash of the
    /// client key (never the key itself), so a client can tell its
    /// partitions apart. Off by default. Only with [`HeaderStyle::Ietf`].
    pub fn partition_key(mut self, pk: PartitionKey) -> Self {
        self.policy.respond.partition_key = Some(pk);
        self
    }

    /// Writes client keys as they are in the layer's log lines (a backend
    /// failure, a shadow quota's refusal) when `raw` is true. By default a
    /// line shows a keyed hash of the key instead, the one
    /// [`partition_key`](Self::partition_key) sends as `pk` (with its secret
    /// when one is set): keys are often API keys or addresses, which logs
    /// should not hold. Either way the value is quoted, so that a key
    /// cannot pose as other fields.
    pub fn log_raw_keys(mut self, raw: bool) -> Self {
        self.policy.respond.log_raw_keys = raw;
        self
    }

    /// What to do when the backend fails or times out ([`OnBackendError::Allow`] by default).
    pub fn on_backend_error(mut self, policy: OnBackendError) -> Self {
        self.policy.respond.on_backend_error = policy;
        self
    }

    /// What to do with a request that has no key ([`OnMissingKey::Reject`] by default).
    pub fn on_missing_key(mut self, policy: OnMissingKey) -> Self {
        self.policy.on_missing_key = policy;
        self
    }

    /// What to do with a leaky-bucket delay ([`OnDelay::Wait`] by default).
    pub fn on_delay(mut self, policy: OnDelay) -> Self {
        self.policy.respond.on_delay = policy;
        self
    }

    /// How long to wait for a backend that answers asynchronously (100 ms by
    /// default); past it, [`on_backend_error`](Self::on_backend_error)
    /// applies. The in-memory backend answers at once.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.policy.timeout = timeout;
        self
    }

    /// The longest key accepted, in bytes (256 by default); longer keys are a
    /// [`KeyError::TooLong`](crate::key::KeyError::TooLong).
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.policy.max_key_len = bytes;
        self
    }

    /// What each request costs (1 by default), from its head: heavier
    /// operations spend more of the quota.
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.policy.cost = Some(Arc::new(cost));
        self
    }

    /// Makes the limit response-aware: only responses with a status in
    /// `counts` (a failed login with `"401, 403"`, a server error with
    /// `"5xx"`) keep what they spent. Each request reserves its cost before
    /// it is served ([`Limiter::reserve`](crate::Limiter::reserve)), so
    /// requests in flight hold their units and no burst of concurrent
    /// requests gets past the limit; once the response is known, the
    /// reservation is kept if its status counts and given back if not. A
    /// response that never comes (the client left, the handler panicked)
    /// keeps it.
    pub fn count_status(mut self, counts: CountStatus) -> Self {
        self.policy.count_status = Some(counts);
        self
    }

    /// Takes each request's cost from its response, for usage known only
    /// once served (the tokens of an LLM answer): the estimate `from` says
    /// is reserved before the request, and the reservation is settled with
    /// the real cost when the response body ends (see
    /// [`CostFromResponse`](super::CostFromResponse)); the handler finds a
    /// [`Usage`](super::Usage) in the request's extensions to report it
    /// itself. Replaces [`cost`](Self::cost) and
    /// [`count_status`](Self::count_status) for this limit.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::HeaderName;
    /// use tollgate::key::HeaderKey;
    /// use tollgate::layer::{CostFromResponse, RateLimitLayer};
    /// use tollgate::{Limiter, MemoryBackend, Quota};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 100 000 tokens a minute per API key.
    /// let limiter = Limiter::new(
    ///     MemoryBackend::new(),
    ///     Quota::gcra(100_000, Duration::from_secs(60)).build()?,
    /// );
    /// let key = HeaderKey::new(HeaderName::from_static("x-api-key"));
    /// let tokens = RateLimitLayer::builder(limiter, key)
    /// .cost_from_response(CostFromResponse::header(
    ///     HeaderName::from_static("x-usage-total-tokens"),
    ///     500,
    /// ))
    /// .build();
    /// # let _ = tokens;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cost_from_response(mut self, from: super::CostFromResponse) -> Self {
        self.policy.cost_from_response = Some(Arc::new(from));
        self
    }

    /// Hands each passed request's [`Decision`](crate::Decision) to the
    /// inner service, in the request's extensions, so a handler can read
    /// what is left (axum: `Extension<Decision>`, or
    /// `request.extensions().get::<Decision>()`). Off by default: it costs
    /// a passed request an allocation or two. A response-aware limit
    /// ([`count_status`](Self::count_status)) hands the reservation's
    /// decision, made before the request and settled after it; a request passed without a decision
    /// (the backend failed under [`OnBackendError::Allow`], no key under
    /// [`OnMissingKey::Allow`]) carries none. Every passed request carries
    /// its [`Reason`](super::Reason) beside it (`Extension<Reason>`).
    pub fn decision_in_extensions(mut self, yes: bool) -> Self {
        self.policy.decision_in_extensions = yes;
        self
    }

    /// Counts admitted requests that used more than `share` of their
    /// quota (the one closest to refusing) in the `tollgate_near_limit_total`
    /// metric, labelled with the quota set's name; 0.8 by default. A share
    /// outside 0 to 1 (or NaN) is taken as the nearest bound (1 for NaN:
    /// nothing counts).
    pub fn near_limit(mut self, share: f64) -> Self {
        let share = if share.is_nan() {
            1.0
        } else {
            share.clamp(0.0, 1.0)
        };
        if let Some(limit) = self.policy.limit.as_mut().and_then(Arc::get_mut) {
            limit.set_near_limit(share);
        }
        self
    }

    /// Replaces the default 429 response (problem details), for rate and
    /// concurrency refusals alike ([`Rejection::refused`] tells them apart).
    /// The layer still adds `Retry-After` and the rate-limit headers the
    /// response does not set.
    pub fn rejection_response(
        mut self,
        respond: impl Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.policy.respond.rejection = Some(Arc::new(respond));
        self
    }

    /// Adds a concurrency quota: at most so many requests of one key under
    /// way at once, beside the rate quotas (a request must pass both).
    pub fn concurrency(mut self, quota: ConcurrencyQuota) -> Self {
        self.policy.protect.concurrency = Some(quota);
        self
    }

    /// Measures the wrapped service's load (requests in flight, latency)
    /// and uses it as the load signal for [`shed`](Self::shed), elastic
    /// concurrency quotas and elastic rate quotas
    /// ([`Mode::Elastic`](crate::Mode::Elastic)). Give clones of one [`MeasuredLoad`] to several
    /// layers to measure their services together.
    pub fn measure_load(mut self, load: MeasuredLoad) -> Self {
        self.policy.protect.measured = Some(load.clone());
        self.policy.protect.signal = Some(Arc::new(load));
        self
    }

    /// The load signal for [`shed`](Self::shed) and elastic concurrency and
    /// rate quotas, in place of the one [`measure_load`](Self::measure_load)
    /// sets (which still measures, for other layers to read).
    pub fn load_signal(mut self, signal: impl LoadSignal) -> Self {
        self.policy.protect.signal = Some(Arc::new(signal));
        self
    }

    /// Sheds load: while the load signal is high, answer 503 before looking
    /// at keys or quotas, lowest priority first. Needs a load signal
    /// ([`measure_load`](Self::measure_load) or
    /// [`load_signal`](Self::load_signal)); without one the load is unknown
    /// and every request is shed, as a check that cannot decide refuses.
    pub fn shed(mut self, shedding: Shedding) -> Self {
        self.policy.protect.shedding = Some(shedding);
        self
    }

    /// The layer.
    pub fn build(self) -> RateLimitLayer<LimitPolicy<B, K>> {
        RateLimitLayer::from_policy(self.policy)
    }
}
