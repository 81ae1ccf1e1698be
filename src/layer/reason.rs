//! Why a request was passed or answered: one machine-readable reason per
//! decision, for logs, metrics, problem bodies and handlers.

use std::fmt;

use metrics::{Counter, Unit, counter, describe_counter};

use crate::metrics::DECISION_REASONS;
use crate::{Decision, Mode, QuotaSet};

/// Why the layer passed or answered a request: one per decision, with a
/// stable [`as_str`](Reason::as_str) for logs, the
/// `tollgate_decision_reasons_total` metric's `reason` label (bounded: one
/// series per variant), and the `reason` member of the layer's
/// problem+json bodies.
///
/// A passed request carries it in its extensions beside the
/// [`Decision`](crate::Decision) when the layer is built with
/// [`decision_in_extensions`](super::RateLimitLayerBuilder::decision_in_extensions);
/// a response the layer makes carries it in the response's extensions.
/// Which quota refused is in the decision ([`Decision::violated`](crate::Decision::violated))
/// and the problem body's `violated-policies`.
///
/// ```
/// use tollgate::layer::Reason;
///
/// assert_eq!(Reason::Quota.as_str(), "quota");
/// assert_eq!(Reason::Lease.to_string(), "lease");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The rate quotas admitted it, within their limits (or nothing limits
    /// it: a concurrency slot alone, no rule matching).
    Admitted,
    /// A rate quota refused it.
    Quota,
    /// A concurrency quota had no slot free.
    Concurrency,
    /// The client is on the deny list.
    DenyList,
    /// The client is on the allow list: not limited.
    AllowList,
    /// The key is blocked for a while (a penalty).
    Blocked,
    /// Refused from a remembered refusal, without asking the shared store.
    DenialCache,
    /// Admitted from units leased from the shared store, without asking it.
    Lease,
    /// The limiter could not decide and the policy let the request through.
    FailOpen,
    /// The limiter could not decide and the policy refused the request (503).
    Unavailable,
    /// The store did not answer in time (let through or refused by the
    /// failure policy).
    Timeout,
    /// Admitted, though a shadow quota would have refused it.
    Shadow,
    /// Admitted within a soft quota's margin over its limit.
    Soft,
    /// Admitted within an elastic quota's extra, while the server has room.
    Elastic,
    /// A leaky-bucket quota admitted it after a delay (or, with
    /// [`OnDelay::Reject`](super::OnDelay::Reject), refused it).
    Delayed,
    /// Shed: the server is overloaded.
    Shed,
    /// The request has no usable key (let through or refused by the
    /// missing-key policy).
    NoKey,
    /// It costs more than a quota can ever admit.
    TooCostly,
    /// The request cannot be read well enough to be checked (a path with no
    /// normal form, a repeated header, an unreadable client address while
    /// lists need it).
    BadRequest,
}

impl Reason {
    /// Every reason, in the order of their metric handles.
    pub(crate) const ALL: [Reason; 19] = [
        Reason::Admitted,
        Reason::Quota,
        Reason::Concurrency,
        Reason::DenyList,
        Reason::AllowList,
        Reason::Blocked,
        Reason::DenialCache,
        Reason::Lease,
        Reason::FailOpen,
        Reason::Unavailable,
        Reason::Timeout,
        Reason::Shadow,
        Reason::Soft,
        Reason::Elastic,
        Reason::Delayed,
        Reason::Shed,
        Reason::NoKey,
        Reason::TooCostly,
        Reason::BadRequest,
    ];

    /// The reason's name, stable across versions: snake case, as logs,
    /// metric labels and problem bodies write it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Admitted => "admitted",
            Reason::Quota => "quota",
            Reason::Concurrency => "concurrency",
            Reason::DenyList => "deny_list",
            Reason::AllowList => "allow_list",
            Reason::Blocked => "blocked",
            Reason::DenialCache => "denial_cache",
            Reason::Lease => "lease",
            Reason::FailOpen => "fail_open",
            Reason::Unavailable => "unavailable",
            Reason::Timeout => "timeout",
            Reason::Shadow => "shadow",
            Reason::Soft => "soft",
            Reason::Elastic => "elastic",
            Reason::Delayed => "delayed",
            Reason::Shed => "shed",
            Reason::NoKey => "no_key",
            Reason::TooCostly => "too_costly",
            Reason::BadRequest => "bad_request",
        }
    }

    /// The reason of an admission that a quota of `quotas` made only with
    /// units beyond its reported limit: [`Soft`](Reason::Soft) within a
    /// soft quota's margin, [`Elastic`](Reason::Elastic) within an elastic
    /// quota's extra; `None` when every quota admitted within its limit.
    /// A set without such quotas costs a look at each quota's mode.
    #[inline]
    pub(crate) fn beyond_limit(quotas: &QuotaSet, decision: &Decision) -> Option<Reason> {
        (quotas.quotas().iter().zip(decision.quotas())).find_map(|(quota, answer)| {
            let reason = match quota.mode() {
                Mode::Soft { .. } => Reason::Soft,
                Mode::Elastic { .. } => Reason::Elastic,
                Mode::Enforce | Mode::Shadow => return None,
            };
            (answer.allowed() && answer.over_limit()).then_some(reason)
        })
    }

    /// Of two limits' reasons for one passed request, the one to report:
    /// the more telling (a shadow refusal over a plain admission).
    pub(crate) fn and(self, other: Reason) -> Reason {
        match self {
            Reason::Admitted | Reason::Lease | Reason::AllowList => other,
            _ => self,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_name_and_its_place_in_all() {
        for (i, reason) in Reason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i, "{reason} out of place");
            let same = Reason::ALL.iter().filter(|r| r.as_str() == reason.as_str());
            assert_eq!(same.count(), 1, "{reason}");
        }
    }
}

/// A policy's decisions by [`Reason`]: one handle per reason, registered
/// when the policy is built.
#[derive(Debug, Clone)]
pub(crate) struct ReasonMetrics([Counter; Reason::ALL.len()]);

impl ReasonMetrics {
    pub(crate) fn new() -> Self {
        describe_counter!(
            DECISION_REASONS,
            Unit::Count,
            "Requests decided by the layer or the rules, by reason (admitted, quota, lease, denial_cache, shed, deny_list, ...: one series per reason)."
        );
        ReasonMetrics(Reason::ALL.map(|r| counter!(DECISION_REASONS, "reason" => r.as_str())))
    }

    /// One more request decided for `reason`.
    #[inline]
    pub(crate) fn count(&self, reason: Reason) {
        self.0[reason as usize].increment(1);
    }
}
