//! Protecting the server as well as the quota: load shedding before a
//! request's key is looked at, a concurrency slot before its rate quotas,
//! and the load measurement while it is served. The layer and the rules
//! both use it; its public types are named from [`crate::layer`].

// The refusals below are verdicts, large because their headers are kept
// inline (saving an allocation per request); they are moved once.
#![allow(clippy::result_large_err)]

pub(crate) mod concurrency;
pub(crate) mod held;
pub(crate) mod load;
pub(crate) mod shed;

pub use concurrency::ConcurrencyQuota;
pub use load::{LoadSignal, MeasuredLoad};
pub use shed::{Priority, Shedding, SheddingError, TEMPORARY_REDUCED_CAPACITY};

use std::sync::Arc;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::request::Parts;
use http::{HeaderValue, StatusCode};

use self::concurrency::ELASTIC_ROOM;
use crate::backend::{Acquired, BackendError, BackendErrorKind, Slot};
use crate::key::Key;
use crate::layer::Reason;
use crate::layer::headers::{Headers, add_headers, push_retry_after, retry_after_secs};
use crate::layer::problem::{QUOTA_EXCEEDED, problem};
use crate::layer::respond::{
    CONCURRENCY_RETRY_AFTER, Refused, Rejection, ResponsePolicy, with_headers,
};
use crate::layer::verdict::{Verdict, VerdictKind};
use crate::limiter::Error;

/// What a policy does besides its rate quotas; nothing by default.
#[derive(Clone, Default)]
pub(crate) struct Protection {
    pub concurrency: Option<ConcurrencyQuota>,
    pub shedding: Option<Shedding>,
    pub signal: Option<Arc<dyn LoadSignal>>,
    pub measured: Option<MeasuredLoad>,
}

/// A request past its concurrency quota: its slot, and the headers saying so.
#[derive(Default)]
pub(crate) struct Admission {
    slot: Option<Slot>,
    headers: Headers,
}

impl Protection {
    /// The load now; `None` with no signal.
    fn load(&self) -> Option<f64> {
        self.signal.as_ref().map(|s| s.load())
    }

    /// Whether elastic rate quotas may use their extra now: only with a
    /// signal that says the load is under [`ELASTIC_ROOM`]. With no signal
    /// nothing tells, so there is no room.
    pub(crate) fn room(&self) -> bool {
        self.load().is_some_and(|load| load < ELASTIC_ROOM)
    }

    /// A 503 if the request is to be shed. With no load signal the load is
    /// unknown, which sheds: a check that cannot decide refuses.
    pub(crate) fn shed(&self, parts: &Parts) -> Option<Verdict> {
        let shedding = self.shedding.as_ref()?;
        self.shed_as(shedding.priority_of(parts))
    }

    /// [`shed`](Protection::shed) for a request whose priority is known
    /// (a rules file's rule gives it).
    pub(crate) fn shed_as(&self, priority: Priority) -> Option<Verdict> {
        let shedding = self.shedding.as_ref()?;
        let load = self.load().unwrap_or(f64::NAN);
        if !shedding.sheds(priority, load) {
            return None;
        }
        let reason = Reason::Shed;
        tracing::debug!(
            priority = priority.name(),
            load,
            reason = reason.as_str(),
            "request shed"
        );
        let wait = retry_after_secs(shedding.retry_after_time());
        let detail = format!("The server is overloaded; retry in {wait} seconds.");
        let mut response = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            TEMPORARY_REDUCED_CAPACITY,
            &detail,
            &[],
            reason,
        );
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(wait));
        Some(Verdict::respond(response, reason))
    }

    /// Takes a concurrency slot without waiting; `None` when the store must
    /// be awaited (nothing taken then).
    pub(crate) fn acquire_now(
        &self,
        key: &Key,
        respond: &ResponsePolicy,
    ) -> Option<Result<Admission, Verdict>> {
        let Some(quota) = &self.concurrency else {
            return Some(Ok(Admission::default()));
        };
        let acquired = quota
            .slots()
            .acquire_now(key.as_str(), quota.enforced(self.load()))?;
        Some(admit(quota, key, respond, acquired))
    }

    /// Takes a concurrency slot, waiting at most `timeout` for the store.
    pub(crate) async fn acquire(
        &self,
        key: &Key,
        respond: &ResponsePolicy,
        timeout: Duration,
    ) -> Result<Admission, Verdict> {
        let Some(quota) = &self.concurrency else {
            return Ok(Admission::default());
        };
        let limit = quota.enforced(self.load());
        let acquired = tokio::time::timeout(timeout, quota.slots().acquire(key.as_str(), limit))
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::new(
                    BackendErrorKind::Timeout,
                    format!("no concurrency slot within {timeout:?}"),
                ))
            });
        admit(quota, key, respond, acquired)
    }

    /// The final verdict: a passing one is counted in flight by the
    /// measured load until its response is over.
    #[inline]
    pub(crate) fn finish(&self, verdict: Verdict) -> Verdict {
        let Some(measured) = &self.measured else {
            return verdict;
        };
        let VerdictKind::Pass {
            headers,
            delay,
            held,
            reason,
        } = verdict.0
        else {
            return verdict;
        };
        let mut held = held.unwrap_or_default();
        held.in_flight = held.in_flight.or_else(|| Some(measured.start()));
        Verdict(VerdictKind::Pass {
            headers,
            delay,
            held: Some(held),
            reason,
        })
    }
}

impl Admission {
    /// `verdict` holding this slot: a passing one keeps it until its
    /// response is over and says so in its headers; a refusal gives it
    /// back, so a request's quotas are all-or-nothing.
    #[inline]
    pub(crate) fn hold(self, verdict: Verdict) -> Verdict {
        if self.slot.is_none() && self.headers.is_empty() {
            return verdict;
        }
        let VerdictKind::Pass {
            mut headers,
            delay,
            held,
            reason,
        } = verdict.0
        else {
            return verdict;
        };
        add_headers(&mut headers, self.headers);
        let held = match (held, self.slot) {
            (held, None) => held,
            (held, Some(slot)) => {
                let mut held = held.unwrap_or_default();
                held.slots.push(slot);
                Some(held)
            }
        };
        Verdict(VerdictKind::Pass {
            headers,
            delay,
            held,
            reason,
        })
    }
}

fn admit(
    quota: &ConcurrencyQuota,
    key: &Key,
    respond: &ResponsePolicy,
    acquired: Result<Acquired, BackendError>,
) -> Result<Admission, Verdict> {
    let style = respond.header_style;
    let headers = |in_use| quota.headers(in_use, style);
    match acquired {
        Ok(Acquired::Granted { slot, in_use }) => Ok(Admission {
            slot: Some(slot),
            headers: headers(in_use),
        }),
        Ok(Acquired::Full { in_use }) => {
            let reason = Reason::Concurrency;
            tracing::debug!(
                key = respond.logged_key(key).as_str(),
                quota = quota.quota_name(),
                in_use,
                reason = reason.as_str(),
                "too many requests at once"
            );
            let response = match &respond.rejection {
                Some(custom) => custom(&Rejection {
                    key,
                    refused: Refused::Concurrency { quota, in_use },
                }),
                None => {
                    let detail = format!(
                        "Too many requests at once; retry in {CONCURRENCY_RETRY_AFTER} seconds."
                    );
                    problem(
                        StatusCode::TOO_MANY_REQUESTS,
                        QUOTA_EXCEEDED,
                        &detail,
                        &[quota.quota_name()],
                        reason,
                    )
                }
            };
            let mut headers = headers(in_use);
            push_retry_after(&mut headers, style, CONCURRENCY_RETRY_AFTER);
            Err(Verdict::respond(with_headers(response, headers), reason))
        }
        Err(error) => {
            let verdict = respond.failed(key, &Error::Backend(error));
            match verdict.0 {
                VerdictKind::Pass { .. } => Ok(Admission::default()),
                VerdictKind::Respond(_) => Err(verdict),
            }
        }
    }
}
