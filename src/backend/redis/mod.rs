//! State in Redis, shared by every server of a fleet (the `redis` feature).

mod breaker;
mod cache;
mod concurrency;
mod lease;
mod script;

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use deadpool_redis::redis::{self, Cmd, ErrorKind, RedisError, ServerErrorKind};
use deadpool_redis::{PoolError, Runtime};

pub use breaker::CircuitBreaker;
pub use concurrency::RedisSlots;
pub use lease::Lease;

use super::{Backend, BackendError, BackendErrorKind, CheckRequest, MemoryBackend};
use crate::clock::{Clock, micros};
use crate::decision::Decision;
use crate::metrics::RedisMetrics;
use crate::quota_set::QuotaSet;
use breaker::{Breaker, Permit, ProbeGuard, Transition};
use cache::{DenialCache, Hit};
use script::{Ask, Reply};

/// With a test clock, Redis still expires keys on its own clock: keys are
/// kept this much longer than the test's time says, so a test whose clock
/// stands still does not see its state vanish.
const TEST_CLOCK_EXPIRY_SLACK_MS: u64 = 60_000;

/// Rate-limit state in Redis, shared by every server that points at the same
/// Redis (or Redis Cluster) with the same key prefix.
///
/// It decides exactly as [`MemoryBackend`] does (the same algorithms, written
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
///   fail-closed policy) or is decided locally by a [`MemoryBackend`]
///   ([`OnFailure::Fallback`]). A [`CircuitBreaker`] stops calling Redis
///   after repeated failures and probes it again later, so an outage costs
///   no waiting once noticed. Failures are logged with `tracing::warn!` and
///   counted in [`stats`](RedisBackend::stats).
/// - **Denial cache**: a key Redis refused stays refused locally until its
///   retry-after has passed, without asking Redis (on by default).
///
/// Connections: one multiplexed connection carries every check, pipelined.
/// It is taken out of the pool for good (the pool may make another in its
/// place) and replaced by another when it fails. Getting a pooled connection
/// per check would cost deadpool's health-check `PING`: a second round trip.
///
/// Needs Redis 5 or later (tested with 7.0) or a Redis Cluster of those.
///
/// Clones share the connection, the breaker, the cache and the counters.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::{Limiter, OnFailure, MemoryBackend, Quota, RedisBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::from_url("redis://127.0.0.1:6379")
///     .prefix("myapp:rl:")
///     .timeout(Duration::from_millis(50))
///     .on_failure(OnFailure::Fallback(MemoryBackend::new()))
///     .build()?;
/// let limiter = Limiter::new(backend, Quota::gcra(100, Duration::from_secs(60)).build()?);
/// let decision = limiter.check("user:42", 1).await?;
/// println!("allowed: {}", decision.allowed());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    /// The connection in use, and a number telling it from its successors.
    conn: Mutex<Option<(u64, Conn)>>,
    generation: AtomicU64,
    prefix: Box<str>,
    timeout: Duration,
    on_failure: OnFailure,
    breaker: Breaker,
    /// Denials and leases; `None` when both are off.
    cache: Option<DenialCache>,
    lease: Option<lease::Policy>,
    clock: Option<Arc<dyn Clock>>,
    /// The zero of the local clock the denial cache runs on.
    started: Instant,
    counters: Counters,
    metrics: RedisMetrics,
}

/// What to do when Redis cannot decide (timeout, connection failure, open
/// circuit breaker, unexpected answer).
///
/// The HTTP layer has its own policy for a backend's errors (let the request
/// through by default, or answer 503); [`OnFailure::Error`] leaves the choice
/// to it. To always admit or always refuse while Redis is down, keep
/// `Error` and set that policy on the layer (or match on the error when
/// calling [`Limiter`](crate::Limiter) directly).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum OnFailure {
    /// Return the error (kind [`Timeout`](BackendErrorKind::Timeout),
    /// [`Unavailable`](BackendErrorKind::Unavailable) or
    /// [`Protocol`](BackendErrorKind::Protocol)) and let the caller decide.
    #[default]
    Error,
    /// Decide with this in-memory backend instead: limits hold per server
    /// rather than fleet-wide until Redis is back.
    Fallback(MemoryBackend),
}

/// Counters of what a [`RedisBackend`] did since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Calls made to Redis (each one round trip, or two when the script had
    /// to be sent again).
    pub calls: u64,
    /// Calls that failed, timeouts included.
    pub failures: u64,
    /// Calls that failed by timing out.
    pub timeouts: u64,
    /// Checks refused at once because the circuit breaker was open.
    pub short_circuits: u64,
    /// Checks answered from the denial cache.
    pub cache_hits: u64,
    /// Checks admitted from a lease held here, without calling Redis.
    pub lease_hits: u64,
    /// Leases taken: calls that took more units than their request's cost.
    pub leases: u64,
    /// Checks decided by the fallback backend.
    pub fallbacks: u64,
    /// Times Redis did not know the script (`NOSCRIPT`) and was sent it.
    pub script_loads: u64,
    /// Failures in a row now (0 while Redis answers).
    pub consecutive_failures: u32,
    /// Whether the circuit breaker is open now.
    pub circuit_open: bool,
}

#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    failures: AtomicU64,
    timeouts: AtomicU64,
    short_circuits: AtomicU64,
    cache_hits: AtomicU64,
    lease_hits: AtomicU64,
    leases: AtomicU64,
    fallbacks: AtomicU64,
    script_loads: AtomicU64,
}

fn bump(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed) + 1
}

/// Where connections come from.
enum Source {
    Single(deadpool_redis::Pool),
    Cluster(deadpool_redis::cluster::Pool),
}

/// A connection that multiplexes concurrent calls.
#[derive(Clone)]
enum Conn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    async fn query(&mut self, cmd: &Cmd) -> redis::RedisResult<Vec<i64>> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

impl Source {
    /// A connection of the backend's own: taken out of the pool, so that
    /// nothing else the pool serves (a `MULTI`, a blocking `BLPOP`) shares
    /// it, and the pool makes another in its place.
    async fn connect(&self) -> Result<Conn, BackendError> {
        match self {
            Source::Single(pool) => {
                let c = pool.get().await.map_err(pool_error)?;
                Ok(Conn::Single(deadpool_redis::Connection::take(c)))
            }
            Source::Cluster(pool) => {
                let c = pool.get().await.map_err(pool_error)?;
                Ok(Conn::Cluster(deadpool_redis::cluster::Connection::take(c)))
            }
        }
    }
}

fn pool_error(e: PoolError) -> BackendError {
    match e {
        PoolError::Backend(e) => redis_error(e).0,
        PoolError::Timeout(_) => BackendError::new(
            BackendErrorKind::Timeout,
            "timed out waiting for a Redis connection from the pool",
        ),
        e => BackendError::new(BackendErrorKind::Unavailable, "no Redis connection").with_source(e),
    }
}

/// The kind of a Redis error, and whether the connection it came through
/// should be replaced.
fn redis_error(e: RedisError) -> (BackendError, bool) {
    let (kind, broken) = if e.is_timeout() {
        (BackendErrorKind::Timeout, true)
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound | ErrorKind::AuthenticationFailed
        )
    {
        (BackendErrorKind::Unavailable, true)
    } else if matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    ) || matches!(e.code(), Some("BUSY" | "OOM"))
    {
        // Redis is there but cannot serve writes now.
        (BackendErrorKind::Unavailable, false)
    } else {
        (BackendErrorKind::Protocol, false)
    };
    let message = match kind {
        BackendErrorKind::Protocol => "Redis refused the rate-limit script",
        _ => "Redis is unavailable",
    };
    (BackendError::new(kind, message).with_source(e), broken)
}

/// A poisoned lock only means a panic elsewhere; what it guards is intact.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl RedisBackend {
    /// A backend on the Redis at `url` (`redis://[user:password@]host:port[/db]`).
    pub fn from_url(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(SourceConfig::Url(url.into()))
    }

    /// A backend on an existing connection pool. The backend takes one
    /// connection out of it for its own use, and another whenever that one
    /// fails.
    pub fn from_pool(pool: deadpool_redis::Pool) -> RedisBackendBuilder {
        RedisBackendBuilder::new(SourceConfig::Pool(pool))
    }

    /// A backend on the Redis Cluster reachable at any of `urls` (some or all
    /// of its nodes).
    pub fn from_cluster_urls(
        urls: impl IntoIterator<Item = impl Into<String>>,
    ) -> RedisBackendBuilder {
        RedisBackendBuilder::new(SourceConfig::ClusterUrls(
            urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// A backend on an existing Redis Cluster connection pool.
    pub fn from_cluster_pool(pool: deadpool_redis::cluster::Pool) -> RedisBackendBuilder {
        RedisBackendBuilder::new(SourceConfig::ClusterPool(pool))
    }

    /// What the backend did so far.
    pub fn stats(&self) -> RedisStats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            calls: get(&c.calls),
            failures: get(&c.failures),
            timeouts: get(&c.timeouts),
            short_circuits: get(&c.short_circuits),
            cache_hits: get(&c.cache_hits),
            lease_hits: get(&c.lease_hits),
            leases: get(&c.leases),
            fallbacks: get(&c.fallbacks),
            script_loads: get(&c.script_loads),
            consecutive_failures: self.inner.breaker.consecutive_failures(),
            circuit_open: self.inner.breaker.is_open(),
        }
    }

    /// The Redis keys that hold `key`'s state for `quotas`, one per quota in
    /// order: for inspecting Redis by hand.
    pub fn redis_keys(&self, key: &str, quotas: &QuotaSet) -> Vec<String> {
        script::redis_keys(&self.inner.prefix, key, quotas)
    }

    /// Whether leases are on and apply to every quota of `quotas` (none is a
    /// sliding log or a leaky bucket, which need every arrival). Sets that
    /// fail it are decided one request at a time, as with leases off; the
    /// rules and the gateway refuse them when leases are on.
    pub fn supports_leases(&self, quotas: &QuotaSet) -> Result<(), RedisConfigError> {
        if self.inner.lease.is_none() {
            return Ok(());
        }
        match quotas
            .quotas()
            .iter()
            .find(|q| !Lease::leases(q.algorithm()))
        {
            None => Ok(()),
            Some(q) => Err(RedisConfigError::LeaseUnsupported {
                quota: q.name().to_owned(),
                algorithm: q.algorithm(),
            }),
        }
    }

    /// The local cache, for a set it may serve (not one counting refused
    /// attempts, which Redis must all see), and the set's id in it.
    fn cache_for(&self, quotas: &QuotaSet) -> Option<(&DenialCache, u64)> {
        let cache = self.inner.cache.as_ref()?;
        if quotas.quotas().iter().any(|q| q.params.count_rejected) {
            return None;
        }
        Some((cache, cache_id(quotas)))
    }

    /// A decision made here, counted.
    fn hit(&self, hit: Hit) -> Decision {
        match hit {
            Hit::Lease(d) => {
                bump(&self.inner.counters.lease_hits);
                d
            }
            Hit::Denial(d) => {
                bump(&self.inner.counters.cache_hits);
                self.inner.metrics.cache_hit();
                d
            }
        }
    }

    async fn decide(&self, request: CheckRequest<'_>) -> Result<Decision, BackendError> {
        let inner = &*self.inner;
        let quotas = request.quotas;
        let cache = self.cache_for(quotas);
        let mut ask = Ask {
            cost: request.cost,
            commit: request.commit,
            want: request.cost,
            give_back: None,
        };
        let mut leasing = None;
        if let Some((cache, set)) = cache {
            let (key, cost, commit) = (request.key, request.cost, request.commit);
            let policy = inner.lease.as_ref();
            let policy = policy.filter(|_| commit && self.supports_leases(quotas).is_ok());
            // While the key's lease call is out, wait for it (a few times,
            // within half the timeout) rather than call Redis too: with
            // many concurrent requests of a hot key, one call serves them.
            let deadline = tokio::time::Instant::now() + inner.timeout / 2;
            for round in 0..=LEASE_WAITS {
                let now = inner.local_now();
                if let Some(hit) = cache.get(set, key, quotas, cost, commit, now) {
                    return Ok(self.hit(hit));
                }
                let Some(policy) = policy else { break };
                let done = cache.lease_done(set, key).notified();
                let mut done = std::pin::pin!(done);
                done.as_mut().enable();
                let (lease_ask, ours) =
                    cache.lease_ask(set, key, cost, now, policy, micros(inner.timeout));
                ask = lease_ask;
                leasing = Some((policy, ours));
                if ours || round == LEASE_WAITS {
                    break;
                }
                if tokio::time::timeout_at(deadline, done).await.is_err() {
                    break;
                }
            }
        }
        // The key's lease call, if this is it, ends however this ends.
        let _lease_call = LeaseCall {
            cache: cache.filter(|_| matches!(leasing, Some((_, true)))),
            key: request.key,
        };
        let sent = inner.local_now();

        let permit = inner.breaker.permit();
        if permit == Permit::Refuse {
            let n = bump(&inner.counters.short_circuits);
            tracing::debug!(
                short_circuits = n,
                "tollgate: circuit open, Redis not called"
            );
            let e = BackendError::new(
                BackendErrorKind::Unavailable,
                "Redis failed repeatedly; the circuit breaker is open",
            );
            return self.fail(request, e).await;
        }
        let probe = permit == Permit::Probe;
        let mut guard = ProbeGuard {
            breaker: &inner.breaker,
            armed: probe,
        };
        bump(&inner.counters.calls);
        inner.metrics.call();
        let result = match tokio::time::timeout(inner.timeout, self.call(request, &ask)).await {
            Ok(result) => result,
            Err(_) => {
                bump(&inner.counters.timeouts);
                // A connection that stopped answering may be dead (a peer
                // gone without a reset): take a fresh one next time.
                inner.forget_connection(None);
                Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("Redis did not answer within {:?}", inner.timeout),
                ))
            }
        };
        guard.armed = false;

        match result {
            Ok(reply) => {
                if inner.breaker.success(probe) == Transition::Closed {
                    inner.metrics.circuit(false);
                    tracing::info!("tollgate: Redis answers again; circuit breaker closed");
                }
                if reply.spent > request.cost {
                    bump(&inner.counters.leases);
                }
                Ok(match cache {
                    Some((cache, set)) => {
                        let now = inner.local_now();
                        let (key, cost) = (request.key, request.cost);
                        cache.settle(set, key, quotas, cost, sent, now, &reply, leasing)
                    }
                    None => quotas.decision_from(&reply.verdicts),
                })
            }
            Err(e) => {
                let failures = bump(&inner.counters.failures);
                inner.metrics.failure();
                let transition = match e.kind() {
                    // Redis answered: it is up, whatever it said.
                    BackendErrorKind::Protocol => inner.breaker.success(probe),
                    _ => inner.breaker.failure(probe),
                };
                inner.metrics.circuit(inner.breaker.is_open());
                let consecutive = inner.breaker.consecutive_failures();
                static FAILED: crate::log_limit::LogLimit = crate::log_limit::LogLimit::new();
                if let Some(more) = FAILED.admit() {
                    tracing::warn!(
                        kind = ?e.kind(),
                        failures,
                        consecutive,
                        error = %e,
                        "tollgate: Redis rate-limit call failed{more}"
                    );
                }
                match transition {
                    Transition::Opened => tracing::warn!(
                        consecutive,
                        open_for = ?inner.breaker.open_for(),
                        "tollgate: circuit breaker opened; Redis will not be called until a probe succeeds"
                    ),
                    Transition::Reopened => tracing::warn!(
                        open_for = ?inner.breaker.open_for(),
                        "tollgate: probe failed; circuit breaker stays open"
                    ),
                    Transition::Closed | Transition::None => {}
                }
                self.fail(request, e).await
            }
        }
    }

    /// One round trip (two if the script must be sent again).
    async fn call(&self, request: CheckRequest<'_>, ask: &Ask) -> Result<Reply, BackendError> {
        let inner = &*self.inner;
        let quotas = request.quotas;
        let keys = script::redis_keys(&inner.prefix, request.key, quotas);
        let now = inner.clock.as_ref().map(|c| c.now().as_micros());
        let slack = if now.is_some() {
            TEST_CLOCK_EXPIRY_SLACK_MS
        } else {
            0
        };
        let args = script::arguments(quotas, now, ask, slack);
        let (mut conn, fresh) = inner.connection().await?;
        let reply = match inner.evaluate(&mut conn, &keys, &args).await {
            Err((_, true)) if !fresh => {
                // The connection kept from earlier checks died (Redis
                // restarted, say): try once more on a new one. If the dead
                // one had run the script before failing, this spends twice,
                // which errs on the strict side.
                inner.forget_connection(Some(conn.0));
                let (mut conn, _) = inner.connection().await?;
                inner.evaluate(&mut conn, &keys, &args).await
            }
            reply => reply,
        };
        let reply = reply.map_err(|(e, _)| e)?;
        script::reply(&reply, quotas.quotas().len())
            .map_err(|m| BackendError::new(BackendErrorKind::Protocol, m))
    }

    async fn fail(
        &self,
        request: CheckRequest<'_>,
        error: BackendError,
    ) -> Result<Decision, BackendError> {
        match &self.inner.on_failure {
            OnFailure::Error => Err(error),
            OnFailure::Fallback(local) => {
                bump(&self.inner.counters.fallbacks);
                local.check(request).await
            }
        }
    }
}

/// Ends a key's lease call when dropped: settled, failed or cancelled, the
/// requests waiting for it wake and look again.
struct LeaseCall<'a> {
    cache: Option<(&'a DenialCache, u64)>,
    key: &'a str,
}

impl Drop for LeaseCall<'_> {
    fn drop(&mut self) {
        if let Some((cache, set)) = self.cache {
            cache.end_lease_call(set, self.key);
        }
    }
}

/// What tells one quota set's cached denials from another's: the state ids,
/// and which quotas are shadows (which the state ids leave out, and which
/// change what is refused).
fn cache_id(quotas: &QuotaSet) -> u64 {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    quotas.state_ids().hash(&mut h);
    for q in quotas.quotas() {
        q.params.shadow.hash(&mut h);
    }
    h.finish()
}

impl Inner {
    /// Microseconds on the clock the denial cache runs on: the test clock if
    /// set, else a monotonic clock.
    fn local_now(&self) -> u64 {
        match &self.clock {
            Some(c) => c.now().as_micros(),
            None => micros(self.started.elapsed()),
        }
    }

    /// Runs the script on `conn` (its generation and connection), sending
    /// it again if Redis lost it. On failure, says whether the connection is
    /// broken, and forgets it if so.
    async fn evaluate(
        &self,
        conn: &mut (u64, Conn),
        keys: &[String],
        args: &[String],
    ) -> Result<Vec<i64>, (BackendError, bool)> {
        let reply = match conn.1.query(&script::command(false, keys, args)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let n = bump(&self.counters.script_loads);
                tracing::debug!(
                    script_loads = n,
                    "tollgate: Redis lost the script; sending it"
                );
                conn.1.query(&script::command(true, keys, args)).await
            }
            reply => reply,
        };
        reply.map_err(|e| {
            let (e, broken) = redis_error(e);
            if broken {
                self.forget_connection(Some(conn.0));
            }
            (e, broken)
        })
    }

    fn cached_connection(&self) -> Option<(u64, Conn)> {
        lock(&self.conn).clone()
    }

    /// The connection in use (its generation and itself), and whether it
    /// was just made.
    async fn connection(&self) -> Result<((u64, Conn), bool), BackendError> {
        if let Some(c) = self.cached_connection() {
            return Ok((c, false));
        }
        let conn = self.source.connect().await?;
        let mut slot = lock(&self.conn);
        // Another check may have connected meanwhile: share its connection.
        if let Some(c) = &*slot {
            return Ok((c.clone(), true));
        }
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *slot = Some((generation, conn.clone()));
        Ok(((generation, conn), true))
    }

    /// Drops the connection in use (only if it is still `generation`'s).
    fn forget_connection(&self, generation: Option<u64>) {
        let mut slot = lock(&self.conn);
        if generation.is_none_or(|g| slot.as_ref().is_some_and(|(current, _)| *current == g)) {
            *slot = None;
        }
    }
}

impl Backend for RedisBackend {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        self.decide(request)
    }

    /// With leases on: the decision when this process can make it alone,
    /// from a lease or a remembered denial; `None` when Redis must be asked.
    fn check_now(&self, request: CheckRequest<'_>) -> Option<Result<Decision, BackendError>> {
        self.inner.lease.as_ref()?;
        let (cache, set) = self.cache_for(request.quotas)?;
        let now = self.inner.local_now();
        let (key, quotas, cost) = (request.key, request.quotas, request.cost);
        let hit = cache.get(set, key, quotas, cost, request.commit, now)?;
        Some(Ok(self.hit(hit)))
    }

    /// True with leases on: most decisions of a hot key are then made here.
    fn decides_now(&self) -> bool {
        self.inner.lease.is_some()
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("RedisBackend")
            .field("cluster", &matches!(inner.source, Source::Cluster(_)))
            .field("prefix", &inner.prefix)
            .field("timeout", &inner.timeout)
            .field("on_failure", &inner.on_failure)
            .field("denial_cache", &inner.cache.is_some())
            .field("lease", &inner.lease)
            .field("test_clock", &inner.clock.is_some())
            .finish_non_exhaustive()
    }
}

enum SourceConfig {
    Url(String),
    Pool(deadpool_redis::Pool),
    ClusterUrls(Vec<String>),
    ClusterPool(deadpool_redis::cluster::Pool),
}

/// Configures a [`RedisBackend`]; start from [`RedisBackend::from_url`] or
/// one of its siblings.
#[must_use = "call .build() to get the backend"]
pub struct RedisBackendBuilder {
    source: SourceConfig,
    prefix: String,
    timeout: Duration,
    on_failure: OnFailure,
    breaker: CircuitBreaker,
    denial_cache: usize,
    lease: Lease,
    lease_slice: Duration,
    lease_lifetime: Duration,
    clock: Option<Arc<dyn Clock>>,
}

/// How many lease calls of its key a request waits for before calling
/// Redis itself.
const LEASE_WAITS: usize = 4;

/// Keys remembered for their leases when the denial cache is off.
const LEASE_KEYS: usize = 10_000;

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .field("circuit_breaker", &self.breaker)
            .field("denial_cache", &self.denial_cache)
            .field("lease", &self.lease)
            .field("lease_slice", &self.lease_slice)
            .field("lease_lifetime", &self.lease_lifetime)
            .field("test_clock", &self.clock.is_some())
            .finish_non_exhaustive()
    }
}

impl RedisBackendBuilder {
    fn new(source: SourceConfig) -> Self {
        RedisBackendBuilder {
            source,
            prefix: "tollgate:".to_owned(),
            timeout: Duration::from_millis(50),
            on_failure: OnFailure::Error,
            breaker: CircuitBreaker::default(),
            denial_cache: 10_000,
            lease: Lease::Off,
            lease_slice: Duration::from_millis(10),
            lease_lifetime: Duration::from_millis(50),
            clock: None,
        }
    }

    /// What every key starts with (`tollgate:` by default). Servers that
    /// should share limits use the same prefix; braces are not allowed, as
    /// they would change the keys' hash tag.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one check may wait for Redis, connecting included (50 ms by
    /// default). Past it the check fails with
    /// [`BackendErrorKind::Timeout`], and [`OnFailure`] applies. With
    /// [leases](Self::lease), a check may first wait up to half of it for
    /// its key's lease call to come back.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What to do when Redis cannot decide ([`OnFailure::Error`] by default).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// When to stop calling a failing Redis, and when to try again (5
    /// failures in a row, 1 s by default).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = breaker;
        self
    }

    /// How many refused keys to remember locally (10 000 by default; 0 turns
    /// the denial cache off). A remembered key is refused without calling
    /// Redis until its retry-after has passed, so a client hammering a
    /// limit costs Redis a few calls, not one per request. Decisions served
    /// from the cache report the numbers Redis gave, with the waits
    /// shortened by the time passed. Quota sets that count refused attempts
    /// (`count_rejected`) are never cached.
    pub fn denial_cache(mut self, capacity: usize) -> Self {
        self.denial_cache = capacity;
        self
    }

    /// Lease mode ([`Lease::Off`] by default): with leases, one script call
    /// takes a batch of a key's units, spent in Redis at once, and this
    /// process admits from the batch without Redis until it is spent or its
    /// lifetime ends.
    ///
    /// - **Never over the limit.** Leased units are spent in Redis when
    ///   taken, so the fleet admits no more than one Redis-checked request
    ///   at a time would: exactly so for the windows; for the token bucket
    ///   and GCRA, a unit is spent when leased rather than when used, which
    ///   over any stretch of time admits at most the quota's allowance for
    ///   that stretch plus one [lifetime](Self::lease_lifetime).
    /// - **Sized by traffic.** A key leases enough for one
    ///   [slice](Self::lease_slice) of its traffic here, judged by how fast
    ///   its last lease went (growing at most fourfold from one lease to the
    ///   next), up to the mode's maximum and to what Redis has left. A quiet
    ///   key leases nothing beyond its request: it is decided by Redis as
    ///   with leases off.
    /// - **The cost: parked units.** Units leased here and not used are
    ///   refused to the other servers until given back or lapsed: at most
    ///   one lease per key per process, so at most the maximum lease size x
    ///   processes units per key, for at most a lease's lifetime. Unspent
    ///   units go back with the key's next lease call: to a token bucket or
    ///   GCRA less what the refill since the lease has made up for (so that
    ///   giving back never admits more than holding would have); to a window
    ///   only within the window they were taken in. A window's lease ends
    ///   with the window.
    /// - **Which quotas.** Token bucket, GCRA, fixed window and sliding
    ///   window counter. Sets with a sliding log or a leaky bucket are
    ///   decided one request at a time; see
    ///   [`supports_leases`](RedisBackend::supports_leases).
    /// - **Multi-quota sets** lease all their quotas together: as many units
    ///   as every quota can give, all or nothing, as for one request.
    /// - **When Redis fails**, leases in hand keep deciding until spent or
    ///   expired; then [`OnFailure`] applies.
    ///
    /// Decisions from a lease report what Redis had left when the lease was
    /// taken plus what the lease still holds. Leases only serve checks;
    /// peeks ask Redis.
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// How much of a key's traffic one lease should cover (10 ms by
    /// default): longer means fewer Redis calls and more units parked.
    pub fn lease_slice(mut self, slice: Duration) -> Self {
        self.lease_slice = slice;
        self
    }

    /// How long leased units stay usable (50 ms by default, and never past
    /// the end of a window they were taken in). It bounds how long parked
    /// units are refused to other servers, and for the token bucket and GCRA
    /// how far a lease can run ahead of the refill.
    pub fn lease_lifetime(mut self, lifetime: Duration) -> Self {
        self.lease_lifetime = lifetime;
        self
    }

    /// **For tests only**: takes the time from `clock` (sent to the script)
    /// instead of Redis's `TIME`, so a test can drive Redis through the same
    /// timeline as a [`MemoryBackend`] on a [`ManualClock`](crate::ManualClock).
    ///
    /// Never set it in production: servers whose clocks disagree would then
    /// disagree about the limits (a clock running ahead refills buckets
    /// early). Redis still expires keys on its own clock, so with a test
    /// clock every key is kept a minute longer than the test's time says.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the backend. Nothing is connected yet: the first check
    /// connects.
    pub fn build(self) -> Result<RedisBackend, RedisConfigError> {
        if self.prefix.contains(['{', '}']) {
            return Err(RedisConfigError::BracesInPrefix(self.prefix));
        }
        if let Lease::Max(n) = self.lease {
            if !(1..=Lease::LIMIT).contains(&n) {
                return Err(RedisConfigError::Lease(format!(
                    "a lease of {n} units; give 1 to {}",
                    Lease::LIMIT
                )));
            }
        }
        let micro = Duration::from_micros(1);
        if self.lease_slice < micro || self.lease_lifetime < self.lease_slice {
            return Err(RedisConfigError::Lease(format!(
                "a lease slice of {:?} and lifetime of {:?}; the slice must be at least 1 us and the lifetime at least the slice",
                self.lease_slice, self.lease_lifetime
            )));
        }
        let lease = lease::Policy::new(self.lease, self.lease_slice, self.lease_lifetime);
        let cache = match (self.denial_cache, lease.is_some()) {
            (0, false) => None,
            (0, true) => Some(DenialCache::new(LEASE_KEYS, false)),
            (n, _) => Some(DenialCache::new(n, true)),
        };
        let source = match self.source {
            SourceConfig::Pool(pool) => Source::Single(pool),
            SourceConfig::ClusterPool(pool) => Source::Cluster(pool),
            SourceConfig::Url(url) => Source::Single(
                deadpool_redis::Config::from_url(url)
                    .create_pool(Some(Runtime::Tokio1))
                    .map_err(|e| RedisConfigError::Pool(e.to_string()))?,
            ),
            SourceConfig::ClusterUrls(urls) => Source::Cluster(
                deadpool_redis::cluster::Config::from_urls(urls)
                    .create_pool(Some(Runtime::Tokio1))
                    .map_err(|e| RedisConfigError::Pool(e.to_string()))?,
            ),
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                source,
                conn: Mutex::new(None),
                generation: AtomicU64::new(0),
                prefix: self.prefix.into(),
                timeout: self.timeout,
                on_failure: self.on_failure,
                breaker: Breaker::new(self.breaker),
                cache,
                lease,
                clock: self.clock,
                started: Instant::now(),
                counters: Counters::default(),
                metrics: RedisMetrics::new(),
            }),
        })
    }
}

/// Why a [`RedisBackend`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisConfigError {
    /// The URL (or cluster URLs) could not make a connection pool.
    Pool(String),
    /// The key prefix contains `{` or `}`.
    BracesInPrefix(String),
    /// A lease setting out of range.
    Lease(String),
    /// Leases are on and a quota of the set needs every arrival (a sliding
    /// log or a leaky bucket).
    LeaseUnsupported {
        /// The quota's name.
        quota: String,
        /// Its algorithm.
        algorithm: crate::quota::Algorithm,
    },
}

impl fmt::Display for RedisConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisConfigError::Pool(e) => write!(f, "cannot make a Redis connection pool: {e}"),
            RedisConfigError::BracesInPrefix(p) => write!(
                f,
                "the key prefix {p:?} contains a brace, which would change the keys' cluster hash tag"
            ),
            RedisConfigError::Lease(e) => write!(f, "lease: {e}"),
            RedisConfigError::LeaseUnsupported { quota, algorithm } => write!(
                f,
                "quota {quota:?} is a {algorithm}, which needs every arrival and cannot be leased; turn leases off (lease: off) or use a token bucket, GCRA, fixed or sliding window"
            ),
        }
    }
}

impl std::error::Error for RedisConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configurations_are_refused_when_built() {
        let braces = RedisBackend::from_url("redis://127.0.0.1:6379")
            .prefix("app{1}:")
            .build();
        assert!(matches!(braces, Err(RedisConfigError::BracesInPrefix(_))));
        let url = RedisBackend::from_url("http://127.0.0.1:6379").build();
        assert!(matches!(url, Err(RedisConfigError::Pool(_))), "{url:?}");
        // Building connects to nothing: no Redis is needed here.
        let ok = RedisBackend::from_url("redis://127.0.0.1:1").build();
        assert!(ok.is_ok());
    }
}
