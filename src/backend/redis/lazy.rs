//! One connection to one Redis, made at the first call: the concurrency
//! slots' and the outbound pacer's, whose every call is one script.

use std::sync::Mutex;
use std::time::Duration;

use deadpool_redis::redis::{self, FromRedisValue, ScriptInvocation, aio::MultiplexedConnection};

use super::connection::redis_error;
use crate::backend::{BackendError, BackendErrorKind};
use crate::sync::lock;

/// A multiplexed connection made when first needed, and made again after a
/// call that broke it (see [`redis_error`]).
pub(crate) struct LazyConnection {
    client: redis::Client,
    conn: Mutex<Option<MultiplexedConnection>>,
}

impl LazyConnection {
    /// Connects through `client` at the first call.
    pub(crate) fn new(client: redis::Client) -> Self {
        LazyConnection {
            client,
            conn: Mutex::new(None),
        }
    }

    /// Runs `script` and reads its reply as `T`, connecting first if need
    /// be, all within `timeout`: past it, a timeout error, and the next
    /// call takes a fresh connection, as the backend's does (a peer gone
    /// without a reset leaves a connection that never answers).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
        timeout: Duration,
    ) -> Result<T, BackendError> {
        tokio::time::timeout(timeout, self.invoke_once(script))
            .await
            .unwrap_or_else(|_| {
                *lock(&self.conn) = None;
                Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("no answer from Redis within {timeout:?}"),
                ))
            })
    }

    async fn invoke_once<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, BackendError> {
        let mut conn = self.connection().await?;
        script.invoke_async(&mut conn).await.map_err(|e| {
            let (error, broken) = redis_error(e);
            if broken {
                *lock(&self.conn) = None;
            }
            error
        })
    }

    async fn connection(&self) -> Result<MultiplexedConnection, BackendError> {
        if let Some(c) = lock(&self.conn).clone() {
            return Ok(c);
        }
        let c = self
            .client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| redis_error(e).0)?;
        *lock(&self.conn) = Some(c.clone());
        Ok(c)
    }
}
