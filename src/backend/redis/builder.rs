//! Configuring and building a [`RedisBackend`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::backend::{Inner, RedisBackend};
use super::breaker::{Breaker, CircuitBreaker};
use super::cache::DenialCache;
use super::config_error::RedisConfigError;
use super::connection::Connections;
use super::lease::{self, Lease};
use super::on_failure::OnFailure;
use super::source::{SourceConfig, Tls, source};
use super::stats::Counters;
use super::stats::RedisMetrics;
use crate::clock::Clock;

impl RedisBackend {
    /// A backend on the Redis at `url` (`redis://[user:password@]host:port[/db]`,
    /// or `rediss://` for TLS; see [`tls_ca`](RedisBackendBuilder::tls_ca)).
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

    /// A backend on the master that Redis Sentinel calls `master`, asking
    /// the sentinels at `sentinel_urls` (`redis://[user:password@]host:26379`,
    /// or `rediss://`) where it is. After a failover, the next connection
    /// (made when the old one fails) goes to the master the sentinels
    /// promoted.
    ///
    /// The URLs' credentials authenticate to the sentinels, and also to the
    /// master unless [`sentinel_master_auth`](RedisBackendBuilder::sentinel_master_auth)
    /// says otherwise; the master is reached with TLS when the sentinels are.
    pub fn from_sentinel(
        master: impl Into<String>,
        sentinel_urls: impl IntoIterator<Item = impl Into<String>>,
    ) -> RedisBackendBuilder {
        RedisBackendBuilder::new(SourceConfig::Sentinel {
            master: master.into(),
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
        })
    }
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
    tls: Tls,
    /// The master's username and password under Sentinel, when not the
    /// sentinels'.
    master_auth: Option<(String, String)>,
}

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
            .field("tls_ca", &self.tls.ca.is_some())
            .field("tls_client_cert", &self.tls.client.is_some())
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
            tls: Tls::default(),
            master_auth: None,
        }
    }

    /// Trusts the CAs in `pem` (PEM text, one certificate or more) for
    /// `rediss://` servers, instead of the built-in public roots: for a
    /// private CA, or a self-signed server. Needs `rediss://` URLs.
    pub fn tls_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents a client certificate (`cert_pem`, its chain in PEM) and its
    /// private key (`key_pem`, PEM) to servers that ask for one (mutual TLS,
    /// `tls-auth-clients yes`). Needs `rediss://` URLs.
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Under [Sentinel](RedisBackend::from_sentinel), the username and
    /// password for the master, when they are not the sentinels' (an empty
    /// username is Redis's `default` user). Ignored for other sources.
    pub fn sentinel_master_auth(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.master_auth = Some((username.into(), password.into()));
        self
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
    /// [`BackendErrorKind::Timeout`](crate::backend::BackendErrorKind::Timeout), and [`OnFailure`] applies. With
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
    /// limit costs Redis a few calls, not one per request: when a refusal
    /// runs out, the requests it held back share one call (one asks, the
    /// others wait for its answer, for at most 4 calls or half the
    /// [timeout](Self::timeout), then ask for themselves), so a flooding key
    /// costs about one call per retry-after interval. Decisions served
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
    /// - **Never much of a quota.** A lease holds at most an eighth of the
    ///   smallest capacity in its set ([`Quota::max_cost`](crate::Quota::max_cost)),
    ///   and at least 1 unit: a quota of 10 is never leased, one of 80 in
    ///   leases of at most 10, so one process cannot park a small quota's
    ///   whole allowance.
    /// - **The cost: parked units.** Units leased here and not used are
    ///   refused to the other servers until given back or lapsed: at most
    ///   one lease per key per process, so at most the largest lease (the
    ///   maximum, or an eighth of the capacity if less) x processes units per
    ///   key, for at most a lease's lifetime. Unspent
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
    /// timeline as a [`MemoryBackend`](crate::MemoryBackend) on a [`ManualClock`](crate::ManualClock).
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
        let source = source(self.source, &self.tls, self.master_auth)?;
        Ok(RedisBackend::new(Inner {
            connections: Arc::new(Connections::new(source)),
            prefix: self.prefix.into(),
            timeout: self.timeout,
            on_failure: self.on_failure,
            breaker: Breaker::new(self.breaker),
            cache,
            lease,
            clock: self.clock,
            started: crate::clock::Stopwatch::start(),
            counters: Counters::default(),
            metrics: RedisMetrics::new(),
        }))
    }
}

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
