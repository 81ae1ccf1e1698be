//! `ShouldRateLimit`: a request's descriptors matched against the domain's
//! limits, decided together, answered as the reference answers.

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use super::config::{Limit, LimitKind, Matched, RlsConfig, Unit};
use super::proto::{
    CurrentLimit, DescriptorStatus, HeaderValue, ProtoDuration, RateLimitRequest,
    RateLimitResponse, code,
};
use super::{OnBackendError, ServiceInner};
use crate::backend::{Backend, CheckRequest};
use crate::clock::Stopwatch;
use crate::decision::Decision;
use crate::log_limit::LogLimit;

/// The most descriptors one call may carry, and entries one descriptor:
/// Envoy sends a handful; more is refused rather than walked.
const MAX_DESCRIPTORS: usize = 64;
const MAX_ENTRIES: usize = 32;

/// The reference's near-limit ratio: hits past 80% of a limit count as near.
const NEAR_LIMIT: f64 = 0.8;

/// One descriptor as this call treats it.
enum Plan {
    /// No limit applies (none found, or replaced): within.
    Free,
    /// `unlimited`: within, with a maximal remaining.
    Unlimited,
    /// A limit to decide, with the key of its counters and the hits to add.
    Limited {
        limit: Arc<Limit>,
        key: String,
        hits: u64,
    },
}

/// What deciding a limited descriptor gave.
enum Outcome {
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

    /// Each descriptor's limit, with `replaces` applied and the hits each
    /// adds: a descriptor's own `hits_addend` when set (0 checks without
    /// spending), else the request's, where 0 means 1.
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
                    hits: d.hits_addend.map_or(request_hits, |h| h.value),
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
            .filter(|p| matches!(p, Plan::Limited { hits, limit, .. } if *hits > 0 && matches!(limit.kind, LimitKind::Counted(_))))
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
        let Plan::Limited { limit, key, hits } = plan else {
            return Ok(None);
        };
        let quotas = match &limit.kind {
            LimitKind::Counted(quotas) => quotas,
            LimitKind::Blocked => return Ok(Some(Outcome::Over)),
            LimitKind::Unlimited => return Ok(None),
        };
        // More than the limit can never pass; the reference answers over.
        if quotas.too_costly(*hits).is_some() {
            return Ok(Some(Outcome::Over));
        }
        // Hits of 0 ask with a cost of 0, which passes while the window is
        // not past its limit and reports what is left, as the reference.
        let request = CheckRequest {
            key,
            quotas,
            cost: *hits,
            commit: commit && *hits > 0,
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
fn is_over(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Over => true,
        Outcome::Decided(d) => !d.allowed(),
    }
}

/// Whether the call is refused: an enforced limit is over (not one in
/// shadow mode), or every limit in quota mode is.
fn refused(plans: &[Plan], outcomes: &[Option<Outcome>]) -> bool {
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

/// Every descriptor answered `code`, for a backend that failed under a
/// policy that decides without it.
fn uniform(plans: &[Plan], code: i32) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code,
        statuses: plans
            .iter()
            .map(|_| DescriptorStatus {
                code,
                ..DescriptorStatus::default()
            })
            .collect(),
        ..RateLimitResponse::default()
    }
}

fn seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The time to the end of the unit's current window, aligned as the
/// reference aligns it.
fn window_reset(unit: Unit) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let period = unit.period().as_secs();
    period - now % period
}

fn respond(domain: &str, plans: &[Plan], outcomes: &[Option<Outcome>]) -> RateLimitResponse {
    let mut response = RateLimitResponse::default();
    let mut policy = String::new();
    let mut state = String::new();
    let mut retry_after = 0u64;
    for (plan, outcome) in plans.iter().zip(outcomes) {
        let status = match (plan, outcome) {
            (Plan::Unlimited, _) => DescriptorStatus {
                code: code::OK,
                limit_remaining: u32::MAX,
                ..DescriptorStatus::default()
            },
            (Plan::Limited { limit, hits, .. }, Some(outcome)) => {
                let (over, remaining, reset, wait) = match outcome {
                    Outcome::Over => {
                        let reset = window_reset(limit.unit);
                        (true, 0, reset, reset)
                    }
                    Outcome::Decided(d) => {
                        let q = &d.quotas()[0];
                        let wait = d.retry_after().map_or(0, seconds).max(1);
                        (is_over(outcome), q.remaining(), seconds(q.reset()), wait)
                    }
                };
                count(domain, limit, *hits, over, remaining);
                let enforced = over && !limit.shadow_mode;
                if enforced && !limit.quota_mode {
                    retry_after = retry_after.max(wait);
                }
                header_items(&mut policy, &mut state, limit, remaining, reset);
                DescriptorStatus {
                    code: if enforced { code::OVER_LIMIT } else { code::OK },
                    current_limit: Some(CurrentLimit {
                        requests_per_unit: limit.requests_per_unit,
                        unit: limit.unit.to_proto(),
                        name: limit.name.clone(),
                    }),
                    limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                    duration_until_reset: Some(ProtoDuration {
                        seconds: i64::try_from(reset).unwrap_or(i64::MAX),
                        nanos: 0,
                    }),
                }
            }
            _ => DescriptorStatus {
                code: code::OK,
                ..DescriptorStatus::default()
            },
        };
        response.statuses.push(status);
    }
    let over = refused(plans, outcomes);
    response.overall_code = if over { code::OVER_LIMIT } else { code::OK };
    if !policy.is_empty() {
        response.response_headers_to_add.push(HeaderValue {
            key: "ratelimit-policy".into(),
            value: policy,
        });
        response.response_headers_to_add.push(HeaderValue {
            key: "ratelimit".into(),
            value: state,
        });
    }
    if over {
        let wait = if retry_after == 0 { 1 } else { retry_after };
        response.response_headers_to_add.push(HeaderValue {
            key: "retry-after".into(),
            value: wait.to_string(),
        });
    }
    response
}

/// Appends a limit's draft-11 items: `"name";q=N;w=S` to the policy and
/// `"name";r=N;t=S` to the state.
fn header_items(
    policy: &mut String,
    state: &mut String,
    limit: &Limit,
    remaining: u64,
    reset: u64,
) {
    let name = if limit.name.is_empty() {
        &*limit.path
    } else {
        &limit.name
    };
    for out in [&mut *policy, &mut *state] {
        if !out.is_empty() {
            out.push_str(", ");
        }
        sf_string(out, name);
    }
    let _ = write!(
        policy,
        ";q={};w={}",
        limit.requests_per_unit,
        limit.unit.period().as_secs()
    );
    let _ = write!(state, ";r={remaining};t={reset}");
}

/// `text` as an RFC 9651 string: quotes and backslashes escaped, anything
/// else not printable ASCII as `_` (names come from the configuration).
fn sf_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
}

/// The reference's counters, by domain and configured descriptor path
/// (never the request's values: the number of series stays bounded by
/// the configuration).
fn count(domain: &str, limit: &Limit, hits: u64, over: bool, remaining: u64) {
    let labels = [
        ("domain", domain.to_owned()),
        ("descriptor", limit.path.to_string()),
    ];
    metrics::counter!("tollgate_rls_total_hits", &labels).increment(hits);
    if over {
        if limit.shadow_mode {
            metrics::counter!("tollgate_rls_shadow_mode", &labels).increment(hits);
        }
        metrics::counter!("tollgate_rls_over_limit", &labels).increment(hits);
        return;
    }
    metrics::counter!("tollgate_rls_within_limit", &labels).increment(hits);
    let limit_hits = f64::from(limit.requests_per_unit);
    #[allow(clippy::cast_precision_loss)]
    let used = limit_hits - remaining as f64;
    if used > limit_hits * NEAR_LIMIT {
        metrics::counter!("tollgate_rls_near_limit", &labels).increment(hits);
    }
}
