//! The rules file's `backend:` section: memory, or Redis (one server, a
//! cluster, Sentinel), with its URL and password kept out of debug output.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::super::at::At;
use super::super::names::{LeaseText, RedisFailureName};
use super::super::period::Period;

// Made once per load of the file and never moved on a hot path: boxing the
// Redis settings would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub(crate) enum BackendConfig {
    Memory {
        #[serde(default = "default_max_keys", deserialize_with = "at_least_one")]
        max_keys: usize,
    },
    /// Redis: exactly one of `url`, `cluster` and `sentinel` says where.
    Redis {
        /// One Redis (`redis://` or `rediss://`).
        #[serde(default)]
        url: Option<At<RedisUrl>>,
        /// A Redis Cluster: the URLs of some or all of its nodes.
        #[serde(default)]
        cluster: Option<At<Vec<RedisUrl>>>,
        /// The master that Redis Sentinel names.
        #[serde(default)]
        sentinel: Option<At<SentinelConfig>>,
        /// Certificates for `rediss://` beyond the public roots.
        #[serde(default)]
        tls: RedisTlsConfig,
        #[serde(default = "default_prefix")]
        prefix: String,
        /// How long one Redis call may take.
        #[serde(default = "default_redis_timeout")]
        timeout: Period,
        /// What to do when Redis fails: `error` (the top-level
        /// `on_backend_error` applies) or `memory` (decide in this process).
        #[serde(default)]
        on_failure: RedisFailureName,
        /// Lease mode: `off`, `auto` or the most units one lease holds.
        #[serde(default)]
        lease: At<LeaseText>,
    },
}

/// A Redis URL, which may hold a password: shown (`Debug`, `Display`) with
/// the password hidden; [`RedisUrl::expose`] gives it whole, for connecting.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(transparent)]
pub(crate) struct RedisUrl(String);

impl RedisUrl {
    pub(crate) fn new(url: String) -> Self {
        RedisUrl(url)
    }

    /// The URL with its password, only to connect with.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::backend::redis_url_redacted(&self.0))
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", crate::backend::redis_url_redacted(&self.0))
    }
}

/// `sentinel:` under `backend: redis`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SentinelConfig {
    /// The master's name in the sentinels' configuration.
    pub master: String,
    /// The sentinels' URLs (their credentials are the sentinels').
    pub urls: Vec<RedisUrl>,
    /// The master's username, when not the sentinels'.
    #[serde(default)]
    pub username: Option<String>,
    /// The master's password, when not the sentinels'.
    #[serde(default)]
    pub password: Option<Password>,
}

/// A password, never shown.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(transparent)]
pub(crate) struct Password(pub String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// `tls:` under `backend: redis`: PEM files, relative to the rules file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RedisTlsConfig {
    /// The CAs to trust instead of the public roots.
    #[serde(default)]
    pub ca_file: Option<At<PathBuf>>,
    /// A client certificate (mutual TLS), with `key_file`.
    #[serde(default)]
    pub cert_file: Option<At<PathBuf>>,
    /// The client certificate's private key.
    #[serde(default)]
    pub key_file: Option<At<PathBuf>>,
}

pub(crate) fn default_redis_timeout() -> Period {
    Period(Duration::from_millis(50))
}

fn default_max_keys() -> usize {
    1_000_000
}

/// A count that must not be zero.
fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    match usize::deserialize(d)? {
        0 => Err(de::Error::custom("must be at least 1")),
        n => Ok(n),
    }
}

fn default_prefix() -> String {
    "tollgate:".into()
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig::Memory {
            max_keys: default_max_keys(),
        }
    }
}
