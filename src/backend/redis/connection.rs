//! The connection a Redis backend calls through: where it comes from, how
//! it is replaced when it fails, and what a Redis error means for it.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_redis::PoolError;
use deadpool_redis::redis::{
    self, Cmd, ErrorKind, FromRedisValue, RedisError, ScriptInvocation, ServerErrorKind,
};

use super::script;
use super::stats::bump;
use crate::backend::{BackendError, BackendErrorKind};
use crate::sync::lock;

/// Where connections come from.
pub(super) enum Source {
    Single(deadpool_redis::Pool),
    Cluster(deadpool_redis::cluster::Pool),
    /// A cluster client of our own: deadpool's cannot be given TLS
    /// certificates.
    ClusterClient(redis::cluster::ClusterClient),
    /// The master that the sentinels name, asked again at each connection,
    /// so that a connection made after a failover reaches the new master.
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
}

/// A connection that multiplexes concurrent calls.
#[derive(Clone)]
pub(super) enum Conn {
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

impl Conn {
    /// Any command, its reply read as `T` (the admin store's calls).
    async fn query_as<T: redis::FromRedisValue>(&mut self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::Single(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// Runs `script` by its hash, sending it first if Redis lacks it (the
    /// concurrency slots' and the outbound pacer's calls).
    async fn invoke<T: FromRedisValue>(
        &mut self,
        script: &ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        match self {
            Conn::Single(c) => script.invoke_async(c).await,
            Conn::Cluster(c) => script.invoke_async(c).await,
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
            Source::ClusterClient(client) => client
                .get_async_connection()
                .await
                .map(Conn::Cluster)
                .map_err(|e| redis_error(e).0),
            Source::Sentinel(client) => client
                .lock()
                .await
                .get_async_connection()
                .await
                .map(Conn::Single)
                .map_err(|e| redis_error(e).0),
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
pub(crate) fn redis_error(e: RedisError) -> (BackendError, bool) {
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
    } else if let Some(wrong) = super::probe::misconfiguration(&e) {
        let e = BackendError::new(BackendErrorKind::Misconfigured, wrong).with_source(e);
        return (e, false);
    } else if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
        // The server became a replica (a failover demoted it): connect
        // again, which through Sentinel reaches the new master.
        (BackendErrorKind::Unavailable, true)
    } else if matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
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

/// The error of a call Redis did not answer within `timeout`.
pub(super) fn no_answer(timeout: Duration) -> BackendError {
    BackendError::new(
        BackendErrorKind::Timeout,
        format!("Redis did not answer within {timeout:?}"),
    )
}

/// The one multiplexed connection every check goes through, made again
/// from its source when it fails.
pub(crate) struct Connections {
    source: Source,
    /// The connection in use, and a number telling it from its successors.
    conn: Mutex<Option<(u64, Conn)>>,
    generation: AtomicU64,
}

impl Connections {
    pub(super) fn new(source: Source) -> Self {
        Connections {
            source,
            conn: Mutex::new(None),
            generation: AtomicU64::new(0),
        }
    }

    /// Whether the source is a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.source, Source::Cluster(_) | Source::ClusterClient(_))
    }

    /// Runs the script on `conn` (its generation and connection), sending
    /// it again if Redis lost it. On failure, says whether the connection is
    /// broken, and forgets it if so.
    pub(super) async fn evaluate(
        &self,
        conn: &mut (u64, Conn),
        keys: &[String],
        args: &[String],
        script_loads: &AtomicU64,
    ) -> Result<Vec<i64>, (BackendError, bool)> {
        let reply = match conn.1.query(&script::command(false, keys, args)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let n = bump(script_loads);
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
                self.forget(Some(conn.0));
            }
            (e, broken)
        })
    }

    fn cached_connection(&self) -> Option<(u64, Conn)> {
        lock(&self.conn).clone()
    }

    /// The connection in use (its generation and itself), and whether it
    /// was just made.
    pub(super) async fn connection(&self) -> Result<((u64, Conn), bool), BackendError> {
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

    /// Runs `cmd` and reads its reply as `T`, within `timeout` (the admin
    /// store's calls): see [`within`](Self::within).
    pub(super) async fn query<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        timeout: Duration,
    ) -> Result<T, BackendError> {
        self.within(timeout, |mut conn| async move { conn.query_as(cmd).await })
            .await
    }

    /// Runs `script` and reads its reply as `T`, within `timeout` (the
    /// concurrency slots' and the outbound pacer's calls): see
    /// [`within`](Self::within).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, BackendError> {
        self.within(timeout, |mut conn| async move { conn.invoke(script).await })
            .await
    }

    /// Runs `call` on the connection in use, connecting first if need be,
    /// all within `timeout`. The connection is forgotten if the call broke
    /// it, or if no answer came in time, as a check's is (a peer gone
    /// without a reset leaves a connection that never answers).
    async fn within<T, F: Future<Output = redis::RedisResult<T>>>(
        &self,
        timeout: Duration,
        call: impl FnOnce(Conn) -> F,
    ) -> Result<T, BackendError> {
        // The generation sent on, once there is one (generations start at 1).
        let sent_on = AtomicU64::new(0);
        let attempt = async {
            let ((generation, conn), _) = self.connection().await?;
            sent_on.store(generation, Ordering::Relaxed);
            call(conn).await.map_err(|e| {
                let (e, broken) = redis_error(e);
                if broken {
                    self.forget(Some(generation));
                }
                e
            })
        };
        tokio::time::timeout(timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                match sent_on.load(Ordering::Relaxed) {
                    0 => {}
                    generation => self.forget(Some(generation)),
                }
                Err(no_answer(timeout))
            })
    }

    /// Drops the connection in use (only if it is still `generation`'s).
    pub(super) fn forget(&self, generation: Option<u64>) {
        let mut slot = lock(&self.conn);
        if generation.is_none_or(|g| slot.as_ref().is_some_and(|(current, _)| *current == g)) {
            *slot = None;
        }
    }
}
