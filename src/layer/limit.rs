//! A limiter as the pipeline uses it: asked within the policy's timeout,
//! its reservations settled once the response is known, its decisions
//! near the limit counted.

use std::sync::Arc;
use std::time::Duration;

use metrics::Counter;

use super::count_status::CountStatus;
use super::headers::{PolicyHeader, policy_header};
use super::respond::ResponsePolicy;
use super::usage::SettleWith;
use super::verdict::Verdict;
use crate::backend::{Backend, BackendError, BackendErrorKind, Reserved};
use crate::decision::Decision;
use crate::key::Key;
use crate::layer::protect::Protection;
use crate::layer::protect::held::Settlement;
use crate::limiter::{Error, Limiter};

/// The share of a quota above which an admitted decision counts as near
/// its limit, by default.
pub(crate) const DEFAULT_NEAR_LIMIT: f64 = 0.8;

/// Asks the limiter, within `timeout` when the backend must be awaited;
/// `room`: whether elastic quotas may use their extra.
pub(crate) async fn check_within<B: Backend>(
    limiter: &Limiter<B>,
    key: &Key,
    cost: u64,
    timeout: Duration,
    room: bool,
) -> Result<Decision, Error> {
    if let Some(outcome) = limiter.with_room(room).check_now(key.as_str(), cost) {
        return outcome;
    }
    let check = limiter.with_room(room).check(key.as_str(), cost);
    let started = crate::clock::Stopwatch::start();
    tokio::time::timeout(timeout, check)
        .await
        .unwrap_or_else(|_| {
            let outcome = Err(timed_out(timeout));
            // The check was dropped before it could count itself.
            limiter.metrics().decided(&outcome, started);
            outcome
        })
}

/// A response-aware limit's reservation before the request, within
/// `timeout`: spent now, settled once the response is known (see
/// [`Limit::settlement`]).
pub(crate) async fn reserve_within<B: Backend>(
    limiter: &Limiter<B>,
    key: &Key,
    cost: u64,
    timeout: Duration,
    room: bool,
) -> Result<Reserved, Error> {
    let reserve = limiter.with_room(room).reserve(key.as_str(), cost);
    let started = crate::clock::Stopwatch::start();
    tokio::time::timeout(timeout, reserve)
        .await
        .unwrap_or_else(|_| {
            // The reservation was dropped before it could count itself. If
            // the store had spent it already, it stays spent: the strict
            // side.
            limiter.metrics().decided(&Err::<Decision, ()>(()), started);
            Err(timed_out(timeout))
        })
}

fn timed_out(timeout: Duration) -> Error {
    Error::Backend(BackendError::new(
        BackendErrorKind::Timeout,
        format!("no answer within {timeout:?}"),
    ))
}

/// A limiter as a policy uses it: with its `RateLimit-Policy` header, the
/// same on every response, made once.
pub(crate) struct Limit<B> {
    pub limiter: Limiter<B>,
    policy_header: PolicyHeader,
    /// Whether a quota is elastic, so that the load is read only for sets
    /// it can change.
    elastic: bool,
    /// Admitted decisions above this share of their binding quota count
    /// as near the limit.
    near_share: f64,
    near_limit: Counter,
}

impl<B> Limit<B> {
    pub(crate) fn new(limiter: Limiter<B>) -> Self {
        Limit {
            policy_header: policy_header(limiter.quotas()),
            elastic: (limiter.quotas().quotas().iter()).any(|q| q.params.elastic_margin > 0),
            near_share: DEFAULT_NEAR_LIMIT,
            near_limit: crate::metrics::near_limit(limiter.quotas().name()),
            limiter,
        }
    }

    /// Counts admitted decisions above `share` of their binding quota as
    /// near the limit.
    pub(crate) fn set_near_limit(&mut self, share: f64) {
        self.near_share = share;
    }

    /// Whether the server has room for this limit's elastic quotas' extra,
    /// as `protect`'s load signal says; no elastic quota, no question.
    pub(crate) fn room(&self, protect: &Protection) -> bool {
        self.elastic && protect.room()
    }

    /// Settles `reserved`, spent for `key` and `cost`, once the response is
    /// known: kept if its status is one of `counts`, else given back within
    /// `timeout`, and the response then says what is left. Dropped
    /// unsettled (the response never came), it is kept.
    pub(crate) fn settlement(
        self: Arc<Self>,
        respond: &ResponsePolicy,
        counts: &CountStatus,
        key: Key,
        cost: u64,
        reserved: Reserved,
        timeout: Duration,
    ) -> Settlement
    where
        B: Backend,
    {
        let limit = self;
        let (respond, counts) = (respond.clone(), counts.clone());
        Box::new(move |status| {
            if counts.contains(status) || !reserved.decision().allowed() {
                return None;
            }
            Some(Box::pin(async move {
                let left = limit.give_back(&key, cost, &reserved, timeout).await?;
                Some(respond.headers(&limit.policy_header, &key, &left, None))
            }))
        })
    }

    /// Settles `reserved`, spent for `key` and `cost`, with the real cost
    /// once the response body ends: in a task of its own, as a body's end
    /// cannot wait for the store. A failure is logged, and the reservation
    /// stands: the strict side when usage was below it, and what is known
    /// when it was above.
    pub(crate) fn settle_with(
        self: Arc<Self>,
        key: Key,
        cost: u64,
        reserved: Reserved,
        timeout: Duration,
    ) -> SettleWith
    where
        B: Backend,
    {
        Box::new(move |actual| {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                tracing::warn!("no runtime to settle a reservation with its usage; it stands");
                return;
            };
            runtime.spawn(async move {
                let settle = self
                    .limiter
                    .settle_reserved(key.as_str(), cost, &reserved, actual);
                let error = match tokio::time::timeout(timeout, settle).await {
                    Ok(Ok(_)) => return,
                    Ok(Err(error)) => error,
                    Err(_) => timed_out(timeout),
                };
                // Not the key: it may be a credential (an API key header).
                tracing::warn!(
                    error = error.to_string().as_str(),
                    "could not settle a reservation with its usage; it stands"
                );
            });
        })
    }

    /// Gives back `reserved` within `timeout`: what is left then. A
    /// failure is logged, and the units stay spent: the strict side.
    pub(crate) async fn give_back(
        &self,
        key: &Key,
        cost: u64,
        reserved: &Reserved,
        timeout: Duration,
    ) -> Option<Decision>
    where
        B: Backend,
    {
        let back = self
            .limiter
            .give_back_reserved(key.as_str(), cost, 1, reserved);
        let error = match tokio::time::timeout(timeout, back).await {
            Ok(Ok(left)) => return Some(left),
            Ok(Err(error)) => error,
            Err(_) => timed_out(timeout),
        };
        // Not the key: it may be a credential (an API key header).
        tracing::warn!(
            error = error.to_string().as_str(),
            "could not give back a reservation; it stays spent"
        );
        None
    }

    /// What becomes of a request given the limiter's answer; `local`: made
    /// here without the shared store.
    #[inline]
    pub(super) fn judge(
        &self,
        respond: &ResponsePolicy,
        key: &Key,
        outcome: Result<&Decision, &Error>,
        local: bool,
    ) -> Verdict {
        if let Ok(decision) = outcome {
            self.count_near_limit(decision);
        }
        let quotas = self.limiter.quotas();
        respond.judge(quotas, &self.policy_header, key, outcome, local)
    }

    /// Counts an admitted decision that used more than the near-limit share
    /// of its binding quota.
    #[inline]
    fn count_near_limit(&self, decision: &Decision) {
        if !decision.allowed() {
            return;
        }
        // One quota binds itself: no search, no second reading of its reset.
        let binding = match decision.quotas() {
            [only] => only,
            _ => match decision.binding() {
                Some(binding) => binding,
                None => return,
            },
        };
        let limit = binding.limit();
        let used = limit.saturating_sub(binding.remaining());
        if used as f64 > self.near_share * limit as f64 {
            self.near_limit.increment(1);
        }
    }
}
