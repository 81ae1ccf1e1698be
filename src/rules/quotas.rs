//! Quotas as written in rules files, kept as written so that overrides can
//! scale them.

use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::at::At;
use super::period::Period;
use crate::quota::{Algorithm, Mode, Quota};

#[derive(Debug, Clone, Copy, PartialEq)]
struct AlgorithmName(Algorithm);

impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "concurrency" {
            return Err(de::Error::custom(
                "a concurrency limit is the rule's own setting, not a quota: write `concurrency: { limit: N }` on the rule (with no quotas, it is the rule's only limit)",
            ));
        }
        s.parse().map(AlgorithmName).map_err(de::Error::custom)
    }
}

/// The most a soft or elastic quota may exceed its limit, in per cent:
/// beyond ten times over, the limit means nothing and is surely a typo.
const MAX_SOFT_PERCENT: u16 = 1000;

/// A quota as written.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct WrittenQuota {
    #[serde(default)]
    name: Option<String>,
    algorithm: AlgorithmName,
    limit: u64,
    period: Period,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    mode: Option<At<String>>,
    #[serde(default)]
    soft_percent: Option<u16>,
    #[serde(default)]
    elastic_percent: Option<u16>,
    #[serde(default)]
    count_rejected: bool,
}

impl WrittenQuota {
    /// The quota, with limit and burst multiplied by `scale`.
    fn build(&self, scale: u64) -> Result<Quota, String> {
        let mode = self.mode.as_ref().map(|m| m.value.as_str());
        if let Some(percent) = self.elastic_percent {
            return match mode {
                Some("elastic") if percent > MAX_SOFT_PERCENT => Err(format!(
                    "elastic_percent {percent} lets a client spend over {}x its limit; write at most {MAX_SOFT_PERCENT}",
                    1 + MAX_SOFT_PERCENT / 100
                )),
                Some("elastic") if self.soft_percent.is_none() => {
                    self.build_as(Mode::Elastic { percent }, scale)
                }
                _ => Err("elastic_percent goes with mode: elastic".into()),
            };
        }
        let mode = match (mode, self.soft_percent) {
            (None | Some("enforce"), None) => Mode::Enforce,
            (Some("shadow"), None) => Mode::Shadow,
            (Some("elastic"), None) => {
                return Err("mode elastic needs elastic_percent (how far over the limit while the server has room, in per cent)".into());
            }
            (Some("soft"), Some(percent)) if percent > MAX_SOFT_PERCENT => {
                return Err(format!(
                    "soft_percent {percent} lets a client spend over {}x its limit; write at most {MAX_SOFT_PERCENT}",
                    1 + MAX_SOFT_PERCENT / 100
                ));
            }
            (Some("soft"), Some(percent)) => Mode::Soft { percent },
            (Some("soft"), None) => {
                return Err(
                    "mode soft needs soft_percent (how far over the limit, in per cent)".into(),
                );
            }
            (_, Some(_)) => return Err("soft_percent goes with mode: soft".into()),
            (Some(m), None) => {
                return Err(format!(
                    "unknown mode {m:?}; valid modes are enforce, shadow, soft, elastic"
                ));
            }
        };
        self.build_as(mode, scale)
    }

    /// The quota in `mode`, with limit and burst multiplied by `scale`.
    fn build_as(&self, mode: Mode, scale: u64) -> Result<Quota, String> {
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
        if let Some(name) = &self.name {
            b = b.name(name.as_str());
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

impl QuotaConfig {
    /// The quota with limit and burst multiplied by `by` (a tier).
    pub(crate) fn scaled(&self, by: u64) -> Result<Quota, String> {
        self.written.build(by)
    }

    /// Where `mode: elastic` was written, if this quota is elastic.
    pub(crate) fn elastic_at(&self) -> Option<&At<String>> {
        let elastic = matches!(self.quota.mode(), Mode::Elastic { .. });
        self.written.mode.as_ref().filter(|_| elastic)
    }
}

impl<'de> Deserialize<'de> for QuotaConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let written = WrittenQuota::deserialize(d)?;
        let quota = written.build(1).map_err(de::Error::custom)?;
        Ok(QuotaConfig { quota, written })
    }
}

/// A rule's quotas: at least one when written, distinct names; none when
/// left out (a rule with only a concurrency limit, checked when compiled).
#[derive(Debug, Clone, PartialEq, Default)]
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
