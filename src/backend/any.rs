//! A backend chosen at run time.

use std::fmt;

use super::{Backend, BackendError, CheckRequest, GiveBackRequest, MemoryBackend, Now, Reserved};
use crate::decision::Decision;

/// A backend chosen at run time, from configuration: in this process's
/// memory, or Redis (with the `redis` feature). [`Backend`] is not
/// dyn-compatible (its `check` returns `impl Future`), so a program that
/// picks its backend when it starts holds this enum, which forwards every
/// method to the backend inside.
///
/// ```
/// use std::time::Duration;
/// use tollgate::backend::AnyBackend;
/// use tollgate::{Limiter, Quota, QuotaSet};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let url = std::env::var("RATE_LIMIT_BACKEND").unwrap_or("memory://".into());
/// let backend = AnyBackend::from_url(&url)?;
/// let api = QuotaSet::new("api", [Quota::gcra(100, Duration::from_secs(60)).build()?])?;
/// let limiter = Limiter::new(backend, api);
/// assert!(limiter.check("user:42", 1).await?.allowed());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyBackend {
    /// This process's memory.
    Memory(MemoryBackend),
    /// Redis, shared by every server pointed at it.
    #[cfg(feature = "redis")]
    Redis(super::RedisBackend),
}

/// Why [`AnyBackend::from_url`] could not make a backend.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyBackendError {
    /// The URL's scheme is none of `memory`, `redis`, `rediss` (or names
    /// Redis in a build without the `redis` feature); the scheme is given.
    Scheme(String),
    /// The Redis backend refused its settings.
    #[cfg(feature = "redis")]
    Redis(super::RedisConfigError),
}

impl fmt::Display for AnyBackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyBackendError::Scheme(s)
                if cfg!(not(feature = "redis")) && s.starts_with("redis") =>
            {
                write!(
                    f,
                    "a {s}:// backend needs tollgate built with the redis feature"
                )
            }
            AnyBackendError::Scheme(s) => write!(
                f,
                "a backend URL starts with memory://, redis:// or rediss://, not {s:?}"
            ),
            #[cfg(feature = "redis")]
            AnyBackendError::Redis(e) => write!(f, "redis backend: {e}"),
        }
    }
}

impl std::error::Error for AnyBackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            #[cfg(feature = "redis")]
            AnyBackendError::Redis(e) => Some(e),
            AnyBackendError::Scheme(_) => None,
        }
    }
}

impl AnyBackend {
    /// The backend a URL names: `memory://` (a [`MemoryBackend`] with its
    /// defaults), or `redis://...` and `rediss://...` (TLS), a Redis backend
    /// with its defaults on that URL, which may carry a user, password and
    /// database (`redis://:password@host:6379/0`). For other settings,
    /// build the backend itself and convert it (`AnyBackend::from(backend)`).
    /// The scheme is matched ignoring case; an error never repeats the URL,
    /// which may hold a password.
    pub fn from_url(url: &str) -> Result<Self, AnyBackendError> {
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        match scheme.to_ascii_lowercase().as_str() {
            "memory" => Ok(AnyBackend::Memory(MemoryBackend::new())),
            #[cfg(feature = "redis")]
            "redis" | "rediss" => super::RedisBackend::from_url(url)
                .build()
                .map(AnyBackend::Redis)
                .map_err(AnyBackendError::Redis),
            _ => Err(AnyBackendError::Scheme(scheme.chars().take(16).collect())),
        }
    }

    /// Whether the backend can decide at all, asked before serving: for
    /// Redis, [`RedisBackend::probe`](crate::RedisBackend::probe); memory
    /// always can.
    pub async fn probe(&self) -> Result<(), BackendError> {
        match self {
            AnyBackend::Memory(_) => Ok(()),
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.probe().await,
        }
    }
}

impl From<MemoryBackend> for AnyBackend {
    fn from(backend: MemoryBackend) -> Self {
        AnyBackend::Memory(backend)
    }
}

#[cfg(feature = "redis")]
impl From<super::RedisBackend> for AnyBackend {
    fn from(backend: super::RedisBackend) -> Self {
        AnyBackend::Redis(backend)
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

    async fn reset(&self, key: &str, quotas: &crate::QuotaSet) -> Result<(), BackendError> {
        match self {
            AnyBackend::Memory(m) => m.reset(key, quotas).await,
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.reset(key, quotas).await,
        }
    }

    async fn charge(&self, request: CheckRequest<'_>) -> Result<Decision, BackendError> {
        match self {
            AnyBackend::Memory(m) => m.charge(request).await,
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.charge(request).await,
        }
    }

    #[inline]
    fn check_now(&self, request: CheckRequest<'_>) -> Now {
        match self {
            AnyBackend::Memory(m) => m.check_now(request),
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.check_now(request),
        }
    }

    fn shared(&self) -> bool {
        match self {
            AnyBackend::Memory(m) => m.shared(),
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.shared(),
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
