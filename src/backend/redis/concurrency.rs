//! Concurrency slots in Redis, shared by a fleet, that a dead server cannot
//! keep.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::redis::Script;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use super::{Connections, RedisBackend, connections};
use crate::backend::{Acquired, BackendError, BackendErrorKind, Slot, SlotFuture, SlotStore};

pub(super) static SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("concurrency.lua")));

/// Concurrency slots in Redis, so that a limit holds across every server of
/// a fleet. Each key's slots are a sorted set of slot ids scored by when
/// they expire; one Lua script takes, refreshes and gives back a slot.
///
/// A held slot is refreshed every third of its lifetime (30 s by default)
/// and given back when its request ends. A server that dies holding slots
/// stops refreshing them, and they come free within their lifetime. A
/// request held longer than `max_hold` (10 minutes by default) stops being
/// refreshed too: no loop runs unbounded.
///
/// In one Redis by its URL, or [`on`](Self::on) a backend's connection:
/// then wherever the backend keeps its state (one server, a Cluster, a
/// Sentinel's master, over TLS), as each call touches one key. Clones
/// share the connection.
///
/// ```no_run
/// use tollgate::backend::RedisSlots;
/// use tollgate::layer::ConcurrencyQuota;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let slots = RedisSlots::from_url("redis://127.0.0.1:6379", "myapp:conc:")?;
/// let quota = ConcurrencyQuota::new(20)?.store(slots);
/// # let _ = quota;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisSlots {
    inner: Arc<Inner>,
    lifetime: Duration,
    max_hold: Duration,
    timeout: Duration,
}

struct Inner {
    redis: Arc<Connections>,
    prefix: Box<str>,
    /// Tells this process's slot ids from other servers'.
    nonce: u64,
    next_id: AtomicU64,
}

impl fmt::Debug for RedisSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSlots")
            .field("prefix", &self.inner.prefix)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl RedisSlots {
    /// Slots in the Redis at `url`, under keys starting with `prefix`.
    /// Connects on first use.
    pub fn from_url(url: &str, prefix: &str) -> Result<Self, BackendError> {
        Ok(RedisSlots::new(Arc::new(connections(url)?), prefix))
    }

    /// Slots in the Redis `backend` keeps its state in, through its
    /// connection, under keys starting with `prefix`.
    pub fn on(backend: &RedisBackend, prefix: &str) -> Self {
        RedisSlots::new(backend.connections(), prefix)
    }

    fn new(redis: Arc<Connections>, prefix: &str) -> Self {
        let nonce = foldhash::fast::RandomState::default().hash_one(std::process::id());
        RedisSlots {
            inner: Arc::new(Inner {
                redis,
                prefix: prefix.into(),
                nonce,
                next_id: AtomicU64::new(0),
            }),
            lifetime: Duration::from_secs(30),
            max_hold: Duration::from_secs(600),
            timeout: Duration::from_millis(100),
        }
    }

    /// How long a slot lives without a refresh (30 s by default, at least
    /// 30 ms): how long a dead server's slots stay taken.
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime.max(Duration::from_millis(30));
        self
    }

    /// How long a request may hold its slot (10 minutes by default); past
    /// it the slot is no longer refreshed and expires.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// How long one call to Redis may take (100 ms by default), connecting
    /// included; past it the call fails.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn call(
        &self,
        key: &str,
        op: &str,
        id: &str,
        limit: u64,
    ) -> Result<(bool, u64), BackendError> {
        let mut script = SCRIPT.key(key);
        script
            .arg(op)
            .arg(id)
            .arg(limit)
            .arg(self.lifetime.as_millis() as u64);
        let (held, n): (u64, u64) = self.inner.redis.invoke(&script, self.timeout).await?;
        Ok((held == 1, n))
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}c:{key}", self.inner.prefix)
    }

    async fn take(&self, key: &str, limit: u64) -> Result<Acquired, BackendError> {
        let runtime = Handle::try_current().map_err(|e| {
            BackendError::new(
                BackendErrorKind::Unavailable,
                format!("no tokio runtime: {e}"),
            )
        })?;
        let redis_key = self.redis_key(key);
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:016x}:{n}", self.inner.nonce);
        let (held, in_use) = self.call(&redis_key, "acquire", &id, limit).await?;
        if !held {
            return Ok(Acquired::Full { in_use });
        }
        let refresher = runtime.spawn(self.clone().refresh(redis_key.clone(), id.clone()));
        Ok(Acquired::Granted {
            slot: Slot::new(RedisSlot {
                slots: self.clone(),
                runtime,
                refresher,
                key: redis_key,
                id,
            }),
            in_use,
        })
    }

    /// Keeps a slot alive while its request runs (up to `max_hold`).
    async fn refresh(self, key: String, id: String) {
        let every = self.lifetime / 3;
        let rounds = (self.max_hold.as_millis() / every.as_millis().max(1)).max(1);
        for _ in 0..rounds {
            tokio::time::sleep(every).await;
            match self.call(&key, "refresh", &id, 0).await {
                Ok((true, _)) => {}
                Ok((false, _)) => return, // expired meanwhile: nothing to keep
                Err(error) => tracing::warn!(
                    error = error.to_string().as_str(),
                    "could not refresh a concurrency slot"
                ),
            }
        }
    }
}

impl SlotStore for RedisSlots {
    fn acquire<'a>(&'a self, key: &'a str, limit: u64) -> SlotFuture<'a> {
        Box::pin(self.take(key, limit))
    }
}

/// A slot held in Redis: refreshed until dropped, then given back.
struct RedisSlot {
    slots: RedisSlots,
    runtime: Handle,
    refresher: JoinHandle<()>,
    key: String,
    id: String,
}

impl Drop for RedisSlot {
    fn drop(&mut self) {
        self.refresher.abort();
        let slots = self.slots.clone();
        let (key, id) = (std::mem::take(&mut self.key), std::mem::take(&mut self.id));
        // Best effort: if this fails, the slot expires within its lifetime.
        self.runtime.spawn(async move {
            if let Err(error) = slots.call(&key, "release", &id, 0).await {
                tracing::warn!(
                    error = error.to_string().as_str(),
                    "could not give back a concurrency slot; it will expire"
                );
            }
        });
    }
}
