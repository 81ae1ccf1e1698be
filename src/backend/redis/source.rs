//! Where a Redis backend's connections come from, as configured: one
//! server, a cluster or Sentinel's master, with TLS certificates.

use deadpool_redis::Runtime;
use deadpool_redis::redis::{self, IntoConnectionInfo};

use super::config_error::RedisConfigError;
use super::connection::{Connections, Source};
use crate::backend::redis_url_redacted as redact;
use crate::backend::{BackendError, BackendErrorKind};

pub(super) enum SourceConfig {
    Url(String),
    Pool(deadpool_redis::Pool),
    ClusterUrls(Vec<String>),
    ClusterPool(deadpool_redis::cluster::Pool),
    Sentinel { master: String, urls: Vec<String> },
}

/// Certificates for TLS connections, beyond what `rediss://` alone gives.
#[derive(Clone, Default)]
pub(super) struct Tls {
    /// The CAs to trust instead of the built-in public roots (PEM).
    pub(super) ca: Option<Vec<u8>>,
    /// A client certificate chain and its key (PEM), for servers that ask.
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl Tls {
    fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    /// The certificates for the redis client, checked: a PEM file with no
    /// certificate in it would otherwise trust nothing and fail every
    /// connection later, far from the mistake.
    fn certificates(&self) -> Result<redis::TlsCertificates, RedisConfigError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = |pem: &[u8], what: &str| {
            let n = CertificateDer::pem_slice_iter(pem)
                .try_fold(0, |n, c| c.map(|_| n + 1))
                .map_err(|e| RedisConfigError::Tls(format!("{what}: {e}")))?;
            if n == 0 {
                return Err(RedisConfigError::Tls(format!(
                    "{what}: no PEM certificate in it"
                )));
            }
            Ok(())
        };
        if let Some(ca) = &self.ca {
            certs(ca, "the CA")?;
        }
        if let Some((cert, key)) = &self.client {
            certs(cert, "the client certificate")?;
            // The key's text is never quoted: only whether it parsed.
            PrivateKeyDer::from_pem_slice(key).map_err(|_| {
                RedisConfigError::Tls("the client key: no PEM private key in it".into())
            })?;
        }
        Ok(redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        })
    }
}

/// Makes rustls's ring provider the process's default if none is: rustls
/// picks one by itself only when exactly one is compiled in, and another
/// crate of the program may bring aws-lc-rs. Called only when TLS is used,
/// so that a program that installs its own provider later is not refused.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: one provider is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

fn uses_tls(info: &redis::ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
}

/// Parses `url`, naming it (password hidden) in the error.
fn parse(url: &str) -> Result<redis::ConnectionInfo, RedisConfigError> {
    url.into_connection_info()
        .map_err(|e| RedisConfigError::Pool(format!("{}: {e}", redact(url))))
}

/// Certificates given for URLs without TLS are refused: they would be
/// ignored, and the connection made in the clear.
fn check_tls(has_certificates: bool, uses_tls: bool) -> Result<(), RedisConfigError> {
    if has_certificates && !uses_tls {
        return Err(RedisConfigError::Tls(
            "a CA or client certificate is set, so the URLs must be rediss://".into(),
        ));
    }
    if uses_tls {
        ensure_crypto_provider();
    }
    Ok(())
}

/// A client of the one server at `url`, with `tls`'s certificates.
pub(super) fn client(url: &str, tls: &Tls) -> Result<redis::Client, RedisConfigError> {
    let info = parse(url)?;
    check_tls(tls.is_set(), uses_tls(&info))?;
    let client = if tls.is_set() {
        redis::Client::build_with_tls(info, tls.certificates()?)
    } else {
        redis::Client::open(info)
    };
    client.map_err(|e| RedisConfigError::Pool(format!("{}: {e}", redact(url))))
}

/// Connections to the one server at `url`, made when first needed: the
/// concurrency slots' and the outbound pacer's own, where they are not
/// made on a backend's.
pub(crate) fn connections(url: &str) -> Result<Connections, BackendError> {
    source(SourceConfig::Url(url.to_owned()), &Tls::default(), None)
        .map(Connections::new)
        .map_err(|e| BackendError::new(BackendErrorKind::Misconfigured, e.to_string()))
}

/// Where the backend's connections will come from; nothing is connected.
pub(super) fn source(
    config: SourceConfig,
    tls: &Tls,
    master_auth: Option<(String, String)>,
) -> Result<Source, RedisConfigError> {
    let certificates = if tls.is_set() {
        Some(tls.certificates()?)
    } else {
        None
    };
    let has_certificates = certificates.is_some();
    let needs_tls = move |uses: bool| check_tls(has_certificates, uses);
    let source = match config {
        SourceConfig::Pool(pool) => Source::Single(pool),
        SourceConfig::ClusterPool(pool) => Source::Cluster(pool),
        SourceConfig::Url(url) => {
            let client = client(&url, tls)?;
            let manager = deadpool_redis::Manager::new(client.get_connection_info().clone())
                .map_err(|e| RedisConfigError::Pool(format!("{}: {e}", redact(&url))))?;
            Source::Single(
                deadpool_redis::Pool::builder(manager)
                    .runtime(Runtime::Tokio1)
                    .build()
                    .map_err(|e| RedisConfigError::Pool(e.to_string()))?,
            )
        }
        SourceConfig::ClusterUrls(urls) => {
            let infos = urls
                .iter()
                .map(|u| parse(u))
                .collect::<Result<Vec<_>, _>>()?;
            needs_tls(infos.iter().any(uses_tls))?;
            let mut builder = redis::cluster::ClusterClientBuilder::new(infos);
            if let Some(c) = certificates {
                builder = builder.certs(c);
            }
            Source::ClusterClient(builder.build().map_err(|e| {
                let urls: Vec<String> = urls.iter().map(|u| redact(u)).collect();
                RedisConfigError::Pool(format!("{}: {e}", urls.join(", ")))
            })?)
        }
        SourceConfig::Sentinel { master, urls } => {
            sentinel(&master, &urls, certificates, master_auth, needs_tls)?
        }
    };
    Ok(source)
}

/// A Sentinel source: the sentinels' credentials from their URLs (one set
/// for all), the master's from `master_auth` or else the same.
fn sentinel(
    master: &str,
    urls: &[String],
    certificates: Option<redis::TlsCertificates>,
    master_auth: Option<(String, String)>,
    needs_tls: impl Fn(bool) -> Result<(), RedisConfigError>,
) -> Result<Source, RedisConfigError> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let infos = urls
        .iter()
        .map(|u| parse(u))
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = infos.first() else {
        return Err(RedisConfigError::Pool(
            "Sentinel needs at least one sentinel URL".into(),
        ));
    };
    if master.is_empty() {
        return Err(RedisConfigError::Pool(
            "Sentinel needs the master's name".into(),
        ));
    }
    let auth = |i: &redis::ConnectionInfo| {
        let r = i.redis_settings();
        (
            r.username().map(str::to_owned),
            r.password().map(str::to_owned),
        )
    };
    let sentinel_auth = auth(first);
    let tls = uses_tls(first);
    if infos
        .iter()
        .any(|i| auth(i) != sentinel_auth || uses_tls(i) != tls)
    {
        return Err(RedisConfigError::Pool(
            "the sentinel URLs must share one scheme, username and password".into(),
        ));
    }
    needs_tls(tls)?;
    let error = |e: redis::RedisError| RedisConfigError::Pool(format!("Sentinel: {e}"));
    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        master,
        SentinelServerType::Master,
    )
    .map_err(error)?;
    if let Some(user) = &sentinel_auth.0 {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = &sentinel_auth.1 {
        builder = builder.set_client_to_sentinel_password(password);
    }
    let (user, password) = match master_auth {
        Some((user, password)) => ((!user.is_empty()).then_some(user), Some(password)),
        None => sentinel_auth,
    };
    if let Some(user) = user {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = password {
        builder = builder.set_client_to_redis_password(password);
    }
    if tls {
        builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
    }
    if let Some(c) = certificates {
        builder = builder
            .set_client_to_sentinel_certificates(c.clone())
            .set_client_to_redis_certificates(c);
    }
    let client = builder.build().map_err(error)?;
    Ok(Source::Sentinel(tokio::sync::Mutex::new(client)))
}
