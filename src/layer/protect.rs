//! Protecting the server as well as the quota: load shedding before a
//! request's key is looked at, a concurrency slot before its rate quotas,
//! and the load measurement while it is served.

// The refusals below are verdicts, large because their headers are kept
// inline (saving an allocation per request); they are moved once.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::request::Parts;
use http::{HeaderValue, StatusCode};

use super::concurrency::{ConcurrencyQuota, ELASTIC_ROOM};
use super::headers::{Headers, add_headers, push_retry_after, retry_after_secs};
use super::load::{LoadSignal, MeasuredLoad};
use super::problem::{QUOTA_EXCEEDED, problem};
use super::respond::{CONCURRENCY_RETRY_AFTER, Refused, Rejection, ResponsePolicy, with_headers};
use super::shed::{Priority, Shedding, TEMPORARY_REDUCED_CAPACITY};
use super::verdict::{Verdict, VerdictKind};
use crate::backend::{Acquired, BackendError, BackendErrorKind, Slot};
use crate::key::Key;
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
        tracing::debug!(priority = priority.name(), load, "request shed");
        let wait = retry_after_secs(shedding.retry_after_time());
        let detail = format!("The server is overloaded; retry in {wait} seconds.");
        let mut response = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            TEMPORARY_REDUCED_CAPACITY,
            &detail,
            &[],
        );
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(wait));
        Some(Verdict::respond(response))
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

    /// The final verdict: a passing one holds the slot and is counted in
    /// flight until its response is over; a refusal gives the slot back,
    /// so quotas are all-or-nothing.
    #[inline]
    pub(crate) fn finish(&self, admission: Admission, verdict: Verdict) -> Verdict {
        // A layer of rate quotas alone: nothing to add, nothing to move.
        if admission.slot.is_none() && admission.headers.is_empty() && self.measured.is_none() {
            return verdict;
        }
        let VerdictKind::Pass {
            mut headers,
            delay,
            held,
        } = verdict.0
        else {
            return verdict;
        };
        add_headers(&mut headers, admission.headers);
        let in_flight = self.measured.as_ref().map(MeasuredLoad::start);
        let held = match (held, admission.slot, in_flight) {
            (held, None, None) => held,
            (held, slot, in_flight) => {
                let mut held = held.unwrap_or_default();
                held.slots.extend(slot);
                held.in_flight = held.in_flight.or(in_flight);
                Some(held)
            }
        };
        Verdict(VerdictKind::Pass {
            headers,
            delay,
            held,
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
            tracing::debug!(
                key = respond.logged_key(key).as_str(),
                quota = quota.quota_name(),
                in_use,
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
                    )
                }
            };
            let mut headers = headers(in_use);
            push_retry_after(&mut headers, style, CONCURRENCY_RETRY_AFTER);
            Err(Verdict::respond(with_headers(response, headers)))
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
