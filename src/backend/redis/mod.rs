//! State in Redis, shared by every server of a fleet (the `redis` feature).

mod breaker;
mod cache;
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

use super::{Backend, BackendError, BackendErrorKind, CheckRequest, MemoryBackend};
use crate::clock::{Clock, micros};
use crate::decision::Decision;
use crate::metrics::RedisMetrics;
use crate::quota_set::{QuotaSet, QuotaVerdict};
use breaker::{Breaker, Permit, ProbeGuard, Transition};
use cache::DenialCache;

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
    cache: Option<DenialCache>,
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

    async fn decide(&self, request: CheckRequest<'_>) -> Result<Decision, BackendError> {
        let inner = &*self.inner;
        let quotas = request.quotas;
        let cache = inner
            .cache
            .as_ref()
            .filter(|_| !quotas.quotas().iter().any(|q| q.params.count_rejected));
        let set = if cache.is_some() { cache_id(quotas) } else { 0 };
        if let Some(cache) = cache {
            if let Some(decision) = cache.get(set, request.key, request.cost, inner.local_now()) {
                bump(&inner.counters.cache_hits);
                inner.metrics.cache_hit();
                return Ok(decision);
            }
        }

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
        let result = match tokio::time::timeout(inner.timeout, self.call(request)).await {
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
            Ok(verdicts) => {
                if inner.breaker.success(probe) == Transition::Closed {
                    inner.metrics.circuit(false);
                    tracing::info!("tollgate: Redis answers again; circuit breaker closed");
                }
                let decision = quotas.decision_from(&verdicts);
                if let Some(cache) = cache {
                    if let Some(wait) = enforced_wait(quotas, &verdicts) {
                        let now = inner.local_now();
                        cache.insert(set, request.key, request.cost, now, wait, &decision);
                    }
                }
                Ok(decision)
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
                tracing::warn!(
                    kind = ?e.kind(),
                    failures,
                    consecutive,
                    error = %e,
                    "tollgate: Redis rate-limit call failed"
                );
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
    async fn call(&self, request: CheckRequest<'_>) -> Result<Vec<QuotaVerdict>, BackendError> {
        let inner = &*self.inner;
        let quotas = request.quotas;
        let keys = script::redis_keys(&inner.prefix, request.key, quotas);
        let now = inner.clock.as_ref().map(|c| c.now().as_micros());
        let slack = if now.is_some() {
            TEST_CLOCK_EXPIRY_SLACK_MS
        } else {
            0
        };
        let args = script::arguments(quotas, now, request.cost, request.commit, slack);
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
        script::verdicts(&reply, quotas.quotas().len())
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

/// How long the request stays refused whatever else happens: the longest
/// wait among the enforced quotas that refused it (`None` if it passed).
fn enforced_wait(quotas: &QuotaSet, verdicts: &[QuotaVerdict]) -> Option<u64> {
    quotas
        .quotas()
        .iter()
        .zip(verdicts)
        .filter(|(q, v)| !v.allowed && !q.params.shadow)
        .map(|(_, v)| v.retry_after)
        .max()
        .filter(|&w| w > 0)
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
    clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .field("circuit_breaker", &self.breaker)
            .field("denial_cache", &self.denial_cache)
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
    /// [`BackendErrorKind::Timeout`], and [`OnFailure`] applies.
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
                cache: (self.denial_cache > 0).then(|| DenialCache::new(self.denial_cache)),
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
}

impl fmt::Display for RedisConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RedisConfigError::Pool(e) => write!(f, "cannot make a Redis connection pool: {e}"),
            RedisConfigError::BracesInPrefix(p) => write!(
                f,
                "the key prefix {p:?} contains a brace, which would change the keys' cluster hash tag"
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
