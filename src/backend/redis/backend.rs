//! The Redis backend: one script call per decision, with the denial cache,
//! leases, the circuit breaker and the fallback around it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::breaker::Breaker;
use super::cache::DenialCache;
use super::config_error::RedisConfigError;
use super::connection::Connections;
use super::lease::{self, Lease};
use super::on_failure::OnFailure;
use super::script::{self};
use super::stats::{Counters, RedisMetrics, RedisStats};
use crate::backend::{Backend, BackendError, CheckRequest, GiveBackRequest, Reserved};
use crate::clock::{Clock, Stopwatch, micros};
use crate::decision::Decision;
use crate::quota::Quota;
use crate::quota_set::QuotaSet;

/// With a test clock, Redis still expires keys on its own clock: keys are
/// kept this much longer than the test's time says, so a test whose clock
/// stands still does not see its state vanish.
mod call;

const TEST_CLOCK_EXPIRY_SLACK_MS: u64 = 60_000;

/// Rate-limit state in Redis, shared by every server that points at the same
/// Redis (or Redis Cluster) with the same key prefix.
///
/// It decides exactly as [`MemoryBackend`](crate::MemoryBackend) does (the same algorithms, written
/// in Lua and checked against the Rust ones by a shared test suite), so one
/// can replace the other without changing anything else.
///
/// - **One round trip per decision**, all quotas of a [`QuotaSet`] included:
///   one Lua script reads, decides and writes every quota's state atomically,
///   so servers never race between a read and a write. It is called by
///   `EVALSHA` and sent again with `EVAL` when Redis answers `NOSCRIPT` (after
///   a restart or `SCRIPT FLUSH`).
/// - **Redis's clock**: the script reads `TIME`, so the servers' clocks do
///   not matter.
/// - **Bounded memory**: every key expires when its state stops mattering
///   (a token bucket once full again, a window once over, a log once its
///   newest entry is a period old). A sliding log holds at most `limit`
///   entries; refused requests write nothing unless the quota counts them.
/// - **Cluster-ready**: the keys of one decision are
///   `<prefix>{<client key>}:<state id>`, one hash tag, so one slot. In the
///   client key, `{`, `}` and `%` are percent-encoded so clients cannot move
///   or void the tag.
/// - **Failures**: each call has a timeout (50 ms by default). A failure
///   returns an error ([`OnFailure::Error`], for the caller's own fail-open or
///   fail-closed policy) or is decided locally by a [`MemoryBackend`](crate::MemoryBackend)
///   ([`OnFailure::Fallback`]). A [`CircuitBreaker`](super::CircuitBreaker) stops calling Redis
///   after repeated failures and probes it again later, so an outage costs
///   no waiting once noticed. Failures are logged with `tracing::warn!` and
///   counted in [`stats`](RedisBackend::stats); a Redis that refuses the
///   scripts (see [`probe`](RedisBackend::probe)) with `tracing::error!`.
/// - **Denial cache**: a key Redis refused stays refused locally until its
///   retry-after has passed, without asking Redis (on by default).
///
/// Connections: one multiplexed connection carries every check, pipelined.
/// It is taken out of the pool for good (the pool may make another in its
/// place) and replaced by another when it fails. Getting a pooled connection
/// per check would cost deadpool's health-check `PING`: a second round trip.
///
/// Needs Redis 5 or later (tested with Redis 7.0 and 8.2 and Valkey 9.1)
/// or a Redis Cluster of those.
///
/// Clones share the connection, the breaker, the cache and the counters.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::{Limiter, OnFailure, MemoryBackend, Quota, QuotaSet, RedisBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::from_url("redis://127.0.0.1:6379")
///     .prefix("myapp:rl:")
///     .timeout(Duration::from_millis(50))
///     .on_failure(OnFailure::Fallback(MemoryBackend::new()))
///     .build()?;
/// // A set name: every server using it counts under it.
/// let api = QuotaSet::new("api", [Quota::gcra(100, Duration::from_secs(60)).build()?])?;
/// let limiter = Limiter::new(backend, api);
/// let decision = limiter.check("user:42", 1).await?;
/// println!("allowed: {}", decision.allowed());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    pub(super) inner: Arc<Inner>,
}

/// What the clones of one backend share; made by the builder.
pub(super) struct Inner {
    /// Shared with the slots and pacers made [`on`](super::RedisSlots::on) it.
    pub(super) connections: Arc<Connections>,
    pub(super) prefix: Box<str>,
    pub(super) timeout: Duration,
    pub(super) on_failure: OnFailure,
    pub(super) breaker: Breaker,
    /// Denials and leases; `None` when both are off.
    pub(super) cache: Option<DenialCache>,
    pub(super) lease: Option<lease::Policy>,
    pub(super) clock: Option<Arc<dyn Clock>>,
    /// The zero of the local clock the denial cache runs on: the CPU
    /// counter, as a few instructions a read matter on a lease's path.
    pub(super) started: Stopwatch,
    pub(super) counters: Counters,
    pub(super) metrics: RedisMetrics,
}

impl RedisBackend {
    pub(super) fn new(inner: Inner) -> Self {
        RedisBackend {
            inner: Arc::new(inner),
        }
    }

    /// Its connection, for the slots and pacers made on it.
    pub(crate) fn connections(&self) -> Arc<Connections> {
        Arc::clone(&self.inner.connections)
    }

    /// What its keys start with (a rules file's slots start theirs so).
    #[cfg(feature = "rules")]
    pub(crate) fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// How long a call waits for Redis (a rules file's slots wait as long).
    #[cfg(feature = "rules")]
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }
}

impl RedisBackend {
    /// What the backend did so far.
    pub fn stats(&self) -> RedisStats {
        self.inner.counters.stats(&self.inner.breaker)
    }

    /// Runs the rate-limit scripts once on Redis, on keys of their own under
    /// the prefix (expiring within seconds), with every algorithm's commands:
    /// for calling before serving. A Redis that refuses them (the user's ACL
    /// lacks a command, `EVALSHA` renamed away, no Lua engine, full under
    /// `noeviction`) is an error of kind
    /// [`Misconfigured`](crate::backend::BackendErrorKind::Misconfigured) saying what to
    /// fix; a reply out of bounds is [`Protocol`](crate::backend::BackendErrorKind::Protocol);
    /// a Redis that cannot be reached is `Timeout` or `Unavailable`. Neither
    /// the circuit breaker, the denial cache nor the failure policy takes
    /// part, and nothing is counted in [`stats`](RedisBackend::stats)
    /// but script loads.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = tollgate::RedisBackend::from_url("redis://127.0.0.1:6379").build()?;
    /// backend.probe().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn probe(&self) -> Result<(), BackendError> {
        super::probe::run(&self.inner).await
    }

    /// The Redis keys that hold `key`'s state for `quotas`, one per quota in
    /// order: for inspecting Redis by hand.
    pub fn redis_keys(&self, key: &str, quotas: &QuotaSet) -> Vec<String> {
        script::redis_keys(&self.inner.prefix, key, quotas)
    }

    /// Whether leases are on and apply to every quota of `quotas` (none is a
    /// sliding log or a leaky bucket, which need every arrival, nor elastic,
    /// whose answer depends on the load at each request). Sets that
    /// fail it are decided one request at a time, as with leases off; the
    /// rules and the gateway refuse them when leases are on.
    pub fn supports_leases(&self, quotas: &QuotaSet) -> Result<(), RedisConfigError> {
        if self.inner.lease.is_none() {
            return Ok(());
        }
        if let Some(q) = unleasable(quotas) {
            return Err(RedisConfigError::LeaseUnsupported {
                quota: q.name().to_owned(),
                algorithm: q.algorithm(),
            });
        }
        match quotas.quotas().iter().find(|q| q.params.elastic_margin > 0) {
            None => Ok(()),
            Some(q) => Err(RedisConfigError::LeaseElastic {
                quota: q.name().to_owned(),
            }),
        }
    }

    /// The local cache, for a set it may serve (not one counting refused
    /// attempts, which Redis must all see, nor an elastic one), and the
    /// set's id in it.
    pub(super) fn cache_for(&self, quotas: &QuotaSet) -> Option<(&DenialCache, u64)> {
        let cache = self.inner.cache.as_ref()?;
        Some((cache, cache_id(quotas)?))
    }
}

/// The first quota of `quotas` whose algorithm needs every arrival and so
/// cannot be leased.
fn unleasable(quotas: &QuotaSet) -> Option<&Quota> {
    quotas
        .quotas()
        .iter()
        .find(|q| !Lease::leases(q.algorithm()))
}

/// What tells one quota set's cached denials from another's: the state ids,
/// and which quotas are shadows (which the state ids leave out, and which
/// change what is refused). `None` for a set counting refused attempts or
/// holding an elastic quota, which is never cached. One pass, and a
/// multiply per quota rather than a hasher: the state ids are hashes
/// already, and this runs on every decision made from a lease.
fn cache_id(quotas: &QuotaSet) -> Option<u64> {
    const MIX: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut id = MIX;
    for (q, &state) in quotas.quotas().iter().zip(quotas.state_ids()) {
        // Redis must see every refused attempt that counts; and an elastic
        // quota's answer depends on the load at each request, so a denial
        // or lease of one moment says nothing of the next.
        if q.params.count_rejected || q.params.elastic_margin > 0 {
            return None;
        }
        // A quota counting requests spends other units than the set's
        // cost: a lease of units means nothing to it.
        if q.counts() == crate::Counts::Requests {
            return None;
        }
        id = (id.rotate_left(23) ^ state ^ u64::from(q.params.shadow)).wrapping_mul(MIX);
    }
    Some(id)
}

impl Inner {
    /// The time the script is given (`None`: Redis's own) and the expiry
    /// slack that goes with it.
    fn script_time(&self) -> (Option<u64>, u64) {
        let now = self.clock.as_ref().map(|c| c.now().as_micros());
        let slack = if now.is_some() {
            TEST_CLOCK_EXPIRY_SLACK_MS
        } else {
            0
        };
        (now, slack)
    }

    /// Microseconds on the clock the denial cache runs on: the test clock if
    /// set, else a monotonic clock.
    fn local_now(&self) -> u64 {
        match &self.clock {
            Some(c) => c.now().as_micros(),
            None => micros(self.started.elapsed()),
        }
    }
}

impl Backend for RedisBackend {
    async fn check(&self, request: CheckRequest<'_>) -> Result<Decision, BackendError> {
        self.decide(request).await.map(Reserved::into_decision)
    }

    fn reserve<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Reserved, BackendError>> + Send + 'a {
        self.decide(request)
    }

    fn give_back<'a>(
        &'a self,
        request: GiveBackRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        self.give_back_reserved(request)
    }

    fn charge<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        self.charge_usage(request)
    }

    /// With leases on: the decision when this process can make it alone,
    /// from a lease or a remembered denial (most decisions of a hot key are
    /// made here), else `Later`. Without leases, `Never`: every decision is
    /// Redis's.
    fn check_now(&self, request: CheckRequest<'_>) -> crate::backend::Now {
        if self.inner.lease.is_none() {
            return crate::backend::Now::Never;
        }
        // A set no lease can serve (it counts refusals, say) still says
        // `Later`, not `Never`: the other sets of the same rules may lease.
        let Some((cache, set)) = self.cache_for(request.quotas) else {
            return crate::backend::Now::Later;
        };
        let now = self.inner.local_now();
        let (key, quotas, cost) = (request.key, request.quotas, request.cost);
        match cache.get(set, key, quotas, cost, request.commit, now) {
            Some(hit) => crate::backend::Now::Decided(Ok(self.hit(hit).into_decision())),
            None => crate::backend::Now::Later,
        }
    }

    fn reset<'a>(
        &'a self,
        key: &'a str,
        quotas: &'a QuotaSet,
    ) -> impl Future<Output = Result<(), BackendError>> + Send + 'a {
        // Boxed for the reason `run` is.
        let reset: Pin<Box<dyn Future<Output = _> + Send + 'a>> =
            Box::pin(self.reset_key(key, quotas));
        reset
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn shared(&self) -> bool {
        true
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("RedisBackend")
            .field("cluster", &inner.connections.is_cluster())
            .field("prefix", &inner.prefix)
            .field("timeout", &inner.timeout)
            .field("on_failure", &inner.on_failure)
            .field("denial_cache", &inner.cache.is_some())
            .field("lease", &inner.lease)
            .field("test_clock", &inner.clock.is_some())
            .finish_non_exhaustive()
    }
}
