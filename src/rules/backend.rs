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
}

impl AnyBackend {
    pub(crate) fn from_config(config: &BackendConfig) -> Result<Self, String> {
        match config {
            BackendConfig::Memory { max_keys } => Ok(AnyBackend::Memory(
                MemoryBackend::builder().max_keys(*max_keys).build(),
            )),
            BackendConfig::Redis { .. } => {
                Err("backend: redis needs tollgate built with the redis feature".into())
            }
        }
    }

    /// Whether decisions are made without waiting.
    pub(crate) fn decides_now(&self) -> bool {
        matches!(self, AnyBackend::Memory(_))
    }
}

impl Backend for AnyBackend {
    async fn check(&self, request: CheckRequest<'_>) -> Result<Decision, BackendError> {
        match self {
            AnyBackend::Memory(m) => m.check(request).await,
        }
    }

    fn check_now(&self, request: CheckRequest<'_>) -> Option<Result<Decision, BackendError>> {
        match self {
            AnyBackend::Memory(m) => m.check_now(request),
        }
    }
}
