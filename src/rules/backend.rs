//! The backend a rules file names ([`AnyBackend`], made from its settings).

use std::path::{Path, PathBuf};

use super::at::At;
use super::model::{BackendConfig, RedisTlsConfig, RedisUrl, SentinelConfig};
pub use crate::backend::AnyBackend;
use crate::backend::MemoryBackend;
use crate::layer::ConcurrencyQuota;
use crate::quota_set::QuotaSet;

impl AnyBackend {
    /// The backend `config` names; relative file names in it are read from
    /// `base`'s folder (the rules file's).
    pub(crate) fn from_config(config: &BackendConfig, base: Option<&Path>) -> Result<Self, String> {
        match config {
            BackendConfig::Memory { max_keys } => Ok(AnyBackend::Memory(
                MemoryBackend::builder().max_keys(*max_keys).build(),
            )),
            #[cfg(feature = "redis")]
            BackendConfig::Redis {
                prefix,
                timeout,
                on_failure,
                lease,
                ..
            } => {
                use crate::backend::redis::{Lease, OnFailure};
                let on_failure = match on_failure.0 {
                    super::names::RedisFailure::Error => OnFailure::Error,
                    super::names::RedisFailure::Memory => OnFailure::Fallback(MemoryBackend::new()),
                };
                let lease_mode: Lease = lease
                    .value
                    .0
                    .parse()
                    .map_err(|e| lease.error(format!("backend: redis: {e}")))?;
                let (builder, at) = redis_builder(config, base)?;
                builder
                    .prefix(prefix.clone())
                    .timeout(timeout.0)
                    .on_failure(on_failure)
                    .lease(lease_mode)
                    .build()
                    .map(AnyBackend::Redis)
                    .map_err(|e| at.error(format!("backend: redis: {e}")))
            }
            #[cfg(not(feature = "redis"))]
            BackendConfig::Redis { .. } => {
                let _ = base;
                Err("backend: redis needs tollgate built with the redis feature".to_owned())
            }
        }
    }
}

/// Where a `backend: redis` section says Redis is: exactly one of `url`,
/// `cluster` and `sentinel`.
#[cfg(feature = "redis")]
fn redis_place(config: &BackendConfig) -> Result<RedisPlace<'_>, String> {
    let BackendConfig::Redis {
        url,
        cluster,
        sentinel,
        ..
    } = config
    else {
        return Err("not a Redis backend".into());
    };
    match (url, cluster, sentinel) {
        (Some(url), None, None) => Ok(RedisPlace::Url(url)),
        (None, Some(cluster), None) if cluster.value.is_empty() => {
            Err(cluster.error("backend: redis: cluster needs at least one node URL"))
        }
        (None, Some(cluster), None) => Ok(RedisPlace::Cluster(cluster)),
        (None, None, Some(sentinel)) => Ok(RedisPlace::Sentinel(sentinel)),
        (None, None, None) => Err(
            "backend: redis needs where Redis is: url, cluster (node URLs) or sentinel (master and urls)"
                .into(),
        ),
        _ => Err("backend: redis: give only one of url, cluster and sentinel".into()),
    }
}

#[cfg(feature = "redis")]
enum RedisPlace<'a> {
    Url(&'a At<RedisUrl>),
    Cluster(&'a At<Vec<RedisUrl>>),
    Sentinel(&'a At<SentinelConfig>),
}

/// A Redis backend's builder for `config`'s place and certificates, with
/// the setting to point errors at.
#[cfg(feature = "redis")]
fn redis_builder<'a>(
    config: &'a BackendConfig,
    base: Option<&Path>,
) -> Result<(crate::backend::RedisBackendBuilder, &'a dyn Placed), String> {
    use crate::backend::redis::RedisBackend;
    let BackendConfig::Redis { tls, .. } = config else {
        return Err("not a Redis backend".into());
    };
    let (mut builder, at): (_, &dyn Placed) = match redis_place(config)? {
        RedisPlace::Url(url) => (RedisBackend::from_url(url.value.expose()), url),
        RedisPlace::Cluster(urls) => (
            RedisBackend::from_cluster_urls(urls.value.iter().map(RedisUrl::expose)),
            urls,
        ),
        RedisPlace::Sentinel(s) => {
            let mut builder = RedisBackend::from_sentinel(
                s.value.master.clone(),
                s.value.urls.iter().map(RedisUrl::expose),
            );
            match (&s.value.username, &s.value.password) {
                (user, Some(password)) => {
                    builder = builder
                        .sentinel_master_auth(user.clone().unwrap_or_default(), password.0.clone());
                }
                (Some(_), None) => {
                    return Err(s.error("backend: redis: sentinel: a username needs a password"));
                }
                (None, None) => {}
            }
            (builder, s)
        }
    };
    if let Some(ca) = &tls.ca_file {
        builder = builder.tls_ca(read_pem(ca, base)?);
    }
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            builder = builder.tls_client_cert(read_pem(cert, base)?, read_pem(key, base)?);
        }
        (Some(one), None) | (None, Some(one)) => {
            return Err(one.error("backend: redis: tls: cert_file and key_file go together"));
        }
        (None, None) => {}
    }
    Ok((builder, at))
}

/// A setting that knows where the file wrote it.
#[cfg(feature = "redis")]
trait Placed {
    /// `message`, prefixed with where the setting was written.
    fn error(&self, message: String) -> String;
}

#[cfg(feature = "redis")]
impl<T> Placed for At<T> {
    fn error(&self, message: String) -> String {
        At::error(self, message)
    }
}

/// A PEM file's bytes; a relative name is read from `base`'s folder.
#[cfg(feature = "redis")]
fn read_pem(file: &At<PathBuf>, base: Option<&Path>) -> Result<Vec<u8>, String> {
    let path = match base.and_then(Path::parent) {
        Some(dir) if file.value.is_relative() => dir.join(&file.value),
        _ => file.value.clone(),
    };
    std::fs::read(&path).map_err(|e| {
        file.error(format!(
            "backend: redis: tls: cannot read {}: {e}",
            path.display()
        ))
    })
}

/// Where a gateway's Redis is, chosen on its command line rather than in
/// the rules file: see [`Loader::redis`](super::Loader::redis).
/// It replaces the file's `backend` whole, with the default key prefix
/// and timeout.
#[derive(Debug, Clone)]
pub struct RedisTarget {
    pub(super) config: BackendConfig,
}

impl RedisTarget {
    fn new(
        url: Option<String>,
        cluster: Option<Vec<String>>,
        sentinel: Option<(String, Vec<String>)>,
    ) -> Self {
        let urls = |v: Vec<String>| v.into_iter().map(RedisUrl::new).collect();
        RedisTarget {
            config: BackendConfig::Redis {
                url: url.map(|u| At::unplaced(RedisUrl::new(u))),
                cluster: cluster.map(|c| At::unplaced(urls(c))),
                sentinel: sentinel.map(|(master, u)| {
                    At::unplaced(SentinelConfig {
                        master,
                        urls: urls(u),
                        username: None,
                        password: None,
                    })
                }),
                tls: RedisTlsConfig::default(),
                prefix: "tollgate:".into(),
                timeout: super::model::default_redis_timeout(),
                on_failure: Default::default(),
                lease: Default::default(),
            },
        }
    }

    /// One Redis at `url` (`redis://` or `rediss://`).
    pub fn url(url: impl Into<String>) -> Self {
        RedisTarget::new(Some(url.into()), None, None)
    }

    /// A Redis Cluster reachable at any of `urls`.
    pub fn cluster(urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        RedisTarget::new(None, Some(urls.into_iter().map(Into::into).collect()), None)
    }

    /// The master that the sentinels at `urls` call `master` (the URLs'
    /// credentials serve the sentinels and the master alike).
    pub fn sentinel(
        master: impl Into<String>,
        urls: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let urls = urls.into_iter().map(Into::into).collect();
        RedisTarget::new(None, None, Some((master.into(), urls)))
    }

    fn tls(&mut self) -> Option<&mut RedisTlsConfig> {
        match &mut self.config {
            BackendConfig::Redis { tls, .. } => Some(tls),
            BackendConfig::Memory { .. } => None,
        }
    }

    /// Trusts the CAs in the PEM file at `path` instead of the public roots.
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        if let Some(tls) = self.tls() {
            tls.ca_file = Some(At::unplaced(path.into()));
        }
        self
    }

    /// Presents the client certificate in the PEM file `cert` with the key
    /// in `key` (mutual TLS).
    pub fn tls_client_cert_files(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        if let Some(tls) = self.tls() {
            tls.cert_file = Some(At::unplaced(cert.into()));
            tls.key_file = Some(At::unplaced(key.into()));
        }
        self
    }

    /// Lease mode: `off` (the default), `auto` or the most units one lease
    /// holds (see [`RedisBackendBuilder::lease`](crate::backend::RedisBackendBuilder::lease)).
    pub fn lease(mut self, mode: impl Into<String>) -> Self {
        if let BackendConfig::Redis { lease, .. } = &mut self.config {
            *lease = At::unplaced(super::names::LeaseText(mode.into()));
        }
        self
    }
}

/// A rule's concurrency quota with its slots where the backend keeps state:
/// in Redis for a Redis backend (on its connection, so wherever it keeps
/// its state: one server, a Cluster, a Sentinel's master, over TLS), so
/// that a fleet shares the limit (under `<prefix>concurrency:<rule>:`, one
/// set of slots per rule as in memory), in this process otherwise.
pub(crate) fn with_slots(
    backend: &AnyBackend,
    rule: &str,
    quota: ConcurrencyQuota,
) -> ConcurrencyQuota {
    match backend {
        #[cfg(feature = "redis")]
        AnyBackend::Redis(redis) => {
            let prefix = format!("{}concurrency:{rule}:", redis.prefix());
            quota.store(crate::backend::RedisSlots::on(redis, &prefix).timeout(redis.timeout()))
        }
        AnyBackend::Memory(_) => {
            let _ = rule;
            quota
        }
    }
}

impl AnyBackend {
    /// Why `quotas` cannot be used on this backend, if they cannot: a set
    /// that needs every arrival on a Redis backend that leases.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(crate) fn refuses(&self, quotas: &QuotaSet) -> Option<String> {
        match self {
            AnyBackend::Memory(_) => None,
            #[cfg(feature = "redis")]
            AnyBackend::Redis(r) => r.supports_leases(quotas).err().map(|e| e.to_string()),
        }
    }
}
