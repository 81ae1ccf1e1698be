//! How a decision becomes a response: the response policy, and what it
//! does when the limiter could not decide.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

use super::headers::{
    HeaderStyle, Headers, PolicyHeader, rate_limit_headers, refusal_wait, retry_after_secs,
};
use super::partition_key::PartitionKey;
use super::problem::{QUOTA_EXCEEDED, problem};
use super::reason::Reason;
use super::verdict::Verdict;
use crate::backend::BackendErrorKind;
use crate::decision::Decision;
use crate::key::Key;
use crate::layer::protect::concurrency::ConcurrencyQuota;
use crate::limiter::Error;
use crate::quota_set::QuotaSet;

/// What to do with a request when the backend fails or does not answer in
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBackendError {
    /// Let it through, unlimited (the default: if unsure, do not limit).
    #[default]
    Allow,
    /// Answer 503 Service Unavailable.
    Reject,
}

/// What to do when a leaky-bucket quota admits a request with a delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDelay {
    /// Hold the request for the delay, then pass it on (the default): the
    /// inner service sees evenly spaced requests.
    #[default]
    Wait,
    /// Answer 429 at once with the delay as `Retry-After`. The request's
    /// place in the queue is spent; use a queue of one (`burst(1)`) to never
    /// delay instead.
    Reject,
}

/// A refused request, for a custom response (see
/// [`RateLimitLayerBuilder::rejection_response`](super::RateLimitLayerBuilder::rejection_response)):
/// by rate quotas or by a concurrency quota.
#[derive(Debug)]
pub struct Rejection<'a> {
    /// The key that was limited.
    pub key: &'a Key,
    /// What refused it.
    pub refused: Refused<'a>,
}

/// What refused a request.
#[derive(Debug)]
#[non_exhaustive]
pub enum Refused<'a> {
    /// Rate quotas.
    Rate {
        /// The decision.
        decision: &'a Decision,
        /// The quotas, in the order of `decision.quotas()`.
        quotas: &'a QuotaSet,
    },
    /// A concurrency quota whose slots were all taken.
    Concurrency {
        /// The quota.
        quota: &'a ConcurrencyQuota,
        /// Requests of the key under way.
        in_use: u64,
    },
}

impl Rejection<'_> {
    /// The names of the quotas that refused.
    pub fn violated(&self) -> Vec<&str> {
        match &self.refused {
            Refused::Rate { decision, quotas } => decision
                .violated()
                .filter_map(|i| quotas.quotas().get(i).map(|q| q.name()))
                .collect(),
            Refused::Concurrency { quota, .. } => vec![quota.quota_name()],
        }
    }

    /// When the same request could pass, as `Retry-After` says it (a
    /// concurrency quota cannot know: 1 s).
    pub fn retry_after(&self) -> Duration {
        match &self.refused {
            Refused::Rate { decision, .. } => decision.retry_after().unwrap_or(Duration::ZERO),
            Refused::Concurrency { .. } => Duration::from_secs(CONCURRENCY_RETRY_AFTER),
        }
    }
}

/// `Retry-After` of a request refused by a concurrency quota: slots come
/// free when requests end, which is not known ahead.
pub(crate) const CONCURRENCY_RETRY_AFTER: u64 = 1;

pub(crate) type RejectFn = dyn Fn(&Rejection<'_>) -> Response<Bytes> + Send + Sync;

/// How decisions are told to clients, and what failures mean.
#[derive(Clone, Default)]
pub(crate) struct ResponsePolicy {
    pub header_style: HeaderStyle,
    pub on_backend_error: OnBackendError,
    pub on_delay: OnDelay,
    pub rejection: Option<Arc<RejectFn>>,
    pub partition_key: Option<PartitionKey>,
    /// Log lines show client keys as they are, not hashed.
    pub log_raw_keys: bool,
}

impl ResponsePolicy {
    /// `key` as log lines show it: a keyed hash by default (see
    /// [`PartitionKey::logged`]), the key itself when asked for. Given to
    /// `tracing` as a `&str`, which its formatters quote and escape, so a
    /// key cannot pose as other fields.
    pub(crate) fn logged_key(&self, key: &Key) -> String {
        if self.log_raw_keys {
            return key.as_str().to_owned();
        }
        PartitionKey::logged(self.partition_key.as_ref(), key.as_str())
    }

    /// Turns the limiter's answer into what happens to the request. The one
    /// place that decides, whatever the policy and path. `policy_header` is
    /// `quotas`' `RateLimit-Policy`, made once by the caller; `local`: the
    /// decision was made here without the shared store (from a lease or a
    /// remembered refusal).
    pub(crate) fn judge(
        &self,
        quotas: &QuotaSet,
        policy_header: &PolicyHeader,
        key: &Key,
        outcome: Result<&Decision, &Error>,
        local: bool,
    ) -> Verdict {
        // By reference: the decision (64 bytes) is not moved again.
        let decision = match outcome {
            Ok(decision) => decision,
            Err(error) => return self.failed(key, error),
        };
        if decision.allowed() {
            let mut reason = if local {
                Reason::Lease
            } else {
                Reason::Admitted
            };
            if let Some(beyond) = Reason::beyond_limit(quotas, decision) {
                reason = beyond;
                tracing::debug!(
                    key = self.logged_key(key).as_str(),
                    set = quotas.name(),
                    reason = reason.as_str(),
                    "admitted beyond the quota's limit"
                );
            }
            if decision.exceeded() {
                reason = Reason::Shadow;
                tracing::info!(
                    key = self.logged_key(key).as_str(),
                    set = quotas.name(),
                    reason = reason.as_str(),
                    "shadow quota would have refused the request"
                );
            }
            let delay = decision.delay();
            if !delay.is_zero() {
                reason = Reason::Delayed;
            }
            if delay.is_zero() || self.on_delay == OnDelay::Wait {
                let headers = self.headers(policy_header, key, decision, None);
                return Verdict::pass_after(headers, delay, reason);
            }
            let wait = retry_after_secs(delay);
            let headers = self.headers(policy_header, key, decision, Some(wait));
            let detail = format!("Queued; retry in {wait} seconds.");
            let response = problem(
                StatusCode::TOO_MANY_REQUESTS,
                QUOTA_EXCEEDED,
                &detail,
                &[],
                reason,
            );
            return Verdict::respond(with_headers(response, headers), reason);
        }
        let reason = if local {
            Reason::DenialCache
        } else {
            Reason::Quota
        };
        let headers = self.headers(policy_header, key, decision, refusal_wait(decision));
        let rejection = Rejection {
            key,
            refused: Refused::Rate { decision, quotas },
        };
        tracing::debug!(
            key = self.logged_key(key).as_str(),
            violated = ?rejection.violated(),
            reason = reason.as_str(),
            "rate limited"
        );
        let response = match &self.rejection {
            Some(respond) => respond(&rejection),
            None => {
                let wait = decision.retry_after().map_or(1, retry_after_secs);
                let detail = format!("Quota exceeded; retry in {wait} seconds.");
                problem(
                    StatusCode::TOO_MANY_REQUESTS,
                    QUOTA_EXCEEDED,
                    &detail,
                    &rejection.violated(),
                    reason,
                )
            }
        };
        Verdict::respond(with_headers(response, headers), reason)
    }

    /// The rate-limit headers for `decision` on `key`'s quotas, and
    /// `Retry-After: wait` if the response is a 429 that waits.
    pub(crate) fn headers(
        &self,
        policy_header: &PolicyHeader,
        key: &Key,
        decision: &Decision,
        wait: Option<u64>,
    ) -> Headers {
        let pk = self.partition_key.as_ref().map(|pk| pk.of(key.as_str()));
        rate_limit_headers(
            self.header_style,
            policy_header,
            decision,
            wait,
            pk.as_deref(),
        )
    }

    pub(crate) fn failed(&self, key: &Key, error: &Error) -> Verdict {
        if let Error::CostTooHigh { .. } = error {
            // A cost no quota can ever admit is refused, never let through:
            // a cost read from the request (its size, a header) would
            // otherwise let a client switch its limit off. 413, as it will
            // never pass whenever it is retried; logged at a limited rate,
            // as a client can repeat it.
            static TOO_COSTLY: crate::log_limit::LogLimit = crate::log_limit::LogLimit::new();
            if let Some(more) = TOO_COSTLY.admit() {
                tracing::warn!(
                    key = self.logged_key(key).as_str(),
                    error = error.to_string().as_str(),
                    "request refused: it costs more than a quota can ever admit{more}"
                );
            }
            let detail = format!("{error}.");
            let reason = Reason::TooCostly;
            return Verdict::respond(
                problem(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "about:blank",
                    &detail,
                    &[],
                    reason,
                ),
                reason,
            );
        }
        let timed_out = matches!(error, Error::Backend(e) if e.kind() == BackendErrorKind::Timeout);
        let reason = match self.on_backend_error {
            _ if timed_out => Reason::Timeout,
            OnBackendError::Allow => Reason::FailOpen,
            OnBackendError::Reject => Reason::Unavailable,
        };
        static UNDECIDED: crate::log_limit::LogLimit = crate::log_limit::LogLimit::new();
        if let Some(more) = UNDECIDED.admit() {
            // The error as a quoted string: it may carry a Redis reply.
            tracing::warn!(
                key = self.logged_key(key).as_str(),
                error = error.to_string().as_str(),
                policy = ?self.on_backend_error,
                reason = reason.as_str(),
                "rate limiter could not decide{more}"
            )
        }
        match self.on_backend_error {
            OnBackendError::Allow => Verdict::pass(Headers::new(), reason),
            OnBackendError::Reject => Verdict::respond(
                problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "about:blank",
                    "The rate limiter is unavailable.",
                    &[],
                    reason,
                ),
                reason,
            ),
        }
    }
}

/// Adds headers the response does not set itself.
pub(crate) fn with_headers(mut response: Response<Bytes>, headers: Headers) -> Response<Bytes> {
    for (name, value) in headers {
        let name = name.header();
        if !response.headers().contains_key(&name) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logged_keys_are_the_partition_key_unless_raw_keys_are_asked_for() {
        let key = Key::from("key:sk_live_SECRET123".to_owned());
        let mut respond = ResponsePolicy::default();
        assert_eq!(
            respond.logged_key(&key),
            PartitionKey::random().of(key.as_str())
        );
        let pk = PartitionKey::with_secret([7; 16]);
        respond.partition_key = Some(pk.clone());
        assert_eq!(respond.logged_key(&key), pk.of(key.as_str()));
        assert!(!respond.logged_key(&key).contains("SECRET"));
        respond.log_raw_keys = true;
        assert_eq!(respond.logged_key(&key), key.as_str());
    }
}
