//! Quotas as written in rules files, kept as written so that overrides can
//! scale them.

use serde::Deserialize;
use serde::de::{self, Deserializer};

use super::at::At;
use super::period::{CalendarUnit, Period};
use crate::calendar::{Calendar, CalendarPeriod, StartsOn, Weekday};
use crate::quota::{Algorithm, Counts, Mode, Quota};

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

/// `counts: requests | cost`: what a quota counts ([`Counts`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct CountsName(Counts);

impl<'de> Deserialize<'de> for CountsName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match String::deserialize(d)?.as_str() {
            "cost" => Ok(CountsName(Counts::Cost)),
            "requests" => Ok(CountsName(Counts::Requests)),
            other => Err(de::Error::custom(format!(
                "a quota counts requests or cost, not {other:?}"
            ))),
        }
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
    /// Either a period, or a calendar with its time zone and first day.
    #[serde(default)]
    period: Option<Period>,
    #[serde(default)]
    calendar: Option<CalendarUnit>,
    #[serde(default)]
    time_zone: Option<String>,
    #[serde(default)]
    starts_on: Option<StartsOn>,
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
    #[serde(default)]
    counts: Option<CountsName>,
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

    /// The calendar written, if any: `calendar` with `time_zone` (UTC
    /// unless given) and `starts_on`, or none with a `period`.
    fn calendar(&self) -> Result<Option<Calendar>, String> {
        let Some(unit) = self.calendar else {
            if self.period.is_none() {
                return Err(
                    "a quota needs a period (such as 1m) or a calendar (day, week, month or year)"
                        .into(),
                );
            }
            if self.time_zone.is_some() || self.starts_on.is_some() {
                return Err(
                    "time_zone and starts_on go with calendar: day, week, month or year".into(),
                );
            }
            return Ok(None);
        };
        if self.period.is_some() {
            return Err(format!(
                "a quota has a period or a calendar, not both: remove period, its length is the calendar's {}",
                unit.as_str()
            ));
        }
        if self.algorithm.0 != Algorithm::FixedWindow {
            return Err(format!(
                "calendar periods apply to fixed_window only, not {}",
                self.algorithm.0
            ));
        }
        let period = match (unit, &self.starts_on) {
            (CalendarUnit::Week, None) => CalendarPeriod::Week {
                starts_on: Weekday::Monday,
            },
            (CalendarUnit::Week, Some(StartsOn::Weekday(d))) => {
                CalendarPeriod::Week { starts_on: *d }
            }
            (CalendarUnit::Month, None) => CalendarPeriod::Month { starts_on: 1 },
            (CalendarUnit::Month, Some(StartsOn::Day(d))) => {
                CalendarPeriod::Month { starts_on: *d }
            }
            (CalendarUnit::Week, Some(StartsOn::Day(_))) => {
                return Err("a week starts on a day of the week: starts_on: monday".into());
            }
            (CalendarUnit::Month, Some(StartsOn::Weekday(_))) => {
                return Err("a month starts on a day of the month, 1 to 31: starts_on: 15".into());
            }
            (CalendarUnit::Day, None) => CalendarPeriod::Day,
            (CalendarUnit::Year, None) => CalendarPeriod::Year,
            (CalendarUnit::Day | CalendarUnit::Year, Some(_)) => {
                return Err(format!(
                    "starts_on applies to week and month, not {}",
                    unit.as_str()
                ));
            }
        };
        let zone = self.time_zone.as_deref().unwrap_or("UTC");
        Calendar::new(period, zone)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// The quota in `mode`, with limit and burst multiplied by `scale`.
    fn build_as(&self, mode: Mode, scale: u64) -> Result<Quota, String> {
        let calendar = self.calendar()?;
        let period = self.period.map_or(std::time::Duration::ZERO, |p| p.0);
        let mut b = Quota::builder(self.algorithm.0, self.limit.saturating_mul(scale), period)
            .mode(mode)
            .count_rejected(self.count_rejected)
            .counts(self.counts.map_or(Counts::Cost, |c| c.0));
        if let Some(calendar) = calendar {
            b = b.calendar(calendar);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(yaml: &str) -> Result<QuotaConfig, String> {
        serde_saphyr::from_str::<QuotaConfig>(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn calendar_quotas_as_written() {
        let q = quota("{ algorithm: fixed_window, limit: 10000, calendar: month, time_zone: Asia/Seoul, starts_on: 15 }").unwrap();
        let cal = q.quota.calendar().expect("a calendar");
        assert_eq!(cal.period(), CalendarPeriod::Month { starts_on: 15 });
        assert_eq!(cal.time_zone(), "Asia/Seoul");
        assert_eq!(q.quota.name(), "10000-per-month");
        let q = quota("{ algorithm: fixed_window, limit: 5, calendar: week, starts_on: sunday }")
            .unwrap();
        let cal = q.quota.calendar().unwrap();
        assert_eq!(
            cal.period(),
            CalendarPeriod::Week {
                starts_on: Weekday::Sunday
            }
        );
        assert_eq!(cal.time_zone(), "UTC");
        let q = quota(
            "{ algorithm: fixed_window, limit: 5, calendar: day, time_zone: America/New_York }",
        )
        .unwrap();
        assert_eq!(q.quota.calendar().unwrap().period(), CalendarPeriod::Day);
        // Tiers scale a calendar quota and keep its calendar.
        let scaled = q.scaled(3).unwrap();
        assert_eq!(scaled.limit(), 15);
        assert_eq!(scaled.calendar(), q.quota.calendar());
        // A plain quota has none.
        let q = quota("{ algorithm: fixed_window, limit: 5, period: 1m }").unwrap();
        assert!(q.quota.calendar().is_none());
    }

    #[test]
    fn counts_as_written() {
        let q =
            quota("{ algorithm: fixed_window, limit: 5, period: 1m, counts: requests }").unwrap();
        assert_eq!(q.quota.counts(), Counts::Requests);
        assert_eq!(q.scaled(2).unwrap().counts(), Counts::Requests);
        let q = quota("{ algorithm: gcra, limit: 5, period: 1m, counts: cost }").unwrap();
        assert_eq!(q.quota.counts(), Counts::Cost);
        let q = quota("{ algorithm: gcra, limit: 5, period: 1m }").unwrap();
        assert_eq!(q.quota.counts(), Counts::Cost, "the cost unless written");
        let err = quota("{ algorithm: gcra, limit: 5, period: 1m, counts: tokens }").unwrap_err();
        assert!(err.contains("requests or cost"), "{err}");
    }

    #[test]
    fn calendar_mistakes_are_refused_with_a_reason() {
        for (yaml, says) in [
            (
                "{ algorithm: fixed_window, limit: 5 }",
                "a period (such as 1m) or a calendar",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, period: 1m, calendar: day }",
                "not both",
            ),
            (
                "{ algorithm: gcra, limit: 5, calendar: day }",
                "fixed_window only",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, calendar: fortnight }",
                "not a calendar period",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, calendar: day, time_zone: Mars/Olympus }",
                "not an IANA time zone",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, calendar: month, starts_on: 32 }",
                "1 to 31",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, calendar: month, starts_on: 0 }",
                "1 to 31",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, calendar: month, starts_on: monday }",
                "day of the month",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, calendar: week, starts_on: 3 }",
                "day of the week",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, calendar: week, starts_on: someday }",
                "not a day of the week",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, calendar: day, starts_on: 3 }",
                "applies to week and month",
            ),
            (
                "{ algorithm: fixed_window, limit: 5, period: 1m, time_zone: UTC }",
                "go with calendar",
            ),
        ] {
            let err = quota(yaml).expect_err(yaml);
            assert!(err.contains(says), "{yaml}: {err}");
        }
    }
}
