//! A compiled limit: what a matched descriptor is decided by.

use std::sync::Arc;

use super::Unit;
use crate::quota::{Algorithm, Quota};
use crate::quota_set::QuotaSet;

/// What a matched limit does.
#[derive(Debug)]
pub(crate) enum LimitKind {
    /// `unlimited: true`: always within, with a maximal remaining.
    Unlimited,
    /// `requests_per_unit: 0`: always over.
    Blocked,
    /// Counted by a quota.
    Counted(Arc<QuotaSet>),
}

/// A limit from the file (or a request's override).
#[derive(Debug)]
pub(crate) struct Limit {
    /// The configured path (`domain.key_value.key`): the metric label and
    /// the name of the quota's counters.
    pub path: Arc<str>,
    pub name: String,
    pub replaces: Vec<String>,
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub kind: LimitKind,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    /// The units of `requests_per_unit` one hit spends (`cost:`, 1 when
    /// not written): a call's hits times this is what it spends.
    pub cost: u64,
}

impl Limit {
    /// A limit of `requests_per_unit` per `unit` counted by `algorithm`,
    /// its counters named `path`.
    pub(crate) fn counted(
        path: Arc<str>,
        requests_per_unit: u32,
        unit: Unit,
        algorithm: Algorithm,
    ) -> Result<Limit, String> {
        let kind = if requests_per_unit == 0 {
            LimitKind::Blocked
        } else {
            let quota = Quota::builder(algorithm, u64::from(requests_per_unit), unit.period())
                .name(quota_name(&path))
                .build()
                .map_err(|e| e.to_string())?;
            let set = QuotaSet::new(Arc::clone(&path), [quota]).map_err(|e| e.to_string())?;
            LimitKind::Counted(Arc::new(set))
        };
        Ok(Limit {
            path,
            name: String::new(),
            replaces: Vec::new(),
            requests_per_unit,
            unit,
            kind,
            shadow_mode: false,
            quota_mode: false,
            cost: 1,
        })
    }

    /// `unlimited: true`: never over, counted by nothing.
    pub(crate) fn unlimited(path: Arc<str>) -> Limit {
        Limit {
            path,
            name: String::new(),
            replaces: Vec::new(),
            requests_per_unit: 0,
            unit: Unit::Second,
            kind: LimitKind::Unlimited,
            shadow_mode: false,
            quota_mode: false,
            cost: 1,
        }
    }

    /// What a call spends for `hits` hits: saturating, so that a caller's
    /// huge addend is over the limit rather than wrapped around.
    pub(crate) fn spend(&self, hits: u64) -> u64 {
        hits.saturating_mul(self.cost)
    }
}

/// A quota's name as the `RateLimit` header fields show it: printable
/// ASCII, other characters as `_`.
pub(super) fn quota_name(path: &str) -> String {
    path.chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect()
}
