//! A decision as Envoy reads it: each descriptor's status, the overall
//! code, the draft-11 `RateLimit-Policy` / `RateLimit` fields and
//! `Retry-After`, and the reference's counters.

use std::fmt::Write;
use std::time::Duration;

use super::config::{Limit, Unit};
use super::decide::{Outcome, Plan, is_over, refused};
use super::proto::{
    CurrentLimit, DescriptorStatus, HeaderValue, ProtoDuration, RateLimitResponse, code,
};

/// The reference's near-limit ratio: hits past 80% of a limit count as near.
const NEAR_LIMIT: f64 = 0.8;

/// Every descriptor answered `code`, for a backend that failed under a
/// policy that decides without it.
pub(super) fn uniform(plans: &[Plan], code: i32) -> RateLimitResponse {
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

pub(super) fn respond(
    domain: &str,
    plans: &[Plan],
    outcomes: &[Option<Outcome>],
) -> RateLimitResponse {
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
            (Plan::Limited { limit, units, .. }, Some(outcome)) => {
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
                count(domain, limit, *units, over, remaining);
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
/// the configuration). They count units: a call's hits times the limit's
/// `cost`, so that they add up to what `requests_per_unit` measures.
fn count(domain: &str, limit: &Limit, units: u64, over: bool, remaining: u64) {
    // The caller picks the addend (up to 2^64 - 1): one call could wrap a
    // counter around. No limit holds more than u32::MAX units, so no call
    // counts more.
    let units = units.min(u64::from(u32::MAX));
    let labels = [
        ("domain", domain.to_owned()),
        ("descriptor", limit.path.to_string()),
    ];
    metrics::counter!("tollgate_rls_total_hits", &labels).increment(units);
    if over {
        if limit.shadow_mode {
            metrics::counter!("tollgate_rls_shadow_mode", &labels).increment(units);
        }
        metrics::counter!("tollgate_rls_over_limit", &labels).increment(units);
        return;
    }
    metrics::counter!("tollgate_rls_within_limit", &labels).increment(units);
    let limit_hits = f64::from(limit.requests_per_unit);
    #[allow(clippy::cast_precision_loss)]
    let used = limit_hits - remaining as f64;
    if used > limit_hits * NEAR_LIMIT {
        metrics::counter!("tollgate_rls_near_limit", &labels).increment(units);
    }
}
