//! envoyproxy/ratelimit's configuration: files of `domain` and nested
//! `descriptors`, read unchanged, validated as the reference validates them
//! (with file, line and column), and compiled into one tree per domain.

mod limit;
mod model;
mod tree;
mod unit;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::Spanned;

use crate::calendar::{Calendar, CalendarPeriod, Weekday};
use crate::quota::Algorithm;
use crate::quota::Quota;
use crate::quota_set::QuotaSet;
use limit::quota_name;
pub(crate) use limit::{Limit, LimitKind};
use model::{DescriptorYaml, FileYaml, RateLimitYaml};
pub(crate) use tree::{Domain, Matched};
pub(crate) use unit::Unit;

/// Why the configuration could not be loaded: the file, and what is wrong
/// where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsConfigError {
    message: String,
}

impl RlsConfigError {
    fn new(file: &str, message: impl fmt::Display) -> Self {
        RlsConfigError {
            message: format!("{file}: {message}"),
        }
    }
}

impl fmt::Display for RlsConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RlsConfigError {}

/// Every domain's limits, from one file or a directory of files in
/// envoyproxy/ratelimit's format.
///
/// ```
/// use tollgate::rls::RlsConfig;
///
/// let config = RlsConfig::parse("inline.yaml", r#"
/// domain: mongo_cps
/// descriptors:
///   - key: database
///     value: users
///     rate_limit: { unit: second, requests_per_unit: 500 }
/// "#)?;
/// assert_eq!(config.domains(), vec!["mongo_cps"]);
/// # Ok::<(), tollgate::rls::RlsConfigError>(())
/// ```
#[derive(Debug, Default)]
pub struct RlsConfig {
    pub(crate) domains: HashMap<String, Domain>,
    /// The algorithm of limits that name none.
    default_algorithm: Option<Algorithm>,
}

/// The algorithm of a limit that names none: sliding windows, which no
/// window boundary lets twice the limit through.
pub const DEFAULT_ALGORITHM: Algorithm = Algorithm::SlidingWindow;

/// The names `algorithm:` accepts.
pub(crate) fn parse_algorithm(name: &str) -> Option<Algorithm> {
    Algorithm::ALL.into_iter().find(|a| a.name() == name)
}

impl RlsConfig {
    /// One file's text; `name` is what errors call it.
    pub fn parse(name: &str, text: &str) -> Result<RlsConfig, RlsConfigError> {
        RlsConfig::parse_all([(name.to_owned(), text.to_owned())], None)
    }

    /// A file, or every `.yaml` and `.yml` file of a directory (not its
    /// subdirectories, nor hidden files), in name order. Limits that name no
    /// algorithm use `default_algorithm` ([`DEFAULT_ALGORITHM`] if `None`).
    pub fn load(
        path: impl AsRef<Path>,
        default_algorithm: Option<Algorithm>,
    ) -> Result<RlsConfig, RlsConfigError> {
        RlsConfig::parse_all(read_all(path.as_ref())?, default_algorithm)
    }

    /// The domains, sorted.
    pub fn domains(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The files' texts (name, text), as [`load`](RlsConfig::load) compiles them.
    pub(crate) fn parse_all(
        files: impl IntoIterator<Item = (String, String)>,
        default_algorithm: Option<Algorithm>,
    ) -> Result<RlsConfig, RlsConfigError> {
        let mut config = RlsConfig {
            domains: HashMap::new(),
            default_algorithm,
        };
        for (name, text) in files {
            config.add_file(&name, &text)?;
        }
        Ok(config)
    }

    fn add_file(&mut self, file: &str, text: &str) -> Result<(), RlsConfigError> {
        let yaml: FileYaml =
            serde_saphyr::from_str(text).map_err(|e| RlsConfigError::new(file, e))?;
        let domain = match &yaml.domain {
            Some(d) if !d.value.is_empty() => d,
            Some(d) => {
                return Err(RlsConfigError::new(
                    file,
                    at(d, "config file cannot have empty domain"),
                ));
            }
            None => {
                return Err(RlsConfigError::new(
                    file,
                    "config file cannot have empty domain",
                ));
            }
        };
        if self.domains.contains_key(&domain.value) {
            return Err(RlsConfigError::new(
                file,
                at(
                    domain,
                    format!("duplicate domain '{}' in config file", domain.value),
                ),
            ));
        }
        let algorithm = self.default_algorithm.unwrap_or(DEFAULT_ALGORITHM);
        let mut root = Domain::default();
        let path = domain.value.clone();
        load_level(&mut root, &path, &yaml.descriptors, algorithm)
            .map_err(|e| RlsConfigError::new(file, e))?;
        self.domains.insert(domain.value.clone(), root);
        Ok(())
    }
}

/// `message` prefixed with where `value` was written.
fn at<T>(value: &Spanned<T>, message: impl fmt::Display) -> String {
    format!(
        "line {} column {}: {message}",
        value.referenced.line(),
        value.referenced.column()
    )
}

fn load_level(
    level: &mut Domain,
    parent: &str,
    descriptors: &[Spanned<DescriptorYaml>],
    algorithm: Algorithm,
) -> Result<(), String> {
    for spanned in descriptors {
        let d = &spanned.value;
        let key = match d.key.as_deref() {
            Some(k) if !k.is_empty() => k,
            _ => return Err(at(spanned, "descriptor has empty key")),
        };
        let value = d.value.as_deref().filter(|v| !v.is_empty());
        let mut path = format!("{parent}.{key}");
        if let Some(v) = value {
            path.push('_');
            path.push_str(v);
        }
        if d.share_threshold && !value.is_some_and(|v| v.contains('*')) {
            return Err(at(
                spanned,
                format!(
                    "share_threshold can only be used with wildcard values (containing '*'), but found key '{}'",
                    &path[parent.len() + 1..]
                ),
            ));
        }
        let limit = match &d.rate_limit {
            Some(r) => Some(Arc::new(
                compile_limit(r, &path, d, algorithm).map_err(|e| at(r, e))?,
            )),
            None => None,
        };
        let mut child = Domain::node(limit, d.share_threshold);
        load_level(&mut child, &path, &d.descriptors, algorithm)?;
        if !level.insert(key, value, child) {
            return Err(at(
                spanned,
                format!("duplicate descriptor composite key '{path}'"),
            ));
        }
    }
    Ok(())
}

fn compile_limit(
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
    let mut limit = match parsed {
        Some(unit) if calendar.is_some() && r.requests_per_unit > 0 => {
            if r.algorithm.as_deref().is_some_and(|a| a != "fixed_window") {
                return Err("time_zone counts calendar periods with fixed_window only".into());
            }
            let mut limit = Limit::counted(
                Arc::clone(&path),
                r.requests_per_unit,
                Unit::Second,
                Algorithm::FixedWindow,
            )?;
            let quota =
                Quota::per_calendar(u64::from(r.requests_per_unit), calendar.expect("some"))
                    .name(quota_name(&path))
                    .build()
                    .map_err(|e| e.to_string())?;
            let set = QuotaSet::new(path, [quota]).map_err(|e| e.to_string())?;
            limit.kind = LimitKind::Counted(Arc::new(set));
            limit.unit = unit;
            limit
        }
        Some(unit) => Limit::counted(path, r.requests_per_unit, unit, algorithm)?,
        None => Limit::unlimited(path),
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

/// The files a path names, with their texts: the file itself, or a
/// directory's YAML files in name order.
pub(crate) fn read_all(path: &Path) -> Result<Vec<(String, String)>, RlsConfigError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| RlsConfigError::new(&shown, e))?;
    let files: Vec<PathBuf> = if meta.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).map_err(|e| RlsConfigError::new(&shown, e))? {
            let entry = entry.map_err(|e| RlsConfigError::new(&shown, e))?;
            let p = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
            if yaml && !name.starts_with('.') && p.is_file() {
                files.push(p);
            }
        }
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    files
        .into_iter()
        .map(|p| {
            let shown = p.display().to_string();
            std::fs::read_to_string(&p)
                .map(|text| (shown.clone(), text))
                .map_err(|e| RlsConfigError::new(&shown, e))
        })
        .collect()
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
