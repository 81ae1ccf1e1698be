//! One call to Redis: the denial cache and the lease first, then the
//! circuit breaker, the script within the timeout, and the failure policy
//! when it fails.

use std::future::Future;
use std::pin::Pin;

use super::super::breaker::{Permit, ProbeGuard, Transition};
use super::super::cache::{DenialCache, Hit, Turn};
use super::super::on_failure::OnFailure;
use super::super::script::{self, Ask, Reply};
use super::super::stats::bump;
use crate::backend::{BackendError, BackendErrorKind, CheckRequest, GiveBackRequest, Reserved};
use crate::clock::{Timestamp, micros};
use crate::decision::Decision;
use crate::log_limit::LogLimit;
use crate::quota_set::QuotaSet;

use super::{Inner, RedisBackend, unleasable};

/// How many calls of its key (see `DenialCache::claim`) a request waits for
/// before calling Redis itself.
const CALL_WAITS: usize = 4;

impl RedisBackend {
    /// A decision made here, counted: a reservation at the Redis time of
    /// the lease it spent from (a denial spends nothing).
    pub(super) fn hit(&self, hit: Hit) -> Reserved {
        match hit {
            Hit::Lease(d, redis_at) => {
                bump(&self.inner.counters.lease_hits);
                Reserved::new(d, Timestamp::from_micros(redis_at))
            }
            Hit::Denial(d) => {
                bump(&self.inner.counters.cache_hits);
                self.inner.metrics.cache_hit();
                Reserved::new(d, Timestamp::EPOCH)
            }
        }
    }

    /// A decision, as a reservation: what it spent can be given back.
    pub(super) async fn decide(&self, request: CheckRequest<'_>) -> Result<Reserved, BackendError> {
        let inner = &*self.inner;
        let quotas = request.quotas;
        let cache = self.cache_for(quotas);
        let mut ask = Ask {
            cost: request.cost,
            commit: request.commit,
            want: request.cost,
            give_back: None,
        };
        let mut turn = Turn::Alone;
        let mut policy = None;
        if let Some((cache, set)) = cache {
            let (key, cost, commit) = (request.key, request.cost, request.commit);
            policy = inner.lease.as_ref();
            // Elastic sets have no cache id, so the algorithms are all
            // that can keep a set from leasing here.
            policy = policy.filter(|_| commit && unleasable(quotas).is_none());
            // While the key's call is out (a lease call, or the call after
            // its denial ran out), wait for it (a few times, within half the
            // timeout) rather than call Redis too: with many concurrent
            // requests of a hot or flooding key, one call serves them. A
            // request that gives up waiting (its leaders failed or were
            // slow) calls Redis for itself, failure policy included.
            let deadline = tokio::time::Instant::now() + inner.timeout / 2;
            let limit = micros(inner.timeout);
            for round in 0..=CALL_WAITS {
                let now = inner.local_now();
                if let Some(hit) = cache.get(set, key, quotas, cost, commit, now) {
                    return Ok(self.hit(hit));
                }
                if !commit {
                    break;
                }
                (ask, turn) = cache.claim(set, key, quotas, cost, now, policy, limit);
                if turn != Turn::Wait {
                    break;
                }
                // Arm the wake-up, then claim again (a claim that waits
                // changes nothing): a call that ended in between is seen,
                // and requests that need not wait never touch the `Notify`.
                let done = cache.call_done(set, key).notified();
                let mut done = std::pin::pin!(done);
                done.as_mut().enable();
                (ask, turn) = cache.claim(set, key, quotas, cost, now, policy, limit);
                if turn != Turn::Wait {
                    break;
                }
                if round == CALL_WAITS || tokio::time::timeout_at(deadline, done).await.is_err() {
                    turn = Turn::Alone;
                    break;
                }
            }
        }
        // The key's call, if this is it, ends however this ends.
        let _key_call = KeyCall {
            cache: cache.filter(|_| turn == Turn::Lead),
            key: request.key,
        };
        let sent = inner.local_now();

        let permit = inner.breaker.permit();
        if permit == Permit::Refuse {
            let n = bump(&inner.counters.short_circuits);
            tracing::debug!(
                short_circuits = n,
                "tollgate: circuit open, Redis not called"
            );
            return self.fail(request, circuit_open()).await;
        }
        let probe = permit == Permit::Probe;
        let mut guard = ProbeGuard {
            breaker: &inner.breaker,
            armed: probe,
        };
        bump(&inner.counters.calls);
        inner.metrics.call();
        let result = match tokio::time::timeout(inner.timeout, self.call(request, &ask)).await {
            Ok(result) => result,
            Err(_) => {
                bump(&inner.counters.timeouts);
                Err(inner.no_answer())
            }
        };
        guard.armed = false;

        match result {
            Ok(reply) => {
                if inner.breaker.success(probe) == Transition::Closed {
                    inner.metrics.circuit(false);
                    tracing::info!("tollgate: Redis answers again; circuit breaker closed");
                }
                if reply.spent > request.cost {
                    bump(&inner.counters.leases);
                }
                let decision = match cache {
                    Some((cache, set)) => {
                        let now = inner.local_now();
                        let (key, cost) = (request.key, request.cost);
                        let lease = policy.filter(|_| turn == Turn::Lead);
                        cache.settle(set, key, quotas, cost, sent, now, &reply, lease)
                    }
                    None => quotas.decision_from(&reply.verdicts),
                };
                Ok(Reserved::new(decision, Timestamp::from_micros(reply.now)))
            }
            Err(e) => {
                inner.failed(&e, probe);
                self.fail(request, e).await
            }
        }
    }

    /// One round trip (two if the script must be sent again).
    async fn call(&self, request: CheckRequest<'_>, ask: &Ask) -> Result<Reply, BackendError> {
        let inner = &*self.inner;
        let quotas = request.quotas;
        let keys = script::redis_keys(&inner.prefix, request.key, quotas);
        let (now, slack) = inner.script_time();
        let args = script::arguments(quotas, now, ask, slack, request.room);
        let again = match ask.give_back {
            None => Again::Same,
            Some(_) => Again::WithoutGiveBack,
        };
        self.run(quotas, &keys, &args, ask.want.max(ask.cost), again)
            .await
    }

    /// Gives back a reservation: to the fallback store that made it, to
    /// the lease it came from while this process holds it, else to Redis
    /// (one script call, within the timeout).
    pub(super) async fn give_back_reserved(
        &self,
        request: GiveBackRequest<'_>,
    ) -> Result<Decision, BackendError> {
        let inner = &*self.inner;
        let reserved = request.reserved;
        if reserved.fallback {
            if let OnFailure::Fallback(local) = &inner.on_failure {
                return Ok(local.give_back_now(request));
            }
        }
        let (key, quotas, cost) = (request.key, request.quotas, request.cost);
        let at = reserved.at().as_micros();
        if let Some((cache, set)) = self.cache_for(quotas) {
            let now = inner.local_now();
            if let Some(left) = cache.give_back(set, key, quotas, cost, at, now) {
                return Ok(left);
            }
        }
        if inner.breaker.is_open() {
            // Redis failed repeatedly: no waiting for it now. The units
            // stay spent, the strict side.
            return Err(circuit_open());
        }
        let keys = script::redis_keys(&inner.prefix, key, quotas);
        let (now, slack) = inner.script_time();
        let units = [cost, request.requests];
        let args = script::give_back_arguments(quotas, now, reserved.decision(), units, at, slack);
        let give_back = self.run(quotas, &keys, &args, cost, Again::Never);
        match tokio::time::timeout(inner.timeout, give_back).await {
            Ok(reply) => reply.map(|reply| quotas.decision_from(&reply.verdicts)),
            Err(_) => Err(inner.no_answer()),
        }
    }

    /// Charges usage beyond a reservation on Redis, within the timeout
    /// (see [`Backend::charge`]).
    pub(super) async fn charge_usage(
        &self,
        request: CheckRequest<'_>,
    ) -> Result<Decision, BackendError> {
        let inner = &*self.inner;
        let (key, quotas, cost) = (request.key, request.quotas, request.cost);
        if inner.breaker.is_open() {
            return Err(circuit_open());
        }
        let keys = script::redis_keys(&inner.prefix, key, quotas);
        let (now, slack) = inner.script_time();
        let args = script::charge_arguments(quotas, now, cost, slack);
        // Charged twice if the first run happened: the strict side.
        let charge = self.run(quotas, &keys, &args, cost, Again::Same);
        match tokio::time::timeout(inner.timeout, charge).await {
            Ok(reply) => reply.map(|reply| quotas.decision_from(&reply.verdicts)),
            Err(_) => Err(inner.no_answer()),
        }
    }

    /// Runs the script on `keys` with `args`; a reply that says more than
    /// `asked` units were spent is a lie. If the kept connection broke, the
    /// call is sent again on a new one as `again` says.
    ///
    /// Boxed, one allocation beside a network round trip: the pool's and
    /// the redis crate's futures (single, Cluster, Sentinel, TLS) nest so
    /// deep that an app's future holding them inline, through a layer or
    /// an `AnyBackend`, exceeds rustc's default recursion limit when laid
    /// out, and fails to compile. A box ends the nesting here.
    fn run<'a>(
        &'a self,
        quotas: &'a QuotaSet,
        keys: &'a [String],
        args: &'a [String],
        asked: u64,
        again: Again,
    ) -> Pin<Box<dyn Future<Output = Result<Reply, BackendError>> + Send + 'a>> {
        Box::pin(self.run_inline(quotas, keys, args, asked, again))
    }

    async fn run_inline(
        &self,
        quotas: &QuotaSet,
        keys: &[String],
        args: &[String],
        asked: u64,
        again: Again,
    ) -> Result<Reply, BackendError> {
        let inner = &*self.inner;
        let connections = &inner.connections;
        let loads = &inner.counters.script_loads;
        let (mut conn, fresh) = connections.connection().await?;
        let reply = match connections.evaluate(&mut conn, keys, args, loads).await {
            Err((_, true)) if !fresh && again != Again::Never => {
                // The connection kept from earlier checks died (Redis
                // restarted, say): try once more on a new one. If the dead
                // one had run the script before failing, this spends twice,
                // which errs on the strict side; but units given back
                // twice would be admitted twice (see `Again`).
                connections.forget(Some(conn.0));
                let (mut conn, _) = connections.connection().await?;
                let resent;
                let args = match again {
                    Again::WithoutGiveBack => {
                        resent = script::without_give_back(args);
                        &resent[..]
                    }
                    _ => args,
                };
                connections.evaluate(&mut conn, keys, args, loads).await
            }
            reply => reply,
        };
        let reply = reply.map_err(|(e, _)| e)?;
        script::reply(&reply, quotas, asked)
            .map_err(|m| BackendError::new(BackendErrorKind::Protocol, m))
    }

    async fn fail(
        &self,
        request: CheckRequest<'_>,
        error: BackendError,
    ) -> Result<Reserved, BackendError> {
        match &self.inner.on_failure {
            OnFailure::Error => Err(error),
            OnFailure::Fallback(local) => {
                bump(&self.inner.counters.fallbacks);
                let mut reserved = local.reserve_now(request);
                reserved.fallback = true;
                Ok(reserved)
            }
        }
    }
}

/// What a call does when the kept connection broke under it, and the
/// script may or may not have run: sent again, what it spends may be spent
/// twice (the strict side), but what it gives back must not be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Again {
    /// Sent again as it was: it only spends.
    Same,
    /// Sent again without the units of an earlier lease it gives back.
    WithoutGiveBack,
    /// Not sent again (a reservation given back): the units stay spent.
    Never,
}

/// Ends a key's call when dropped: settled, failed or cancelled, the
/// requests waiting for it wake and look again.
struct KeyCall<'a> {
    cache: Option<(&'a DenialCache, u64)>,
    key: &'a str,
}

impl Drop for KeyCall<'_> {
    fn drop(&mut self) {
        if let Some((cache, set)) = self.cache {
            cache.end_call(set, self.key);
        }
    }
}

/// The error of a call the circuit breaker keeps from Redis.
fn circuit_open() -> BackendError {
    BackendError::new(
        BackendErrorKind::Unavailable,
        "Redis failed repeatedly; the circuit breaker is open",
    )
}

impl Inner {
    /// The error of a call Redis did not answer within the timeout. Its
    /// connection may be dead (a peer gone without a reset): the next call
    /// takes a fresh one.
    fn no_answer(&self) -> BackendError {
        self.connections.forget(None);
        super::super::connection::no_answer(self.timeout)
    }

    /// A failed call counted, told to the circuit breaker and logged, at
    /// most so often: an error when Redis refuses the scripts, a warning
    /// otherwise.
    fn failed(&self, e: &BackendError, probe: bool) {
        let failures = bump(&self.counters.failures);
        self.metrics.failure(e.kind());
        let transition = match e.kind() {
            // Redis answered: it is up, whatever it said.
            BackendErrorKind::Protocol => self.breaker.success(probe),
            _ => self.breaker.failure(probe),
        };
        self.metrics.circuit(self.breaker.is_open());
        let consecutive = self.breaker.consecutive_failures();
        static FAILED: LogLimit = LogLimit::new();
        static MISCONFIGURED: LogLimit = LogLimit::new();
        if e.kind() == BackendErrorKind::Misconfigured {
            bump(&self.counters.misconfigured);
            // Not an outage that passes: it lasts until someone
            // fixes Redis, and meanwhile the failure policy decides
            // every request.
            if let Some(more) = MISCONFIGURED.admit() {
                tracing::error!(
                    failures,
                    error = %e,
                    "tollgate: Redis refuses the rate-limit scripts; the failure policy decides requests until this is fixed{more}"
                );
            }
        } else if let Some(more) = FAILED.admit() {
            tracing::warn!(
                kind = ?e.kind(),
                failures,
                consecutive,
                error = e.to_string().as_str(),
                "tollgate: Redis rate-limit call failed{more}"
            );
        }
        match transition {
            Transition::Opened => tracing::warn!(
                consecutive,
                open_for = ?self.breaker.open_for(),
                "tollgate: circuit breaker opened; Redis will not be called until a probe succeeds"
            ),
            Transition::Reopened => tracing::warn!(
                open_for = ?self.breaker.open_for(),
                "tollgate: probe failed; circuit breaker stays open"
            ),
            Transition::Closed | Transition::None => {}
        }
    }
}
