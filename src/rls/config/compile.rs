//! A `rate_limit` as written into a [`Limit`]: its unit, algorithm,
//! calendar (`time_zone`, `starts_on`) and cost, refused with the
//! reference's messages (and tollgate's for its extensions) when it could
//! never be decided as written.

use std::sync::Arc;

use serde_saphyr::Spanned;

use super::limit::quota_name;
use super::model::{DescriptorYaml, RateLimitYaml};
use super::{Limit, LimitKind, Unit, parse_algorithm};
use crate::calendar::{Calendar, CalendarPeriod, Weekday};
use crate::quota::{Algorithm, Quota};
use crate::quota_set::QuotaSet;

pub(super) fn compile_limit(
    r: &Spanned<RateLimitYaml>,
    path: &str,
    d: &DescriptorYaml,
    default: Algorithm,
) -> Result<Limit, String> {
    let r = &r.value;
    let unit = r.unit.as_deref().unwrap_or("");
    let parsed = Unit::parse(unit);
    if r.unlimited {
        if parsed.is_some() {
            return Err("should not specify rate limit unit when unlimited".into());
        }
    } else if parsed.is_none() {
        return Err(format!("invalid rate limit unit '{unit}'"));
    }
    let name = r.name.clone().unwrap_or_default();
    let mut replaces = Vec::with_capacity(r.replaces.len());
    for e in &r.replaces {
        if e.name.is_empty() {
            return Err("should not have an empty replaces entry".into());
        }
        if e.name == name {
            return Err("replaces should not contain name of same descriptor".into());
        }
        replaces.push(e.name.clone());
    }
    let algorithm = match r.algorithm.as_deref() {
        None => default,
        Some(a) => parse_algorithm(a).ok_or_else(|| {
            format!(
                "unknown algorithm '{a}': use fixed_window, sliding_window, sliding_log, token_bucket, leaky_bucket or gcra"
            )
        })?,
    };
    let path: Arc<str> = path.into();
    let calendar = calendar_of(r, parsed)?;
    let mut limit = match (parsed, calendar) {
        (Some(unit), Some(calendar)) if r.requests_per_unit > 0 => {
            if r.algorithm.as_deref().is_some_and(|a| a != "fixed_window") {
                return Err("time_zone counts calendar periods with fixed_window only".into());
            }
            let mut limit = Limit::counted(
                Arc::clone(&path),
                r.requests_per_unit,
                Unit::Second,
                Algorithm::FixedWindow,
            )?;
            let quota = Quota::per_calendar(u64::from(r.requests_per_unit), calendar)
                .name(quota_name(&path))
                .build()
                .map_err(|e| e.to_string())?;
            let set = QuotaSet::new(path, [quota]).map_err(|e| e.to_string())?;
            limit.kind = LimitKind::Counted(Arc::new(set));
            limit.unit = unit;
            limit
        }
        (Some(unit), _) => Limit::counted(path, r.requests_per_unit, unit, algorithm)?,
        (None, _) => Limit::unlimited(path),
    };
    limit.cost = check_cost(r.cost, &limit)?;
    limit.name = name;
    limit.replaces = replaces;
    limit.shadow_mode = d.shadow_mode;
    limit.quota_mode = d.quota_mode;
    Ok(limit)
}

/// A limit's `cost:`, refused when it could never be decided as written:
/// zero (a hit that spends nothing is `hits_addend: 0`'s meaning), beside
/// `unlimited` (nothing to spend from), or more than the limit's window
/// can ever hold (every hit would be over).
fn check_cost(cost: Option<u64>, limit: &Limit) -> Result<u64, String> {
    let Some(cost) = cost else { return Ok(1) };
    if cost == 0 {
        return Err("cost must be at least 1".into());
    }
    match &limit.kind {
        LimitKind::Unlimited => Err("should not specify cost when unlimited".into()),
        LimitKind::Counted(set) if set.too_costly(cost).is_some() => Err(format!(
            "cost {cost} is more than requests_per_unit {} can ever admit; lower the cost or raise the limit",
            limit.requests_per_unit
        )),
        LimitKind::Counted(_) | LimitKind::Blocked => Ok(cost),
    }
}

/// The calendar of a limit with tollgate's `time_zone` (and `starts_on`),
/// whose unit is a day, week, month or year.
fn calendar_of(r: &RateLimitYaml, unit: Option<Unit>) -> Result<Option<Calendar>, String> {
    use crate::calendar::StartsOn;
    let Some(zone) = r.time_zone.as_deref() else {
        if r.starts_on.is_some() {
            return Err("starts_on goes with time_zone (calendar periods)".into());
        }
        return Ok(None);
    };
    let period = match (unit, r.starts_on) {
        (Some(Unit::Day), None) => CalendarPeriod::Day,
        (Some(Unit::Year), None) => CalendarPeriod::Year,
        (Some(Unit::Week), None) => CalendarPeriod::Week {
            starts_on: Weekday::Monday,
        },
        (Some(Unit::Week), Some(StartsOn::Weekday(starts_on))) => {
            CalendarPeriod::Week { starts_on }
        }
        (Some(Unit::Month), None) => CalendarPeriod::Month { starts_on: 1 },
        (Some(Unit::Month), Some(StartsOn::Day(starts_on))) => CalendarPeriod::Month { starts_on },
        (Some(Unit::Day | Unit::Week | Unit::Month | Unit::Year), Some(_)) => {
            return Err(
                "starts_on is a weekday for a week, a day of the month (1 to 31) for a month"
                    .into(),
            );
        }
        _ => return Err("time_zone applies to the units day, week, month and year".into()),
    };
    Calendar::new(period, zone)
        .map(Some)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod calendar_tests {
    use super::*;

    fn limit(yaml: &str) -> Result<Limit, String> {
        let r: Spanned<RateLimitYaml> = serde_saphyr::from_str(yaml).map_err(|e| e.to_string())?;
        let d: DescriptorYaml = serde_saphyr::from_str("{ key: k }").unwrap();
        compile_limit(&r, "d.k", &d, Algorithm::FixedWindow)
    }

    #[test]
    fn time_zone_makes_units_calendar_periods() {
        let l =
            limit("{ unit: month, requests_per_unit: 100, time_zone: Asia/Seoul, starts_on: 15 }")
                .unwrap();
        assert_eq!(l.unit, Unit::Month);
        let LimitKind::Counted(set) = &l.kind else {
            panic!("counted")
        };
        let cal = set.quotas()[0].calendar().expect("a calendar");
        assert_eq!(cal.period(), CalendarPeriod::Month { starts_on: 15 });
        // Without the extension, the reference's fixed 30 days.
        let l = limit("{ unit: month, requests_per_unit: 100 }").unwrap();
        let LimitKind::Counted(set) = &l.kind else {
            panic!("counted")
        };
        assert!(set.quotas()[0].calendar().is_none());
        for (bad, says) in [
            (
                "{ unit: second, requests_per_unit: 1, time_zone: UTC }",
                "day, week, month and year",
            ),
            (
                "{ unit: day, requests_per_unit: 1, starts_on: 2 }",
                "goes with time_zone",
            ),
            (
                "{ unit: week, requests_per_unit: 1, time_zone: UTC, starts_on: 2 }",
                "weekday",
            ),
            (
                "{ unit: day, requests_per_unit: 1, time_zone: Nowhere/Land }",
                "IANA",
            ),
            (
                "{ unit: day, requests_per_unit: 1, time_zone: UTC, algorithm: gcra }",
                "fixed_window only",
            ),
        ] {
            let err = limit(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
