//! Schedules in Redis: one timeline per key for a whole fleet.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::redis::Script;

use super::schedule::{Plan, Told, Turn};
use super::store::{PaceStore, Scheduled};
use crate::backend::RedisBackend;
use crate::backend::redis::{Connections, connections};
use crate::backend::{BackendError, BackendErrorKind};

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("pace.lua")));

/// Schedules in Redis, so that every process of a fleet waits its turn on
/// one timeline per key, on Redis's clock (`TIME`): the processes' own
/// clocks never enter a slot, each only sleeps the delay Redis returned.
/// One Lua script schedules, gives back, and records what the provider
/// said (a pause, a cut rate), atomically. A key's hash expires once its
/// schedule has passed and its cut is forgotten.
///
/// In one Redis by its URL, or [`on`](Self::on) a backend's connection:
/// then wherever the backend keeps its state (one server, a Cluster, a
/// Sentinel's master, over TLS), as each call touches one key. Clones
/// share the connection.
///
/// ```no_run
/// use std::time::Duration;
/// use tollgate::Quota;
/// use tollgate::outbound::{Pacer, RedisPace};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisPace::from_url("redis://127.0.0.1:6379", "jobs:pace:")?;
/// let pacer = Pacer::new(store, &Quota::gcra(100, Duration::from_secs(1)).build()?);
/// # let _ = pacer;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisPace {
    inner: Arc<Inner>,
    timeout: Duration,
}

struct Inner {
    redis: Arc<Connections>,
    prefix: Box<str>,
}

impl fmt::Debug for RedisPace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisPace")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisPace {
    /// Schedules in the Redis at `url`, under keys starting with `prefix`.
    /// Connects on first use.
    pub fn from_url(url: &str, prefix: &str) -> Result<Self, BackendError> {
        Ok(RedisPace::new(Arc::new(connections(url)?), prefix))
    }

    /// Schedules in the Redis `backend` keeps its state in, through its
    /// connection, under keys starting with `prefix`.
    pub fn on(backend: &RedisBackend, prefix: &str) -> Self {
        RedisPace::new(backend.connections(), prefix)
    }

    fn new(redis: Arc<Connections>, prefix: &str) -> Self {
        RedisPace {
            inner: Arc::new(Inner {
                redis,
                prefix: prefix.into(),
            }),
            timeout: Duration::from_millis(200),
        }
    }

    /// How long one call to Redis may take (200 ms by default), connecting
    /// included; past it the call fails, and the caller is refused.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn call(
        &self,
        key: &str,
        plan: &Plan,
        mode: &str,
        args: [u64; 4],
    ) -> Result<Scheduled, BackendError> {
        let mut invocation = SCRIPT.key(format!("{}p:{key}", self.inner.prefix));
        invocation
            .arg(mode)
            .arg(plan.interval)
            .arg(plan.burst)
            .arg(plan.max_interval)
            .arg(plan.min_interval)
            .arg(plan.decrease.to_string())
            .arg(plan.increase.to_string())
            .arg(plan.forget);
        for a in args {
            invocation.arg(a);
        }
        let (ok, n, now, interval, paused): (i64, i64, i64, i64, i64) =
            self.inner.redis.invoke(&invocation, self.timeout).await?;
        // A reply out of range is refused, not trusted: a negative delay
        // cast to u64 would be a wait of centuries.
        let (Ok(n), Ok(now), Ok(interval), Ok(paused)) = (
            u64::try_from(n),
            u64::try_from(now),
            u64::try_from(interval),
            u64::try_from(paused),
        ) else {
            return Err(BackendError::new(
                BackendErrorKind::Protocol,
                "the pacing script answered a negative number",
            ));
        };
        let turn = match ok {
            1 => Turn::Go { delay: n, interval },
            0 => Turn::TooLong { would_wait: n },
            _ => {
                return Err(BackendError::new(
                    BackendErrorKind::Protocol,
                    "the pacing script answered an unknown verdict",
                ));
            }
        };
        Ok(Scheduled { turn, now, paused })
    }
}

impl PaceStore for RedisPace {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        plan: &'a Plan,
        cost: u64,
        max_wait: u64,
    ) -> impl Future<Output = Result<Scheduled, BackendError>> + Send + 'a {
        self.call(key, plan, "a", [cost, max_wait, 0, 0])
    }

    async fn give_back(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
        interval: u64,
        slot: u64,
    ) -> Result<(), BackendError> {
        self.call(key, plan, "g", [cost, interval, slot, 0])
            .await
            .map(drop)
    }

    async fn obey(&self, key: &str, plan: &Plan, told: Told) -> Result<(), BackendError> {
        let args = [
            told.pause_until,
            u64::from(told.cut),
            told.scheduled_at,
            told.announced,
        ];
        self.call(key, plan, "o", args).await.map(drop)
    }

    fn shared(&self) -> bool {
        true
    }
}
