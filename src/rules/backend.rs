//! A backend chosen by configuration.

use super::file::BackendConfig;
use crate::backend::{Backend, BackendError, CheckRequest, MemoryBackend};
use crate::decision::Decision;

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
            } => {
                use crate::backend::redis::{OnFailure, RedisBackend};
                let on_failure = match on_failure.0 {
                    super::file::RedisFailure::Error => OnFailure::Error,
                    super::file::RedisFailure::Memory => OnFailure::Fallback(MemoryBackend::new()),
                };
                RedisBackend::from_url(url.clone())
                    .prefix(prefix.clone())
                    .timeout(timeout.0)
                    .on_failure(on_failure)
                    .build()
                    .map(AnyBackend::Redis)
                    .map_err(|e| format!("backend: redis: {e}"))
            }
            #[cfg(not(feature = "redis"))]
            BackendConfig::Redis { .. } => {
                Err("backend: redis needs tollgate built with the redis feature".into())
            }
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
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.decides_now(),
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
