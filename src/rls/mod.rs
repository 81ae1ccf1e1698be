//! Envoy's rate limit service: `ShouldRateLimit` of
//! `envoy.service.ratelimit.v3.RateLimitService` over gRPC, configured by
//! envoyproxy/ratelimit's YAML files, decided by any of tollgate's
//! algorithms on any backend (what `tollgate rls` serves).
//!
//! ```no_run
//! use std::time::Duration;
//! use tollgate::MemoryBackend;
//! use tollgate::rls::{LoadOptions, RlsConfig, RlsService};
//! use tollgate::rules::AnyBackend;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = RlsConfig::load("ratelimit/config", LoadOptions::default())?;
//! let service = RlsService::new(config, AnyBackend::Memory(MemoryBackend::new()));
//! service.watch("ratelimit/config", LoadOptions::default(), Duration::from_secs(1));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8081").await?;
//! service.serve(listener).await?;
//! # Ok(()) }
//! ```
//!
//! Differences from the reference, on purpose: limits name an
//! `algorithm:` (sliding windows when none is named; `fixed_window`
//! counts as the reference does); the descriptors of one call are decided
//! together, so a refused call spends from none of them; a refused hit is
//! not counted.

mod answer;
mod config;
mod decide;
mod proto;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;

pub use config::{DEFAULT_ALGORITHM, LoadOptions, RlsConfig, RlsConfigError};

use crate::quota::Algorithm;
use crate::rules::AnyBackend;

/// What a call answers when the backend fails (Redis down, or slower than
/// its timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBackendError {
    /// A gRPC `UNAVAILABLE` error: Envoy applies its `failure_mode_deny`.
    #[default]
    Error,
    /// Every descriptor within its limit.
    Allow,
    /// Every descriptor over its limit.
    Deny,
}

/// The rate limit service: the configuration in force and the backend.
/// Clones share both.
#[derive(Clone)]
pub struct RlsService {
    inner: Arc<ServiceInner>,
}

pub(crate) struct ServiceInner {
    config: ArcSwap<RlsConfig>,
    backend: AnyBackend,
    on_backend_error: OnBackendError,
    /// The algorithm of requests' own limits (`limit` overrides).
    algorithm: Algorithm,
}

impl std::fmt::Debug for RlsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RlsService")
            .field("domains", &self.inner.config.load().domains())
            .finish_non_exhaustive()
    }
}

impl RlsService {
    /// A service of `config` deciding on `backend`; a backend failure
    /// answers a gRPC error.
    pub fn new(config: RlsConfig, backend: AnyBackend) -> Self {
        RlsService::with_options(config, backend, OnBackendError::Error, DEFAULT_ALGORITHM)
    }

    /// A service with what a backend failure answers, and the algorithm of
    /// requests' own limit overrides.
    pub fn with_options(
        config: RlsConfig,
        backend: AnyBackend,
        on_backend_error: OnBackendError,
        algorithm: Algorithm,
    ) -> Self {
        RlsService {
            inner: Arc::new(ServiceInner {
                config: ArcSwap::from_pointee(config),
                backend,
                on_backend_error,
                algorithm,
            }),
        }
    }

    /// Puts `config` in force for the calls that start from now on.
    pub fn replace(&self, config: RlsConfig) {
        self.inner.config.store(Arc::new(config));
    }

    /// Serves gRPC on `listener` until the process ends (HTTP/2 without
    /// TLS, as Envoy's `envoy_grpc` cluster speaks it).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
    ) -> Result<(), tonic::transport::Error> {
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(proto::RateLimitServer::new(Arc::new(self)))
            .serve_with_incoming(incoming)
            .await
    }

    /// Reads `path` as [`RlsConfig::load`] does with `options` every `every` on a thread of
    /// its own, and puts a new version in force once it has read the same
    /// text twice in a row, so that a file caught half-written is never
    /// loaded; an invalid version is logged and the one in force stays. The
    /// thread ends when every handle to the service is gone.
    pub fn watch(&self, path: impl AsRef<Path>, options: LoadOptions, every: Duration) {
        let path: PathBuf = path.as_ref().to_path_buf();
        let weak: Weak<ServiceInner> = Arc::downgrade(&self.inner);
        let spawned = std::thread::Builder::new()
            .name("tollgate-rls-reload".into())
            .spawn(move || {
                let mut in_force = config::read_all(&path).ok();
                let mut seen = in_force.clone();
                let errors = crate::log_limit::LogLimit::new();
                loop {
                    std::thread::sleep(every);
                    let Some(inner) = weak.upgrade() else { return };
                    let read = config::read_all(&path).ok();
                    let stable = read == seen;
                    seen = read.clone();
                    let (true, Some(files)) = (stable, read) else {
                        continue;
                    };
                    if in_force.as_ref() == Some(&files) {
                        continue;
                    }
                    match RlsConfig::parse_files(files.clone(), options) {
                        Ok(config) => {
                            inner.config.store(Arc::new(config));
                            tracing::info!("rate limit configuration reloaded");
                        }
                        Err(error) => {
                            if let Some(more) = errors.admit() {
                                tracing::error!(%error, "rate limit configuration invalid; keeping the one in force{more}");
                            }
                        }
                    }
                    in_force = Some(files);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the configuration watcher");
        }
    }
}

impl proto::Decide for RlsService {
    async fn should_rate_limit(
        &self,
        request: proto::RateLimitRequest,
    ) -> Result<proto::RateLimitResponse, tonic::Status> {
        self.inner.decide(request).await
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::{Duration, Instant};

    use super::{LoadOptions, RlsConfig, RlsService};
    use crate::MemoryBackend;
    use crate::rules::AnyBackend;

    /// The `requests_per_unit` in force for key `k` of domain `d`.
    fn limit_of(service: &RlsService, k: &str) -> Option<u32> {
        let config = service.inner.config.load();
        let found = config.domains.get("d")?.find("d", [(k, "v")].into_iter())?;
        Some(found.limit.requests_per_unit)
    }

    fn item(key: &str, per_day: u32) -> String {
        format!("  - key: {key}\n    rate_limit: {{ unit: day, requests_per_unit: {per_day} }}\n")
    }

    #[test]
    fn a_file_rewritten_in_place_applies_only_once_complete() {
        let dir = std::env::temp_dir().join(format!("tollgate-rls-inplace-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.yaml");
        let head = "domain: d\ndescriptors:\n";
        std::fs::write(
            &path,
            format!("{head}{}{}", item("login", 2), item("original", 9)),
        )
        .unwrap();
        // The new version: twelve limits, then login's. Cut after any of
        // them it is a valid file in which login is not limited.
        let mut pieces: Vec<String> = (0..12).map(|i| item(&format!("r{i}"), 100)).collect();
        pieces[0].insert_str(0, head);
        pieces.push(item("login", 2));
        let mut prefix = String::new();
        for piece in &pieces {
            prefix.push_str(piece);
            assert!(RlsConfig::parse("prefix", &prefix).is_ok(), "{prefix}");
        }
        let service = RlsService::new(
            RlsConfig::load(&path, LoadOptions::default()).unwrap(),
            AnyBackend::Memory(MemoryBackend::new()),
        );
        service.watch(&path, LoadOptions::default(), Duration::from_millis(200));
        // Truncate, then write a limit at a time a tenth of the interval
        // apart: the writing spans ticks, and between two ticks the file
        // always changed.
        let writing = path.clone();
        let writer = std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&writing)
                .unwrap();
            for piece in pieces {
                f.write_all(piece.as_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let started = Instant::now();
        loop {
            let original = limit_of(&service, "original") == Some(9);
            let complete = limit_of(&service, "r11") == Some(100);
            assert!(
                original || complete,
                "a half-written version was put in force"
            );
            assert_eq!(limit_of(&service, "login"), Some(2), "login lost its limit");
            if writer.is_finished() && complete {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the complete file was never put in force"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        writer.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
