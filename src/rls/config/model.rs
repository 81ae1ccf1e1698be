//! envoyproxy/ratelimit's configuration file as written, as a serde model:
//! every key the reference knows, and tollgate's `algorithm:` and `cost:`
//! extensions.
//! Unknown keys, duplicate keys and values of the wrong type are errors of
//! the parser, with their line and column.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Spanned;

/// One file: a domain and its descriptors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileYaml {
    #[serde(default)]
    pub domain: Option<Spanned<String>>,
    #[serde(default)]
    pub descriptors: Vec<Spanned<DescriptorYaml>>,
}

/// A descriptor: a key, an optional value, a limit and nested descriptors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DescriptorYaml {
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub rate_limit: Option<Spanned<RateLimitYaml>>,
    #[serde(default)]
    pub descriptors: Vec<Spanned<DescriptorYaml>>,
    #[serde(default)]
    pub shadow_mode: bool,
    #[serde(default)]
    pub quota_mode: bool,
    /// Accepted for compatibility: metrics keep the configured path as
    /// their label whatever this says, so that their number stays bounded.
    #[serde(default)]
    #[allow(dead_code, reason = "accepted, not used")]
    pub detailed_metric: bool,
    /// Accepted for compatibility, as `detailed_metric`.
    #[serde(default)]
    #[allow(dead_code, reason = "accepted, not used")]
    pub value_to_metric: bool,
    #[serde(default)]
    pub share_threshold: bool,
    /// Arbitrary data the reference passes on in dynamic metadata; read
    /// and ignored.
    #[serde(default)]
    #[allow(dead_code, reason = "accepted, not used")]
    pub metadata: Option<IgnoredAny>,
}

/// A descriptor's `rate_limit`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RateLimitYaml {
    #[serde(default)]
    pub requests_per_unit: u32,
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default)]
    pub unlimited: bool,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub replaces: Vec<ReplacesYaml>,
    /// tollgate's extension: which algorithm counts this limit.
    #[serde(default)]
    pub algorithm: Option<String>,
    /// tollgate's extension: the units one hit spends (1 when absent).
    #[serde(default)]
    pub cost: Option<u64>,
    /// tollgate's extension: a day, week, month or year of this IANA time
    /// zone's calendar rather than the reference's fixed 86 400 s, 30 days
    /// or 365 days since the epoch.
    #[serde(default)]
    pub time_zone: Option<String>,
    /// tollgate's extension, with `time_zone`: a week's first weekday, a
    /// month's first day.
    #[serde(default)]
    pub starts_on: Option<crate::calendar::StartsOn>,
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplacesYaml {
    #[serde(default)]
    pub name: String,
}
