//! The Redis side of what operators change at run time (see
//! `rules/runtime.rs`): resetting a key, and the shared store of
//! overrides, blocks and resets that every process of a fleet polls.

use std::time::Duration;

use deadpool_redis::redis::{self, Cmd};

use super::backend::RedisBackend;
use super::on_failure::OnFailure;
use super::script;
use crate::backend::BackendError;
use crate::quota_set::QuotaSet;

/// The reset script (`reset.lua`).
const RESET: &str = include_str!("reset.lua");
/// The store's script (`admin.lua`).
#[cfg(feature = "rules")]
const STORE: &str = include_str!("admin.lua");

/// The least time an operator's call is given: the request path's timeout
/// is often a few milliseconds, too short for a first connection.
const MIN_ADMIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The store as read: its version, its entries (field, value) and its
/// recent resets (`<version>\n<field>`).
#[cfg(feature = "rules")]
#[derive(Debug, Default)]
pub(crate) struct StoreSnapshot {
    pub version: u64,
    pub entries: Vec<(String, String)>,
    pub resets: Vec<String>,
}

impl RedisBackend {
    /// Deletes `key`'s states of `quotas` in one script, then forgets what
    /// this process remembers of the key (its denial, its lease) and its
    /// state in the fallback store.
    pub(super) async fn reset_key(&self, key: &str, quotas: &QuotaSet) -> Result<(), BackendError> {
        let keys = script::redis_keys(&self.inner.prefix, key, quotas);
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RESET).arg(keys.len()).arg(&keys);
        self.admin_call::<i64>(&cmd).await?;
        self.forget(key, quotas);
        Ok(())
    }

    /// Forgets what this process remembers of `key` under `quotas`: the
    /// denial cache's entry and lease, and the fallback store's state. For
    /// a reset made by another process, which this one hears of through the
    /// store.
    pub(crate) fn forget(&self, key: &str, quotas: &QuotaSet) {
        if let Some((cache, set)) = self.cache_for(quotas) {
            cache.forget(set, key);
        }
        if let OnFailure::Fallback(local) = &self.inner.on_failure {
            local.reset_now(key, quotas);
        }
    }
}

/// The shared store, which only the rules read and write.
#[cfg(feature = "rules")]
impl RedisBackend {
    /// The store's three keys, under the backend's prefix with one hash
    /// tag.
    fn store_keys(&self) -> [String; 3] {
        let p = &self.inner.prefix;
        [
            format!("{p}{{tollgate-admin}}:entries"),
            format!("{p}{{tollgate-admin}}:version"),
            format!("{p}{{tollgate-admin}}:resets"),
        ]
    }

    fn store_command(&self, args: &[&str]) -> Cmd {
        let keys = self.store_keys();
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(STORE).arg(keys.len()).arg(&keys[..]).arg(args);
        cmd
    }

    /// Writes `value` as `field`'s entry (`op` "set"), deletes the entry
    /// ("del"), or records a reset of `field` ("reset"); returns the new
    /// version.
    pub(crate) async fn store_write(
        &self,
        op: &str,
        field: &str,
        value: &str,
    ) -> Result<u64, BackendError> {
        let cmd = self.store_command(&[op, field, value]);
        let v: i64 = self.admin_call(&cmd).await?;
        u64::try_from(v).map_err(|_| protocol("a negative store version"))
    }

    /// The store's version: one `GET`, the poll's question.
    pub(crate) async fn store_version(&self) -> Result<u64, BackendError> {
        let [_, version, _] = self.store_keys();
        let mut cmd = redis::cmd("GET");
        cmd.arg(version);
        let v: Option<String> = self.admin_call(&cmd).await?;
        match v {
            None => Ok(0),
            Some(v) => v
                .parse()
                .map_err(|_| protocol("a store version that is not a number")),
        }
    }

    /// The whole store, read in one script.
    pub(crate) async fn store_read(&self) -> Result<StoreSnapshot, BackendError> {
        let cmd = self.store_command(&["read"]);
        let (version, flat, resets): (String, Vec<String>, Vec<String>) =
            self.admin_call(&cmd).await?;
        let version = version
            .parse()
            .map_err(|_| protocol("a store version that is not a number"))?;
        if flat.len() % 2 != 0 {
            return Err(protocol("a store hash of an odd length"));
        }
        let mut entries = Vec::with_capacity(flat.len() / 2);
        let mut flat = flat.into_iter();
        while let (Some(field), Some(value)) = (flat.next(), flat.next()) {
            entries.push((field, value));
        }
        Ok(StoreSnapshot {
            version,
            entries,
            resets,
        })
    }
}

impl RedisBackend {
    /// One call, within the backend's timeout (at least
    /// [`MIN_ADMIN_TIMEOUT`]).
    async fn admin_call<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T, BackendError> {
        let timeout = self.inner.timeout.max(MIN_ADMIN_TIMEOUT);
        self.inner.connections.query(cmd, timeout).await
    }
}

#[cfg(feature = "rules")]
fn protocol(what: &str) -> BackendError {
    BackendError::new(
        crate::backend::BackendErrorKind::Protocol,
        format!("Redis answered {what}"),
    )
}
