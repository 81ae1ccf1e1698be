//! What decides: a [`Policy`] turns a request's head into a [`Verdict`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use super::count_status::CountStatus;
use super::headers::{Headers, PolicyHeader, policy_header};
use super::held::Settlement;
use super::problem::problem;
use super::protect::{Admission, Protection};
use super::respond::ResponsePolicy;
use super::verdict::Verdict;
use crate::backend::{Backend, BackendError, BackendErrorKind, Reserved};
use crate::decision::Decision;
use crate::key::{Key, KeyError, KeyExtractor};
use crate::limiter::{Error, Limiter};

mod sealed {
    pub trait Sealed {}
}

/// Decides what becomes of each request. Implemented by [`LimitPolicy`]
/// (one limiter and key) and, with the `rules` feature, by the rules policy;
/// sealed, because the [`Verdict`] it returns is the layer's own.
pub trait Policy: sealed::Sealed + Send + Sync + 'static {
    /// The verdict, if it can be reached without waiting. Returning `None`
    /// must have changed nothing, since [`decide`](Policy::decide) follows.
    fn decide_now(&self, parts: &Parts) -> Option<Verdict>;

    /// The verdict, waiting for keys and backends as needed.
    fn decide<'a>(&'a self, parts: &'a Parts) -> impl Future<Output = Verdict> + Send + 'a;
}

/// What to do with a request whose key cannot be found (no such header, a
/// malformed `X-Forwarded-For`, a key over the length limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnMissingKey {
    /// Answer with the key error's status (400 when the request is at fault,
    /// 500 when the server is misconfigured) and a problem-details body. The
    /// default, so that a client cannot dodge its limit by sending a bad key.
    #[default]
    Reject,
    /// Let it through, unlimited.
    Allow,
}

pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;

/// What a request's key means for it. The verdict is large because its
/// headers are kept inline, which saves an allocation per request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum KeyOutcome {
    /// Limit it under this key.
    Limit(Key),
    /// Let it through unlimited, or answer it, without asking the limiter.
    Settled(Verdict),
}

/// The longest key accepted by default, in bytes.
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 256;

/// Checks an extracted key against the length limit and the missing-key
/// policy.
pub(crate) fn admit_key(
    key: Result<Key, KeyError>,
    max_len: usize,
    policy: OnMissingKey,
) -> KeyOutcome {
    let error = match key {
        Ok(key) if key.as_str().len() <= max_len => return KeyOutcome::Limit(key),
        Ok(key) => KeyError::TooLong {
            len: key.as_str().len(),
            max: max_len,
        },
        Err(e) => e,
    };
    match policy {
        OnMissingKey::Allow => {
            tracing::debug!(%error, "no rate-limit key; request passes unlimited");
            KeyOutcome::Settled(Verdict::pass(Headers::new()))
        }
        OnMissingKey::Reject => {
            if error.status().is_server_error() {
                tracing::error!(%error, "no rate-limit key");
            } else {
                tracing::debug!(%error, "no rate-limit key");
            }
            let detail = format!("No rate-limit key: {error}.");
            KeyOutcome::Settled(Verdict::respond(problem(
                error.status(),
                "about:blank",
                &detail,
                &[],
            )))
        }
    }
}

/// Asks the limiter, within `timeout` when the backend must be awaited;
/// `room`: whether elastic quotas may use their extra.
pub(crate) async fn check_within<B: Backend>(
    limiter: &Limiter<B>,
    key: &Key,
    cost: u64,
    timeout: Duration,
    room: bool,
) -> Result<Decision, Error> {
    if let Some(outcome) = limiter.check_now_with_room(key.as_str(), cost, room) {
        return outcome;
    }
    let check = limiter.check_with_room(key.as_str(), cost, room);
    within(limiter, timeout, check).await
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
    let reserve = limiter.reserve_with_room(key.as_str(), cost, room);
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

/// `ask` within `timeout`; a timeout is a backend error, counted as an
/// errored decision (the dropped ask could not count itself).
async fn within<B: Backend>(
    limiter: &Limiter<B>,
    timeout: Duration,
    ask: impl Future<Output = Result<Decision, Error>>,
) -> Result<Decision, Error> {
    let started = crate::clock::Stopwatch::start();
    tokio::time::timeout(timeout, ask)
        .await
        .unwrap_or_else(|_| {
            let outcome = Err(timed_out(timeout));
            // The check was dropped before it could count itself.
            limiter.metrics().decided(&outcome, started);
            outcome
        })
}

/// A limiter as a policy uses it: with its `RateLimit-Policy` header, the
/// same on every response, made once.
#[derive(Clone)]
pub(crate) struct Limit<B> {
    pub limiter: Limiter<B>,
    policy_header: PolicyHeader,
    /// Whether a quota is elastic, so that the load is read only for sets
    /// it can change.
    elastic: bool,
}

impl<B> Limit<B> {
    pub(crate) fn new(limiter: Limiter<B>) -> Self {
        Limit {
            policy_header: policy_header(limiter.quotas()),
            elastic: (limiter.quotas().quotas().iter()).any(|q| q.params.elastic_margin > 0),
            limiter,
        }
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
            .give_back_reserved(key.as_str(), cost, reserved);
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

    /// What becomes of a request given the limiter's answer.
    pub(crate) fn judge(
        &self,
        respond: &ResponsePolicy,
        key: &Key,
        outcome: Result<Decision, Error>,
    ) -> Verdict {
        respond.judge(self.limiter.quotas(), &self.policy_header, key, outcome)
    }
}

/// One limiter, one key extractor: what [`RateLimitLayer::new`](super::RateLimitLayer::new)
/// and its builder make (or no limiter: a concurrency quota alone, from
/// [`RateLimitLayer::concurrency_builder`](super::RateLimitLayer::concurrency_builder)).
pub struct LimitPolicy<B, K> {
    /// The rate quotas; `None` with only a concurrency quota.
    pub(crate) limit: Option<Arc<Limit<B>>>,
    pub(crate) key: K,
    pub(crate) respond: ResponsePolicy,
    pub(crate) on_missing_key: OnMissingKey,
    pub(crate) timeout: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) cost: Option<Arc<CostFn>>,
    /// Response-aware: reserve before the request, keep only for responses
    /// with these statuses.
    pub(crate) count_status: Option<CountStatus>,
    pub(crate) protect: Protection,
    /// Whether a passed request carries its decision in its extensions.
    pub(crate) decision_in_extensions: bool,
}

impl<B, K> LimitPolicy<B, K> {
    pub(crate) fn new(limiter: Option<Limiter<B>>, key: K) -> Self {
        LimitPolicy {
            limit: limiter.map(|l| Arc::new(Limit::new(l))),
            key,
            respond: ResponsePolicy::default(),
            on_missing_key: OnMissingKey::default(),
            timeout: Duration::from_millis(100),
            max_key_len: DEFAULT_MAX_KEY_LEN,
            cost: None,
            count_status: None,
            protect: Protection::default(),
            decision_in_extensions: false,
        }
    }

    /// The limiter; `None` for a layer with only a concurrency quota.
    pub fn limiter(&self) -> Option<&Limiter<B>> {
        self.limit.as_ref().map(|l| &l.limiter)
    }

    fn cost(&self, parts: &Parts) -> u64 {
        self.cost.as_ref().map_or(1, |f| f(parts))
    }

    /// `limit`'s verdict, carrying the decision for the inner service when
    /// asked to.
    fn judge(&self, limit: &Limit<B>, key: &Key, outcome: Result<Decision, Error>) -> Verdict {
        let decision = match &outcome {
            Ok(decision) if self.decision_in_extensions => Some(decision.clone()),
            _ => None,
        };
        let verdict = limit.judge(&self.respond, key, outcome);
        match decision {
            Some(decision) => verdict.with_decision(decision),
            None => verdict,
        }
    }
}

impl<B, K> fmt::Debug for LimitPolicy<B, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitPolicy")
            .field("quotas", &self.limiter().map(|l| l.quotas().name()))
            .field("header_style", &self.respond.header_style)
            .finish_non_exhaustive()
    }
}

impl<B, K> sealed::Sealed for LimitPolicy<B, K> {}

impl<B: Backend, K: KeyExtractor> Policy for LimitPolicy<B, K> {
    fn decide_now(&self, parts: &Parts) -> Option<Verdict> {
        // A response-aware limit reserves and settles, both awaited.
        let limit = self.limit.as_ref();
        let decides_now = limit.is_none_or(|l| l.limiter.backend().decides_now());
        if !decides_now || self.count_status.is_some() {
            return None;
        }
        if let Some(shed) = self.protect.shed(parts) {
            return Some(shed);
        }
        let key = self.key.extract(parts).into_ready().ok()?;
        let key = match admit_key(key, self.max_key_len, self.on_missing_key) {
            KeyOutcome::Limit(key) => key,
            KeyOutcome::Settled(verdict) => {
                return Some(self.protect.finish(Admission::default(), verdict));
            }
        };
        let admission = match self.protect.acquire_now(&key, &self.respond)? {
            Ok(admission) => admission,
            Err(refused) => return Some(refused),
        };
        let Some(limit) = limit else {
            return Some(
                self.protect
                    .finish(admission, Verdict::pass(Headers::new())),
            );
        };
        // Returning `None` here drops the slot just taken: nothing changed.
        let room = limit.room(&self.protect);
        let outcome = limit
            .limiter
            .check_now_with_room(key.as_str(), self.cost(parts), room)?;
        let verdict = self.judge(limit, &key, outcome);
        Some(self.protect.finish(admission, verdict))
    }

    async fn decide(&self, parts: &Parts) -> Verdict {
        if let Some(shed) = self.protect.shed(parts) {
            return shed;
        }
        let key = self.key.extract(parts).await;
        let key = match admit_key(key, self.max_key_len, self.on_missing_key) {
            KeyOutcome::Limit(key) => key,
            KeyOutcome::Settled(verdict) => {
                return self.protect.finish(Admission::default(), verdict);
            }
        };
        let admission = match self
            .protect
            .acquire(&key, &self.respond, self.timeout)
            .await
        {
            Ok(admission) => admission,
            Err(refused) => return refused,
        };
        let Some(limit) = &self.limit else {
            return self
                .protect
                .finish(admission, Verdict::pass(Headers::new()));
        };
        let cost = self.cost(parts);
        let room = limit.room(&self.protect);
        let Some(counts) = &self.count_status else {
            let outcome = check_within(&limit.limiter, &key, cost, self.timeout, room).await;
            let verdict = self.judge(limit, &key, outcome);
            return self.protect.finish(admission, verdict);
        };
        // Spent now, so requests in flight hold what they took; kept after
        // the response only if its status counts.
        let reserved = reserve_within(&limit.limiter, &key, cost, self.timeout, room).await;
        let (outcome, reserved) = match reserved {
            Ok(reserved) => (Ok(reserved.decision().clone()), Some(reserved)),
            Err(e) => (Err(e), None),
        };
        let verdict = self.judge(limit, &key, outcome);
        let verdict = match reserved {
            Some(reserved) => {
                let limit = Arc::clone(limit);
                let respond = &self.respond;
                let settle = limit.settlement(respond, counts, key, cost, reserved, self.timeout);
                verdict.settling(settle)
            }
            None => verdict,
        };
        self.protect.finish(admission, verdict)
    }
}

#[cfg(feature = "rules")]
pub(crate) use sealed::Sealed;
