//! Batches: a hot key's units taken from a backend a batch at a time and
//! spent by one stripe of threads, so that a key checked by every core does
//! not make every check a write to one shared cache line.
//!
//! A batch is spent in the inner backend when taken (one check of the
//! batch's cost), so the stripes together never admit more than the inner
//! backend admitted. What batching costs is the other way round, as with
//! Redis leases (`Lease`): units parked in a stripe are refused to the other
//! stripes until they are spent, given back, or lapse.

use std::fmt;
use std::future::Future;
use std::num::NonZeroUsize;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::{Backend, BackendError, CheckRequest, GiveBackRequest, Now, Reserved};
use crate::sync::{lock, thread_index};
use crate::{Algorithm, Decision, Mode, QuotaSet};

mod builder;
mod stripe;

pub use builder::BatchBackendBuilder;
use stripe::{Batch, Borrowed, Leftover, Owned, Stripe, sweep};

/// Growth of a stripe's batch from one to the next, at most: a key becomes
/// hot over a few batches, and a key checked now and then never parks more
/// than its request.
const GROWTH: u64 = 4;

/// A batch holds at most this fraction (1 / `CAPACITY_SHARE`) of the
/// smallest capacity in its set, as a Redis lease does, so that a small
/// quota is not parked whole in one stripe.
const CAPACITY_SHARE: u64 = 8;

/// A [`Backend`] over any backend that lets a hot key scale with cores:
/// each stripe of threads takes a batch of units from the inner backend
/// with one check of the batch's cost, then admits from it without
/// touching the shared state until the batch is spent.
///
/// Opt-in, for keys that many cores check at once (a global key, a NAT's
/// address): on one core, or on keys spread over many clients, the inner
/// backend alone is as fast.
///
/// **Bound.** Batches are spent in the inner backend when taken, so the
/// batched backend never admits more than the inner backend did. Over any
/// interval it admits at most what the inner backend would have admitted
/// over it plus the units parked at its start: at most
/// `stripes x (batch - 1)` per key, a batch being at most
/// [`max_batch`](BatchBackendBuilder::max_batch) units and an eighth of the
/// smallest capacity in the set. Units are spendable for
/// [`lifetime`](BatchBackendBuilder::lifetime) after they were taken (a
/// fixed window's units spill at most that far into the next window). The
/// other way round, up to `stripes x (batch - 1)` units per key may be
/// parked in stripes that do not use them: refused to the others until
/// they lapse, when they are given back through
/// [`Backend::give_back`] (or [`flush`](BatchBackend::flush)).
///
/// Batched: GCRA, the token bucket, the fixed window and the sliding window
/// counter, in [`Mode::Enforce`]. The sliding log and the leaky bucket need
/// to see every arrival, and other modes report per request: sets holding
/// one, peeks and costs of 0 go to the inner backend one by one.
///
/// A stripe's batch grows fourfold each time it is spent within its
/// lifetime, from the request's cost, so a key checked now and then takes
/// no more than it asks for. A request admitted from a batch reports the
/// inner backend's decision on the batch (its `remaining` leaves out the
/// units parked in stripes).
///
/// ```
/// use std::time::Duration;
/// use tollgate::backend::BatchBackend;
/// use tollgate::{Limiter, MemoryBackend, Quota};
///
/// let backend = BatchBackend::builder(MemoryBackend::new())
///     .max_batch(64)
///     .lifetime(Duration::from_millis(10))
///     .build();
/// let limiter = Limiter::new(backend, Quota::gcra(1_000_000, Duration::from_secs(1)).build()?);
/// assert!(limiter.check_now("global", 1).unwrap()?.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct BatchBackend<B> {
    inner: B,
    stripes: Box<[Stripe]>,
    max_batch: u64,
    lifetime: u64,
    max_keys: usize,
}

/// Polls `future` once: the inner backend's answer on the synchronous
/// path, where it decides now and so answers its futures at once.
fn poll_once<F: Future>(future: F) -> Option<F::Output> {
    let future = std::pin::pin!(future);
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}

impl<B: Backend> BatchBackend<B> {
    /// Batches over `inner` with the defaults: a stripe per core, batches
    /// of at most 64 units, spendable for 10 ms.
    pub fn new(inner: B) -> Self {
        Self::builder(inner).build()
    }

    /// A builder over `inner`.
    pub fn builder(inner: B) -> BatchBackendBuilder<B> {
        BatchBackendBuilder {
            inner,
            stripes: std::thread::available_parallelism().map_or(1, NonZeroUsize::get),
            max_batch: 64,
            lifetime: Duration::from_millis(10),
            max_keys: 1024,
        }
    }

    /// The backend batches are taken from.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Gives every parked unit back to the inner backend (lapsed or not),
    /// so that the other stripes, or the inner backend's other users, can
    /// spend them. Returns how many units went back; units the inner
    /// backend cannot take back (a backend without
    /// [`Backend::give_back`], a window rolled over since) stay spent.
    pub async fn flush(&self, quotas: &QuotaSet) -> u64 {
        let mut given = 0;
        for stripe in &self.stripes[..] {
            let drained: Vec<Leftover> = {
                let mut held = lock(&stripe.held);
                let ids = quotas.state_ids();
                held.extract_if(|o, _| *o.ids == *ids)
                    .map(|(o, h)| Leftover {
                        key: o.key,
                        units: h.units,
                        reserved: h.reserved,
                    })
                    .filter(|leftover| leftover.units > 0)
                    .collect()
            };
            for leftover in drained {
                if self.give_back_leftover(quotas, &leftover).await {
                    given += leftover.units;
                }
            }
        }
        given
    }

    /// The most units one batch of `quotas` holds, or `None` when the set
    /// is not batched.
    fn most(&self, quotas: &QuotaSet) -> Option<u64> {
        // A quota counting requests spends other units than its set's
        // cost: a batch of units means nothing to it.
        if quotas.counts_requests() {
            return None;
        }
        let mut smallest = u64::MAX;
        for quota in quotas.quotas() {
            let batched = matches!(
                quota.algorithm(),
                Algorithm::Gcra
                    | Algorithm::TokenBucket
                    | Algorithm::FixedWindow
                    | Algorithm::SlidingWindow
            );
            if !batched || quota.mode() != Mode::Enforce {
                return None;
            }
            smallest = smallest.min(quota.max_cost());
        }
        Some(self.max_batch.min(smallest / CAPACITY_SHARE).max(1))
    }

    fn stripe(&self) -> &Stripe {
        &self.stripes[thread_index() % self.stripes.len()]
    }

    /// Spends from this thread's batch for the request's key, if it holds
    /// enough. Otherwise takes the key's spent or lapsed batch out, and
    /// says how many units to ask the inner backend for.
    fn spend_local(
        &self,
        request: &CheckRequest<'_>,
        most: u64,
        now: u64,
    ) -> Result<Decision, (u64, Option<Leftover>)> {
        let cost = request.cost;
        let wanted = Borrowed {
            ids: request.quotas.state_ids(),
            key: request.key,
        };
        let mut held = lock(&self.stripe().held);
        let Some(batch) = held.get_mut(&wanted) else {
            return Err((cost, None));
        };
        if let Some(decision) = batch.spend(cost, now) {
            return Ok(decision);
        }
        // Spent within its lifetime: the key is hot here, ask for more.
        let want = if now < batch.expires {
            batch.size.saturating_mul(GROWTH).min(most).max(cost)
        } else {
            cost
        };
        // The entry stays, emptied: taking the next batch writes it again
        // in place, with no allocation.
        let leftover = (batch.units > 0).then(|| Leftover {
            key: request.key.into(),
            units: batch.units,
            reserved: batch.reserved.clone(),
        });
        batch.units = 0;
        Err((want, leftover))
    }

    /// Keeps a new batch for the key, unless the stripe holds as many keys
    /// as it may: then the lapsed batches go first, and when that frees
    /// too little, every batch (whose units are returned for giving back),
    /// so that a flood of keys costs one sweep per `max_keys / 4` keys.
    fn keep(&self, request: &CheckRequest<'_>, held: Batch, now: u64) -> Vec<Leftover> {
        let mut out = Vec::new();
        let mut map = lock(&self.stripe().held);
        let wanted = Borrowed {
            ids: request.quotas.state_ids(),
            key: request.key,
        };
        if let Some(batch) = map.get_mut(&wanted) {
            // Two threads of one stripe can both find the batch spent and
            // both take one: the batch kept first still holds units, which
            // go back rather than vanish (admitting less than the limit).
            if batch.units > 0 {
                out.push(Leftover {
                    key: request.key.into(),
                    units: batch.units,
                    reserved: batch.reserved.clone(),
                });
            }
            *batch = held;
            return out;
        }
        if map.len() >= self.max_keys {
            sweep(&mut map, &mut out, Some(now));
            if map.len() > self.max_keys - self.max_keys / 4 {
                sweep(&mut map, &mut out, None);
            }
        }
        let owned = Owned {
            ids: request.quotas.state_ids().into(),
            key: request.key.into(),
        };
        map.insert(owned, held);
        out
    }

    async fn give_back_leftover(&self, quotas: &QuotaSet, leftover: &Leftover) -> bool {
        let request = GiveBackRequest {
            key: &leftover.key,
            quotas,
            cost: leftover.units,
            // A batch is never taken for a set counting requests.
            requests: 0,
            reserved: &leftover.reserved,
        };
        self.inner.give_back(request).await.is_ok()
    }

    /// A request that missed this thread's batch: takes `want` units from
    /// the inner backend (the request's cost alone when a batch is refused,
    /// so that a key near its limit is decided as without batches), and
    /// gives back the lapsed batch's units.
    async fn take(
        &self,
        request: CheckRequest<'_>,
        want: u64,
        lapsed: Option<Leftover>,
        now: u64,
    ) -> Result<Decision, BackendError> {
        let cost = request.cost;
        let mut reserved = self
            .inner
            .reserve(CheckRequest {
                cost: want,
                ..request
            })
            .await?;
        let mut size = want;
        if !reserved.decision().allowed() && want > cost {
            reserved = self.inner.reserve(request).await?;
            size = cost;
        }
        let decision = reserved.decision().clone();
        let batch = Batch {
            units: if decision.allowed() { size - cost } else { 0 },
            size,
            expires: now.saturating_add(self.lifetime),
            reserved,
        };
        let mut leftovers = self.keep(&request, batch, now);
        leftovers.extend(lapsed);
        for leftover in &leftovers {
            self.give_back_leftover(request.quotas, leftover).await;
        }
        Ok(decision)
    }
}

impl<B: fmt::Debug> fmt::Debug for BatchBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchBackend")
            .field("inner", &self.inner)
            .field("stripes", &self.stripes.len())
            .field("max_batch", &self.max_batch)
            .field("lifetime_us", &self.lifetime)
            .finish()
    }
}

impl<B: Backend> Backend for BatchBackend<B> {
    async fn check<'a>(&'a self, request: CheckRequest<'a>) -> Result<Decision, BackendError> {
        let most = match self.most(request.quotas) {
            Some(most) if request.commit && request.cost > 0 => most,
            _ => return self.inner.check(request).await,
        };
        let now = request.started.started_at().as_micros();
        match self.spend_local(&request, most, now) {
            Ok(decision) => Ok(decision),
            Err((want, lapsed)) => self.take(request, want, lapsed, now).await,
        }
    }

    /// The inner backend's [`Now::Never`] is passed on as it is: a batch
    /// over a store that never decides now is not asked either, the first
    /// request being awaited like every other.
    fn check_now(&self, request: CheckRequest<'_>) -> Now {
        let most = match self.most(request.quotas) {
            Some(most) if request.commit && request.cost > 0 => most,
            _ => return self.inner.check_now(request),
        };
        let now = request.started.started_at().as_micros();
        match self.spend_local(&request, most, now) {
            Ok(decision) => Now::Decided(Ok(decision)),
            // An inner backend that decides now answers its futures at once
            // (the memory backend's are ready); one that does not is asked
            // to check now, without a batch.
            Err((want, lapsed)) => match poll_once(self.take(request, want, lapsed, now)) {
                Some(outcome) => Now::Decided(outcome),
                None => self.inner.check_now(request),
            },
        }
    }

    /// Reservations go to the inner backend one by one: a batch's units are
    /// not given back one request at a time.
    fn reserve<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Reserved, BackendError>> + Send + 'a {
        self.inner.reserve(request)
    }

    fn give_back<'a>(
        &'a self,
        request: GiveBackRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        self.inner.give_back(request)
    }

    // Usage beyond a reservation goes to the store, past any batch: it was
    // spent already, whatever a batch holds.
    fn charge<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        self.inner.charge(request)
    }

    /// Resets the key in the inner backend, then drops every stripe's
    /// batch of it that holds units of a quota reset (a set's batch when
    /// one of its quotas alone is reset), unspent and not given back:
    /// afterwards the key is fresh here too, with nothing parked from
    /// before. In that order, a batch taken between the two is dropped
    /// (admitting less, never more).
    async fn reset<'a>(&'a self, key: &'a str, quotas: &'a QuotaSet) -> Result<(), BackendError> {
        self.inner.reset(key, quotas).await?;
        let ids = quotas.state_ids();
        for stripe in &self.stripes[..] {
            lock(&stripe.held)
                .retain(|o, _| *o.key != *key || !o.ids.iter().any(|id| ids.contains(id)));
        }
        Ok(())
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
