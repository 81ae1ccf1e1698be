//! The rules file as written: the serde model, with every check that can
//! point at a line done while parsing.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::layer::{CountStatus, HeaderStyle, OnBackendError, OnMissingKey, PartitionKey};
use crate::quota::{Algorithm, Mode, Quota};

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
    pub rules: Vec<RuleConfig>,
}

fn default_timeout() -> Period {
    Period(Duration::from_millis(100))
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub(crate) enum BackendConfig {
    Memory {
        #[serde(default = "default_max_keys")]
        max_keys: usize,
    },
    Redis {
        url: String,
        #[serde(default = "default_prefix")]
        prefix: String,
        /// How long one Redis call may take.
        #[serde(default = "default_redis_timeout")]
        timeout: Period,
        /// What to do when Redis fails: `error` (the top-level
        /// `on_backend_error` applies) or `memory` (decide in this process).
        #[serde(default)]
        on_failure: RedisFailureName,
    },
}

pub(crate) fn default_redis_timeout() -> Period {
    Period(Duration::from_millis(50))
}

fn default_max_keys() -> usize {
    1_000_000
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

macro_rules! name_enum {
    ($name:ident => $target:ty { $($text:literal => $value:expr),+ $(,)? } default $default:literal) => {
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub(crate) struct $name(pub $target);

        impl Default for $name {
            fn default() -> Self {
                $name(Self::parse($default).unwrap_or_else(|_| unreachable!()))
            }
        }

        impl $name {
            fn parse(s: &str) -> Result<$target, String> {
                match s {
                    $($text => Ok($value),)+
                    _ => Err(format!(
                        "unknown value {s:?}; valid values are {}",
                        [$($text),+].join(", ")
                    )),
                }
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map($name).map_err(de::Error::custom)
            }
        }
    };
}

name_enum!(HeaderStyleName => HeaderStyle {
    "ietf" => HeaderStyle::Ietf,
    "draft6" => HeaderStyle::Draft6,
    "legacy" => HeaderStyle::Legacy,
    "none" => HeaderStyle::None,
} default "ietf");

name_enum!(BackendErrorName => OnBackendError {
    "allow" => OnBackendError::Allow,
    "reject" => OnBackendError::Reject,
} default "allow");

name_enum!(MissingKeyName => OnMissingKey {
    "reject" => OnMissingKey::Reject,
    "allow" => OnMissingKey::Allow,
} default "reject");

/// What the Redis backend does when Redis fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum RedisFailure {
    #[default]
    Error,
    Memory,
}

name_enum!(RedisFailureName => RedisFailure {
    "error" => RedisFailure::Error,
    "memory" => RedisFailure::Memory,
} default "error");

/// Which rules a request is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum MatchMode {
    /// The first rule that matches, in file order.
    #[default]
    First,
    /// Every rule that matches; the request must pass them all.
    All,
}

name_enum!(Matching => MatchMode {
    "first" => MatchMode::First,
    "all" => MatchMode::All,
} default "first");

name_enum!(ForwardedHeaderName => crate::key::ForwardedHeader {
    "x-forwarded-for" => crate::key::ForwardedHeader::XForwardedFor,
    "forwarded" => crate::key::ForwardedHeader::Forwarded,
    "x-real-ip" => crate::key::ForwardedHeader::XRealIp,
} default "x-forwarded-for");

/// How the client IP is found (for `client_ip` keys and the IP lists).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientIpConfig {
    #[serde(default)]
    pub trusted_proxies: Vec<Cidr>,
    #[serde(default)]
    pub hops: Option<usize>,
    #[serde(default)]
    pub header: ForwardedHeaderName,
    #[serde(default = "default_v6_prefix")]
    pub ipv6_prefix: u8,
}

fn default_v6_prefix() -> u8 {
    64
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
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(Cidr(net));
        }
        s.parse::<std::net::IpAddr>()
            .map(|ip| Cidr(IpNet::from(ip)))
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
    pub name: RuleName,
    #[serde(default, rename = "match")]
    pub matches: MatchConfig,
    pub key: KeyConfig,
    #[serde(default = "one")]
    pub cost: u64,
    /// Response-aware: count only responses with these statuses.
    #[serde(default)]
    pub count_status: Option<CountStatusConfig>,
    pub quotas: QuotaList,
    #[serde(default)]
    pub overrides: Vec<OverrideConfig>,
}

fn one() -> u64 {
    1
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
    pub prefix: Option<String>,
    #[serde(default)]
    pub methods: Vec<MethodName>,
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
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

/// A parsed path pattern.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PathPattern {
    pub text: String,
    pub segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Segment {
    Literal(String),
    /// `{name}`: exactly one segment.
    Param,
    /// `{*name}`: the rest of the path, possibly empty.
    Rest,
}

impl PathPattern {
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!("path pattern {text:?} must start with /"));
        };
        let mut segments = Vec::new();
        let parts: Vec<&str> = rest.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let segment = match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                Some(name) if name.starts_with('*') => {
                    if i + 1 != parts.len() {
                        return Err(format!("in {text:?}, {{{name}}} must be the last segment"));
                    }
                    Segment::Rest
                }
                Some(name) if !name.is_empty() && !name.contains(['{', '}']) => Segment::Param,
                _ if part.contains(['{', '}']) => {
                    return Err(format!(
                        "in {text:?}, {part:?} is not a literal, {{name}} or {{*name}}"
                    ));
                }
                _ => Segment::Literal((*part).to_owned()),
            };
            segments.push(segment);
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
        })
    }

    pub(crate) fn matches(&self, path: &str) -> bool {
        let mut parts = path.strip_prefix('/').unwrap_or(path).split('/');
        for segment in &self.segments {
            match segment {
                Segment::Rest => return true,
                Segment::Param => match parts.next() {
                    Some(p) if !p.is_empty() => {}
                    _ => return false,
                },
                Segment::Literal(l) => {
                    if parts.next() != Some(l.as_str()) {
                        return false;
                    }
                }
            }
        }
        parts.next().is_none()
    }
}

impl<'de> Deserialize<'de> for PathPattern {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PathPattern::parse(&s).map_err(de::Error::custom)
    }
}

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeyPart {
    PeerIp,
    ClientIp,
    Header(http::HeaderName),
    User,
    Global,
    Route,
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyPart::PeerIp => f.write_str("peer_ip"),
            KeyPart::ClientIp => f.write_str("client_ip"),
            KeyPart::Header(h) => write!(f, "header:{h}"),
            KeyPart::User => f.write_str("user"),
            KeyPart::Global => f.write_str("global"),
            KeyPart::Route => f.write_str("route"),
        }
    }
}

impl KeyPart {
    fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "peer_ip" => KeyPart::PeerIp,
            "client_ip" => KeyPart::ClientIp,
            "user" => KeyPart::User,
            "global" => KeyPart::Global,
            "route" => KeyPart::Route,
            _ => match s.strip_prefix("header:") {
                Some(h) => KeyPart::Header(
                    http::HeaderName::try_from(h)
                        .map_err(|_| format!("{h:?} is not a valid header name"))?,
                ),
                None => {
                    return Err(format!(
                        "unknown key {s:?}; valid keys are peer_ip, client_ip, header:<name>, user, global, route, or a list of them"
                    ));
                }
            },
        })
    }
}

/// `partition_key`: `random`, or a 16-byte secret as 32 hex digits.
#[derive(Debug, Clone)]
pub(crate) struct PartitionKeyConfig(pub PartitionKey);

impl PartialEq for PartitionKeyConfig {
    fn eq(&self, other: &Self) -> bool {
        self.0.of("") == other.0.of("")
    }
}

impl<'de> Deserialize<'de> for PartitionKeyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "random" {
            return Ok(PartitionKeyConfig(PartitionKey::random()));
        }
        let bad = || de::Error::custom("partition_key is `random` or a secret of 32 hex digits");
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut secret = [0u8; 16];
        for (i, byte) in secret.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(PartitionKeyConfig(PartitionKey::with_secret(secret)))
    }
}

/// `count_status`: a code or class (`401`, `"5xx"`), or a list of them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CountStatusConfig(pub CountStatus);

impl<'de> Deserialize<'de> for CountStatusConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Item {
            Code(u16),
            Text(String),
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(Item),
            Many(Vec<Item>),
        }
        let items = match OneOrMany::deserialize(d)? {
            OneOrMany::One(item) => vec![item],
            OneOrMany::Many(items) => items,
        };
        if items.is_empty() {
            return Err(de::Error::custom("count_status needs at least one status"));
        }
        items
            .iter()
            .try_fold(CountStatus::new(), |set, item| match item {
                Item::Code(code) => set.item(&code.to_string()),
                Item::Text(text) => set.item(text),
            })
            .map(CountStatusConfig)
            .map_err(de::Error::custom)
    }
}

/// A key: one part, or a list of parts combined.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyConfig(pub Vec<KeyPart>);

impl<'de> Deserialize<'de> for KeyConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        let parts = match OneOrMany::deserialize(d)? {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        };
        if parts.is_empty() {
            return Err(de::Error::custom("a key needs at least one part"));
        }
        parts
            .iter()
            .map(|p| KeyPart::parse(p))
            .collect::<Result<_, _>>()
            .map(KeyConfig)
            .map_err(de::Error::custom)
    }
}

/// A period: `500ms`, `10s`, `1m`, `1h`, `1d`, or a combination (`1m30s`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Period(pub Duration);

impl Period {
    pub(crate) fn parse(s: &str) -> Result<Duration, String> {
        let bad =
            || format!("{s:?} is not a period; write a number and a unit: 500ms, 10s, 1m, 1h, 1d");
        let mut total = Duration::ZERO;
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err(bad());
        }
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
            if digits == 0 {
                return Err(bad());
            }
            let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = match &rest[..unit_len] {
                "us" => Duration::from_micros(n),
                "ms" => Duration::from_millis(n),
                "s" => Duration::from_secs(n),
                "m" => Duration::from_secs(n.saturating_mul(60)),
                "h" => Duration::from_secs(n.saturating_mul(3_600)),
                "d" => Duration::from_secs(n.saturating_mul(86_400)),
                _ => return Err(bad()),
            };
            total = total.saturating_add(unit);
            rest = &rest[unit_len..];
        }
        Ok(total)
    }
}

impl<'de> Deserialize<'de> for Period {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let period = Period::parse(&s).map_err(de::Error::custom)?;
        if period.is_zero() {
            return Err(de::Error::custom(format!(
                "the period {s:?} is zero; a quota needs a period of at least 1us"
            )));
        }
        Ok(Period(period))
    }
}

struct AlgorithmName(Algorithm);

impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map(AlgorithmName).map_err(de::Error::custom)
    }
}

/// A quota as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQuota {
    #[serde(default)]
    name: Option<String>,
    algorithm: AlgorithmName,
    limit: u64,
    period: Period,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    soft_percent: Option<u16>,
    #[serde(default)]
    count_rejected: bool,
}

impl RawQuota {
    fn build(self, scale: u64) -> Result<Quota, String> {
        let mode = match (self.mode.as_deref(), self.soft_percent) {
            (None | Some("enforce"), None) => Mode::Enforce,
            (Some("shadow"), None) => Mode::Shadow,
            (Some("soft"), Some(percent)) => Mode::Soft { percent },
            (Some("soft"), None) => {
                return Err(
                    "mode soft needs soft_percent (how far over the limit, in per cent)".into(),
                );
            }
            (_, Some(_)) => return Err("soft_percent goes with mode: soft".into()),
            (Some(m), None) => {
                return Err(format!(
                    "unknown mode {m:?}; valid modes are enforce, shadow, soft"
                ));
            }
        };
        let mut b = Quota::builder(
            self.algorithm.0,
            self.limit.saturating_mul(scale),
            self.period.0,
        )
        .mode(mode)
        .count_rejected(self.count_rejected);
        if let Some(burst) = self.burst {
            b = b.burst(burst.saturating_mul(scale));
        }
        if let Some(name) = self.name {
            b = b.name(name);
        }
        b.build().map_err(|e| e.to_string())
    }
}

/// A quota, kept as written so overrides can scale it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QuotaConfig {
    pub quota: Quota,
    written: WrittenQuota,
}

#[derive(Debug, Clone, PartialEq)]
struct WrittenQuota {
    name: Option<String>,
    algorithm: Algorithm,
    limit: u64,
    period: Duration,
    burst: Option<u64>,
    mode: Option<String>,
    soft_percent: Option<u16>,
    count_rejected: bool,
}

impl QuotaConfig {
    /// The quota with limit and burst multiplied by `by` (a tier).
    pub(crate) fn scaled(&self, by: u64) -> Result<Quota, String> {
        let w = &self.written;
        RawQuota {
            name: w.name.clone(),
            algorithm: AlgorithmName(w.algorithm),
            limit: w.limit,
            period: Period(w.period),
            burst: w.burst,
            mode: w.mode.clone(),
            soft_percent: w.soft_percent,
            count_rejected: w.count_rejected,
        }
        .build(by)
    }
}

impl<'de> Deserialize<'de> for QuotaConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawQuota::deserialize(d)?;
        let written = WrittenQuota {
            name: raw.name.clone(),
            algorithm: raw.algorithm.0,
            limit: raw.limit,
            period: raw.period.0,
            burst: raw.burst,
            mode: raw.mode.clone(),
            soft_percent: raw.soft_percent,
            count_rejected: raw.count_rejected,
        };
        let quota = raw.build(1).map_err(de::Error::custom)?;
        Ok(QuotaConfig { quota, written })
    }
}

/// A rule's quotas: at least one, distinct names.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct QuotaList(pub Vec<QuotaConfig>);

impl<'de> Deserialize<'de> for QuotaList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let list = Vec::<QuotaConfig>::deserialize(d)?;
        if list.is_empty() {
            return Err(de::Error::custom("a rule needs at least one quota"));
        }
        for (i, q) in list.iter().enumerate() {
            if list[..i].iter().any(|o| o.quota.name() == q.quota.name()) {
                return Err(de::Error::custom(format!(
                    "two quotas of this rule are named {:?}; give each a distinct name",
                    q.quota.name()
                )));
            }
        }
        Ok(QuotaList(list))
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

impl fmt::Display for RulesFile {
    /// The rules as understood, for `tollgate check`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.backend {
            BackendConfig::Memory { max_keys } => {
                writeln!(f, "backend: memory, at most {max_keys} keys")?
            }
            BackendConfig::Redis {
                url,
                prefix,
                timeout,
                on_failure,
            } => {
                let failure = match on_failure.0 {
                    RedisFailure::Error => "fail",
                    RedisFailure::Memory => "decide in memory",
                };
                writeln!(
                    f,
                    "backend: redis at {url}, key prefix {prefix:?}; if Redis takes over {:?} or fails: {failure}",
                    timeout.0
                )?
            }
        }
        let headers = match self.headers.0 {
            HeaderStyle::Ietf => "ietf",
            HeaderStyle::Draft6 => "draft6",
            HeaderStyle::Legacy => "legacy",
            _ => "none",
        };
        let failure = match self.on_backend_error.0 {
            OnBackendError::Allow => "let requests through",
            OnBackendError::Reject => "answer 503",
        };
        let missing = match self.on_missing_key.0 {
            OnMissingKey::Reject => "refused",
            OnMissingKey::Allow => "let through unlimited",
        };
        writeln!(f, "headers: {headers}")?;
        writeln!(
            f,
            "if the backend fails or takes over {:?}: {failure}",
            self.timeout.0
        )?;
        writeln!(f, "requests without a key: {missing}")?;
        let matching = match self.matching.0 {
            MatchMode::First => "the first rule that matches",
            MatchMode::All => "every rule that matches",
        };
        writeln!(f, "each request is checked against {matching}")?;
        for (what, list) in [
            ("never limited", &self.allow),
            ("always refused (403)", &self.deny),
        ] {
            if !list.ips.is_empty() || !list.keys.is_empty() {
                let ips: Vec<String> = list.ips.iter().map(|c| c.0.to_string()).collect();
                writeln!(
                    f,
                    "{what}: networks [{}], keys [{}]",
                    ips.join(", "),
                    list.keys.iter().cloned().collect::<Vec<_>>().join(", ")
                )?;
            }
        }
        for rule in &self.rules {
            writeln!(f, "rule {}:", rule.name.0)?;
            let m = &rule.matches;
            let mut when = Vec::new();
            if let Some(p) = &m.path {
                when.push(format!("path {}", p.text));
            }
            if let Some(p) = &m.prefix {
                when.push(format!("path starts with {p}"));
            }
            if !m.methods.is_empty() {
                let methods: Vec<&str> = m.methods.iter().map(|x| x.0.as_str()).collect();
                when.push(format!("method {}", methods.join("/")));
            }
            for h in &m.headers {
                match &h.value {
                    Some(v) => when.push(format!("header {} = {v:?}", h.name.0)),
                    None => when.push(format!("header {} present", h.name.0)),
                }
            }
            let when = if when.is_empty() {
                "every request".to_owned()
            } else {
                when.join(", ")
            };
            let key: Vec<String> = rule.key.0.iter().map(ToString::to_string).collect();
            writeln!(f, "  applies to: {when}")?;
            writeln!(f, "  key: {}; cost {}", key.join(" + "), rule.cost)?;
            for q in &rule.quotas.0 {
                writeln!(f, "  quota {}", describe(&q.quota))?;
            }
            for o in &rule.overrides {
                let keys = o.keys.iter().cloned().collect::<Vec<_>>().join(", ");
                match (&o.multiply, &o.quotas) {
                    (Some(n), _) => writeln!(f, "  for {keys}: limits x{n}")?,
                    (None, Some(qs)) => {
                        writeln!(f, "  for {keys}:")?;
                        for q in &qs.0 {
                            writeln!(f, "    quota {}", describe(&q.quota))?;
                        }
                    }
                    (None, None) => {}
                }
            }
        }
        Ok(())
    }
}

fn describe(q: &Quota) -> String {
    let mut s = format!(
        "{:?}: {} {} per {:?}",
        q.name(),
        q.algorithm(),
        q.limit(),
        q.period()
    );
    if q.algorithm().has_burst() && q.burst() != q.limit() {
        s.push_str(&format!(", burst {}", q.burst()));
    }
    match q.mode() {
        Mode::Enforce => {}
        Mode::Shadow => s.push_str(", shadow (never refuses)"),
        Mode::Soft { percent } => s.push_str(&format!(", soft (+{percent}%)")),
    }
    if q.counts_rejected() {
        s.push_str(", counting refused attempts");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods() {
        assert_eq!(Period::parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(Period::parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(Period::parse("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "10", "s", "1 m", "1w", "-1s"] {
            assert!(Period::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn path_patterns() {
        let p = PathPattern::parse("/users/{id}").unwrap();
        assert!(p.matches("/users/42"));
        assert!(!p.matches("/users/"));
        assert!(!p.matches("/users/42/posts"));
        let p = PathPattern::parse("/files/{*rest}").unwrap();
        assert!(p.matches("/files/a/b/c"));
        assert!(p.matches("/files/"));
        assert!(!p.matches("/file"));
        assert!(PathPattern::parse("users").is_err());
        assert!(PathPattern::parse("/a/{*rest}/b").is_err());
        assert!(PathPattern::parse("/a/x{id}").is_err());
    }
}
