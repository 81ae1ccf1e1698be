//! The rules file as written: the serde model, with every check that can
//! point at a line done while parsing.

use std::collections::BTreeSet;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::at::At;
use super::key_part::KeyConfig;
use super::names::{
    BackendErrorName, CaseName, ForwardedHeaderName, HeaderStyleName, Matching, MissingKeyName,
    PriorityName, TrailingSlashName,
};
use super::pattern::{Compare, PathPattern, PathPrefix};
use super::period::Period;
use super::quotas::QuotaList;
use super::response::{CountStatusConfig, PartitionKeyConfig};

mod backend;

pub(crate) use backend::{
    BackendConfig, RedisTlsConfig, RedisUrl, SentinelConfig, default_redis_timeout,
};

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RulesFile {
    #[serde(default)]
    pub backend: BackendConfig,
    #[serde(default)]
    pub headers: HeaderStyleName,
    /// Draft-11's `pk`: `random` (per process) or 32 hex digits of secret.
    #[serde(default)]
    pub partition_key: Option<PartitionKeyConfig>,
    #[serde(default)]
    pub on_backend_error: BackendErrorName,
    #[serde(default)]
    pub on_missing_key: MissingKeyName,
    /// How long to wait for the backend.
    #[serde(default = "default_timeout")]
    pub timeout: Period,
    #[serde(default)]
    pub matching: Matching,
    #[serde(default)]
    pub client_ip: ClientIpConfig,
    #[serde(default)]
    pub allow: KeyList,
    #[serde(default)]
    pub deny: KeyList,
    /// Load shedding for the whole file: 503 under overload, lowest
    /// priority first.
    #[serde(default)]
    pub shedding: Option<At<SheddingConfig>>,
    /// The share of a quota above which an admitted decision counts in the
    /// near-limit metric (0 to 1).
    #[serde(default)]
    pub near_limit: Option<At<f64>>,
    pub rules: Vec<RuleConfig>,
}

/// The `shedding:` section: how the load is measured, and the share kept
/// for critical rules. Checked when compiled, so errors keep their place.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct SheddingConfig {
    /// Requests in flight at full load.
    pub max_in_flight: At<u64>,
    /// The latency (a moving average) at full load (a period is never 0).
    pub target_latency: At<Period>,
    /// The share of capacity kept for critical rules (0 to 0.5).
    #[serde(default = "default_reserved")]
    pub reserved: At<f64>,
    /// The `Retry-After` of a shed request.
    #[serde(default = "default_retry_after")]
    pub retry_after: Period,
}

fn default_reserved() -> At<f64> {
    At::unplaced(0.2)
}

fn default_retry_after() -> Period {
    Period(Duration::from_secs(1))
}

/// A rule's `concurrency:` setting: requests of one key at once.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ConcurrencyConfig {
    pub limit: At<u64>,
    /// The ceiling while the server has room (needs `shedding:`, whose
    /// measured load says when).
    #[serde(default)]
    pub elastic: Option<At<u64>>,
}

fn default_timeout() -> Period {
    Period(Duration::from_millis(100))
}

/// How the client IP is found (for `client_ip` keys and the IP lists).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientIpConfig {
    #[serde(default)]
    pub trusted_proxies: Vec<Cidr>,
    #[serde(default)]
    pub hops: Option<At<usize>>,
    #[serde(default)]
    pub header: ForwardedHeaderName,
    #[serde(default = "default_v6_prefix", deserialize_with = "v6_prefix")]
    pub ipv6_prefix: u8,
}

fn default_v6_prefix() -> u8 {
    64
}

impl ClientIpConfig {
    /// The key of the connection's peer under this section's IPv6 prefix.
    pub(crate) fn peer_ip(&self) -> crate::key::PeerIp {
        crate::key::PeerIp::new().ipv6_prefix(self.ipv6_prefix)
    }
}

/// A file without `client_ip`: the peer, IPv6 grouped by /64, as with the
/// section and no `ipv6_prefix`. Written out: a derived default would make
/// the prefix 0, and every IPv6 client one key.
impl Default for ClientIpConfig {
    fn default() -> Self {
        ClientIpConfig {
            trusted_proxies: Vec::new(),
            hops: None,
            header: ForwardedHeaderName::default(),
            ipv6_prefix: default_v6_prefix(),
        }
    }
}

fn v6_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    match u8::deserialize(d)? {
        bits @ 1..=128 => Ok(bits),
        bits => Err(de::Error::custom(format!(
            "an IPv6 prefix of {bits} bits; write 1 to 128 (64 is one host's network)"
        ))),
    }
}

/// Keys and networks, for the allowlist and the denylist.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyList {
    #[serde(default)]
    pub ips: Vec<Cidr>,
    #[serde(default)]
    pub keys: BTreeSet<String>,
}

/// A network, or a single address (taken as /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Cidr(pub IpNet);

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        // Parsed as the trusted proxies are: IPv4-mapped IPv6 is IPv4.
        s.parse::<crate::key::Network>()
            .map(|net| Cidr(net.into()))
            .map_err(|_| {
                de::Error::custom(format!(
                    "{s:?} is not an IP address or network (such as 10.0.0.0/8)"
                ))
            })
    }
}

/// One rule.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleConfig {
    pub name: At<RuleName>,
    #[serde(default, rename = "match")]
    pub matches: MatchConfig,
    pub key: KeyConfig,
    /// What one request spends; checked against the quotas once they are
    /// known, so it keeps its place in the file.
    #[serde(default = "one")]
    pub cost: At<u64>,
    /// Response-aware: count only responses with these statuses.
    #[serde(default)]
    pub count_status: Option<CountStatusConfig>,
    /// Usage known from the response (LLM tokens): reserve an estimate,
    /// settle with the real cost the response reports.
    #[serde(default)]
    pub cost_from_response: Option<At<CostFromResponseConfig>>,
    /// Rate quotas; none for a rule with only a concurrency limit.
    #[serde(default)]
    pub quotas: QuotaList,
    #[serde(default)]
    pub overrides: Vec<At<OverrideConfig>>,
    /// At most so many requests of one key at once.
    #[serde(default)]
    pub concurrency: Option<ConcurrencyConfig>,
    /// Which requests are shed first under load.
    #[serde(default)]
    pub priority: PriorityName,
    /// The penalty box: so many refusals within a time block the key.
    #[serde(default)]
    pub penalty: Option<super::penalty::PenaltyConfig>,
}

/// `cost_from_response`: where the real cost is read, and what is reserved
/// until it is known.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct CostFromResponseConfig {
    /// The response header (or HTTP/2 / gRPC trailer) that carries the
    /// real cost, a decimal integer.
    pub header: HeaderNameConfig,
    /// What is reserved before the response, unless `reserve_header`
    /// gives it.
    pub reserve: u64,
    /// A request header with the estimate (such as the `max_tokens` a
    /// client asks for); missing or not a number, `reserve` holds.
    #[serde(default)]
    pub reserve_header: Option<HeaderNameConfig>,
}

fn one() -> At<u64> {
    At::unplaced(1)
}

/// A rule name: it names the rule's counters, so it must be set and short.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RuleName(pub String);

impl<'de> Deserialize<'de> for RuleName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() || s.len() > 64 || !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(de::Error::custom(
                "a rule name is 1 to 64 visible ASCII characters, no spaces",
            ));
        }
        Ok(RuleName(s))
    }
}

/// What a request must look like for a rule to apply. Everything given must
/// hold; an empty match applies to every request.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct MatchConfig {
    /// An axum-style pattern: `/users/{id}`, `/files/{*path}`.
    #[serde(default)]
    pub path: Option<PathPattern>,
    /// A path prefix: `/api/`.
    #[serde(default)]
    pub prefix: Option<PathPrefix>,
    #[serde(default)]
    pub methods: Vec<MethodName>,
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
    /// Whether `/a/` is `/a` (`ignore`, the default) or not (`strict`).
    #[serde(default)]
    pub trailing_slash: TrailingSlashName,
    /// Whether `/A` is `/a` (`insensitive`, the default) or not (`sensitive`).
    #[serde(default)]
    pub case: CaseName,
}

impl MatchConfig {
    /// How paths are compared for this rule.
    pub(crate) fn compare(&self) -> Compare {
        Compare {
            trailing_slash: self.trailing_slash.0,
            case: self.case.0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeaderMatch {
    pub name: HeaderNameConfig,
    /// The exact value; without one, the header only has to be present.
    #[serde(default)]
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeaderNameConfig(pub http::HeaderName);

impl<'de> Deserialize<'de> for HeaderNameConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::HeaderName::try_from(s.as_str())
            .map(HeaderNameConfig)
            .map_err(|_| de::Error::custom(format!("{s:?} is not a valid header name")))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MethodName(pub http::Method);

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::Method::from_bytes(s.to_ascii_uppercase().as_bytes())
            .map(MethodName)
            .map_err(|_| de::Error::custom(format!("{s:?} is not an HTTP method")))
    }
}

/// Different limits for some key values (tiers).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct OverrideConfig {
    pub keys: BTreeSet<String>,
    /// Multiply every quota's limit and burst.
    #[serde(default)]
    pub multiply: Option<u64>,
    /// Or replace the quotas.
    #[serde(default)]
    pub quotas: Option<QuotaList>,
}

#[cfg(test)]
mod usage_tests {
    use super::*;

    #[test]
    fn cost_from_response_as_written() {
        let c: CostFromResponseConfig =
            serde_saphyr::from_str("{ header: x-usage-total-tokens, reserve: 500 }").unwrap();
        assert_eq!(c.header.0, "x-usage-total-tokens");
        assert_eq!(c.reserve, 500);
        assert!(c.reserve_header.is_none());
        let c: CostFromResponseConfig = serde_saphyr::from_str(
            "{ header: x-usage-total-tokens, reserve: 500, reserve_header: x-max-tokens }",
        )
        .unwrap();
        assert_eq!(c.reserve_header.unwrap().0, "x-max-tokens");
        for bad in [
            "{ header: x-usage-total-tokens }",
            "{ reserve: 500 }",
            "{ header: \"bad header\", reserve: 500 }",
            "{ header: x-usage-total-tokens, reserve: -1 }",
            "{ header: x-usage-total-tokens, reserve: 500, extra: 1 }",
        ] {
            assert!(
                serde_saphyr::from_str::<CostFromResponseConfig>(bad).is_err(),
                "{bad}"
            );
        }
    }
}
