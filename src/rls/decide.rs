//! `ShouldRateLimit`: a request's descriptors matched against the domain's
//! limits, decided together, answered as the reference answers.

use std::fmt::Write;
use std::sync::Arc;

use super::answer::{respond, uniform};
use super::config::{Limit, LimitKind, Matched, RlsConfig, Unit};
use super::proto::{RateLimitRequest, RateLimitResponse, code};
use super::{OnBackendError, ServiceInner};
use crate::backend::{Backend, CheckRequest};
use crate::clock::Stopwatch;
use crate::decision::Decision;
use crate::log_limit::LogLimit;

/// The most descriptors one call may carry, and entries one descriptor:
/// Envoy sends a handful; more is refused rather than walked.
const MAX_DESCRIPTORS: usize = 64;
const MAX_ENTRIES: usize = 32;

/// One descriptor as this call treats it.
pub(super) enum Plan {
    /// No limit applies (none found, or replaced): within.
    Free,
    /// `unlimited`: within, with a maximal remaining.
    Unlimited,
    /// A limit to decide, with the key of its counters and the units the
    /// call spends (its hits times the limit's cost).
    Limited {
        limit: Arc<Limit>,
        key: String,
        units: u64,
    },
}

/// What deciding a limited descriptor gave.
pub(super) enum Outcome {
    /// The quota's decision.
    Decided(Decision),
    /// Over without counting: `requests_per_unit: 0`, or hits no window
    /// could ever hold.
    Over,
}

impl ServiceInner {
    pub(crate) async fn decide(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        if request.domain.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if request.descriptors.is_empty() {
            return Err(tonic::Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        if request.descriptors.len() > MAX_DESCRIPTORS
            || request
                .descriptors
                .iter()
                .any(|d| d.entries.len() > MAX_ENTRIES)
        {
            return Err(tonic::Status::invalid_argument(format!(
                "at most {MAX_DESCRIPTORS} descriptors of {MAX_ENTRIES} entries each"
            )));
        }
        let config = self.config.load_full();
        let plans = self.plan(&config, &request)?;
        let outcomes = match self.check_all(&plans).await {
            Ok(outcomes) => outcomes,
            Err(status) => {
                return match self.on_backend_error {
                    OnBackendError::Error => Err(status),
                    OnBackendError::Allow => Ok(uniform(&plans, code::OK)),
                    OnBackendError::Deny => Ok(uniform(&plans, code::OVER_LIMIT)),
                };
            }
        };
        Ok(respond(&request.domain, &plans, &outcomes))
    }

    /// Each descriptor's limit, with `replaces` applied and the units each
    /// spends: its hits (a descriptor's own `hits_addend` when set, 0
    /// checking without spending; else the request's, where 0 means 1)
    /// times the limit's `cost`.
    fn plan(
        &self,
        config: &RlsConfig,
        request: &RateLimitRequest,
    ) -> Result<Vec<Plan>, tonic::Status> {
        let Some(domain) = config.domains.get(&request.domain) else {
            return Ok(request.descriptors.iter().map(|_| Plan::Free).collect());
        };
        let mut found: Vec<Option<Matched>> = Vec::with_capacity(request.descriptors.len());
        for d in &request.descriptors {
            let entries = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
            let matched = match &d.limit {
                Some(o) => {
                    let unit = Unit::from_proto(o.unit).ok_or_else(|| {
                        tonic::Status::invalid_argument("a limit override needs a known unit")
                    })?;
                    let limit = self.override_limit(o.requests_per_unit, unit)?;
                    let domain = &request.domain;
                    let mut key = format!("override{}:{domain}", domain.len());
                    for (k, v) in entries {
                        let _ = write!(key, "{}:{k}{}:{v}", k.len(), v.len());
                    }
                    Some(Matched { limit, key })
                }
                None => domain.find(&request.domain, entries),
            };
            found.push(matched);
        }
        let replaced: Vec<String> = found
            .iter()
            .flatten()
            .flat_map(|m| m.limit.replaces.iter().cloned())
            .collect();
        let request_hits = u64::from(request.hits_addend.max(1));
        Ok(found
            .into_iter()
            .zip(&request.descriptors)
            .map(|(m, d)| match m {
                None => Plan::Free,
                Some(m) if matches!(m.limit.kind, LimitKind::Unlimited) => Plan::Unlimited,
                Some(m) if !m.limit.name.is_empty() && replaced.contains(&m.limit.name) => {
                    Plan::Free
                }
                Some(m) => Plan::Limited {
                    units: m
                        .limit
                        .spend(d.hits_addend.map_or(request_hits, |h| h.value)),
                    limit: m.limit,
                    key: m.key,
                },
            })
            .collect())
    }

    /// A request's own limit: its quota's counters are named by its
    /// numbers, so that every call with the same override shares them.
    fn override_limit(
        &self,
        requests_per_unit: u32,
        unit: Unit,
    ) -> Result<Arc<Limit>, tonic::Status> {
        // One label for every override: the numbers come from the caller.
        // The counters still differ by them (a state's id covers the quota).
        Limit::counted("override".into(), requests_per_unit, unit, self.algorithm)
            .map(Arc::new)
            .map_err(tonic::Status::invalid_argument)
    }

    /// Decides every limited descriptor, all or nothing: with several that
    /// spend, each is first asked without spending, and only when all
    /// would pass do they spend (a call racing between the two may still
    /// be refused by a later descriptor after an earlier one spent).
    async fn check_all(&self, plans: &[Plan]) -> Result<Vec<Option<Outcome>>, tonic::Status> {
        let spending = plans
            .iter()
            .filter(|p| matches!(p, Plan::Limited { units, limit, .. } if *units > 0 && matches!(limit.kind, LimitKind::Counted(_))))
            .count();
        if spending > 1 {
            let mut peeks = Vec::with_capacity(plans.len());
            for plan in plans {
                peeks.push(self.check_one(plan, false).await?);
            }
            if refused(plans, &peeks) {
                return Ok(peeks);
            }
        }
        let mut outcomes = Vec::with_capacity(plans.len());
        for plan in plans {
            outcomes.push(self.check_one(plan, true).await?);
        }
        Ok(outcomes)
    }

    async fn check_one(&self, plan: &Plan, commit: bool) -> Result<Option<Outcome>, tonic::Status> {
        let Plan::Limited { limit, key, units } = plan else {
            return Ok(None);
        };
        let quotas = match &limit.kind {
            LimitKind::Counted(quotas) => quotas,
            LimitKind::Blocked => return Ok(Some(Outcome::Over)),
            LimitKind::Unlimited => return Ok(None),
        };
        // More than the limit can never pass; the reference answers over.
        if quotas.too_costly(*units).is_some() {
            return Ok(Some(Outcome::Over));
        }
        // Hits of 0 ask with a cost of 0, which passes while the window is
        // not past its limit and reports what is left, as the reference.
        let request = CheckRequest {
            key,
            quotas,
            cost: *units,
            commit: commit && *units > 0,
            room: false,
            started: Stopwatch::start(),
        };
        match self.backend.check(request).await {
            Ok(d) => Ok(Some(Outcome::Decided(d))),
            Err(e) => {
                // Once per interval: a Redis that is down fails every call.
                static FAILED: LogLimit = LogLimit::new();
                if let Some(more) = FAILED.admit() {
                    tracing::warn!(error = %e, "rate limit backend failed{more}");
                }
                Err(tonic::Status::unavailable("rate limit backend unavailable"))
            }
        }
    }
}

/// Whether a descriptor is over its limit.
pub(super) fn is_over(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Over => true,
        Outcome::Decided(d) => !d.allowed(),
    }
}

/// Whether the call is refused: an enforced limit is over (not one in
/// shadow mode), or every limit in quota mode is.
pub(super) fn refused(plans: &[Plan], outcomes: &[Option<Outcome>]) -> bool {
    let (mut quota_total, mut quota_over) = (0, 0);
    for (plan, outcome) in plans.iter().zip(outcomes) {
        let (Plan::Limited { limit, .. }, Some(outcome)) = (plan, outcome) else {
            continue;
        };
        let over = is_over(outcome);
        if limit.quota_mode {
            quota_total += 1;
            quota_over += usize::from(over);
        } else if over && !limit.shadow_mode {
            return true;
        }
    }
    quota_total > 0 && quota_total == quota_over
}
