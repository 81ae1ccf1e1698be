//! A backend chosen by configuration.

use super::model::BackendConfig;
use crate::backend::{
    Backend, BackendError, CheckRequest, GiveBackRequest, MemoryBackend, Reserved,
};
use crate::decision::Decision;
use crate::layer::ConcurrencyQuota;
use crate::quota_set::QuotaSet;

/// The backend a rules file names: in memory, or Redis (with the `redis`
/// feature).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyBackend {
    /// This process's memory.
    Memory(MemoryBackend),
    /// Redis, shared by every server pointed at it.
    #[cfg(feature = "redis")]
    Redis(crate::backend::redis::RedisBackend),
}

impl AnyBackend {
    pub(crate) fn from_config(config: &BackendConfig) -> Result<Self, String> {
        match config {
            BackendConfig::Memory { max_keys } => Ok(AnyBackend::Memory(
                MemoryBackend::builder().max_keys(*max_keys).build(),
            )),
            #[cfg(feature = "redis")]
            BackendConfig::Redis {
                url,
                prefix,
                timeout,
                on_failure,
                lease,
            } => {
                use crate::backend::redis::{Lease, OnFailure, RedisBackend};
                let on_failure = match on_failure.0 {
                    super::names::RedisFailure::Error => OnFailure::Error,
                    super::names::RedisFailure::Memory => OnFailure::Fallback(MemoryBackend::new()),
                };
                let lease: Lease = lease
                    .value
                    .0
                    .parse()
                    .map_err(|e| lease.error(format!("backend: redis: {e}")))?;
                RedisBackend::from_url(url.value.clone())
                    .prefix(prefix.clone())
                    .timeout(timeout.0)
                    .on_failure(on_failure)
                    .lease(lease)
                    .build()
                    .map(AnyBackend::Redis)
                    .map_err(|e| url.error(format!("backend: redis: {e}")))
            }
            #[cfg(not(feature = "redis"))]
            BackendConfig::Redis { url, .. } => {
                Err(url.error("backend: redis needs tollgate built with the redis feature"))
            }
        }
    }
}

/// A rule's concurrency quota with its slots where the backend keeps state:
/// in Redis for a Redis backend, so that a fleet shares the limit (under
/// `<prefix>concurrency:<rule>:`, one set of slots per rule as in memory),
/// in this process otherwise.
pub(crate) fn with_slots(
    config: &BackendConfig,
    rule: &str,
    quota: ConcurrencyQuota,
) -> Result<ConcurrencyQuota, String> {
    match config {
        #[cfg(feature = "redis")]
        BackendConfig::Redis {
            url,
            prefix,
            timeout,
            ..
        } => {
            let prefix = format!("{prefix}concurrency:{rule}:");
            let slots = crate::backend::RedisSlots::from_url(&url.value, &prefix)
                .map_err(|e| url.error(format!("backend: redis: {e}")))?
                .timeout(timeout.0);
            Ok(quota.store(slots))
        }
        _ => {
            let _ = rule;
            Ok(quota)
        }
    }
}

impl AnyBackend {
    /// Why `quotas` cannot be used on this backend, if they cannot: a set
    /// that needs every arrival on a Redis backend that leases.
    pub(crate) fn refuses(&self, quotas: &QuotaSet) -> Option<String> {
        match self {
            AnyBackend::Memory(_) => None,
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.supports_leases(quotas).err().map(|e| e.to_string()),
        }
    }
}

impl Backend for AnyBackend {
    async fn check(&self, request: CheckRequest<'_>) -> Result<Decision, BackendError> {
        match self {
            AnyBackend::Memory(m) => m.check(request).await,
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.check(request).await,
        }
    }

    async fn reserve(&self, request: CheckRequest<'_>) -> Result<Reserved, BackendError> {
        match self {
            AnyBackend::Memory(m) => m.reserve(request).await,
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.reserve(request).await,
        }
    }

    async fn give_back(&self, request: GiveBackRequest<'_>) -> Result<Decision, BackendError> {
        match self {
            AnyBackend::Memory(m) => m.give_back(request).await,
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.give_back(request).await,
        }
    }

    fn check_now(&self, request: CheckRequest<'_>) -> Option<Result<Decision, BackendError>> {
        match self {
            AnyBackend::Memory(m) => m.check_now(request),
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.check_now(request),
        }
    }

    fn decides_now(&self) -> bool {
        match self {
            AnyBackend::Memory(m) => m.decides_now(),
            // Redis answers now only sometimes (from a lease), and a plan
            // of several steps given up halfway would spend its first
            // steps twice: rules always ask Redis's backend by `check`.
            #[cfg(feature = "redis")]
            AnyBackend::Redis(_) => false,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            AnyBackend::Memory(m) => m.name(),
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.name(),
        }
    }
}
