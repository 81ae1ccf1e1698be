//! The direct API: wait for a key's turn.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hashbrown::HashMap;
use tokio::time::Instant;

use super::adapt::Adapt;
use super::provider::Signal;
use super::schedule::{self, Plan, Told, Turn};
use super::store::PaceStore;
use crate::backend::BackendError;
use crate::quota::Quota;
use crate::sync::lock;

/// Why no turn was given.
#[derive(Debug)]
#[non_exhaustive]
pub enum WaitError {
    /// The turn would come after more than the longest wait accepted;
    /// nothing was reserved, and the caller heard at once.
    TooLong {
        /// How long the wait would have been.
        would_wait: Duration,
    },
    /// The store failed: no turn could be scheduled, so none is given.
    Store(BackendError),
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::TooLong { would_wait } => write!(
                f,
                "the turn would come in {would_wait:?}, after the longest wait accepted"
            ),
            WaitError::Store(e) => write!(f, "the pacing store failed: {e}"),
        }
    }
}

impl std::error::Error for WaitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WaitError::Store(e) => Some(e),
            WaitError::TooLong { .. } => None,
        }
    }
}

/// A turn, taken: the request may go now.
#[derive(Debug, Clone, Copy)]
pub struct Turned {
    /// When it was scheduled, on the store's clock (microseconds).
    scheduled_at: u64,
    waited: Duration,
}

impl Turned {
    /// How long the caller slept for its turn.
    pub fn waited(&self) -> Duration {
        self.waited
    }
}

/// Pauses a process learnt of, by key: a waiter that wakes inside one
/// learnt after it was scheduled takes a new turn instead of going.
type Pauses = HashMap<Box<str>, (Instant, Instant), foldhash::fast::RandomState>;

/// Pauses kept at most, before the ended ones are dropped.
const PAUSES_SWEEP_AT: usize = 1024;

/// Turns taken again at most when pauses keep arriving while waiting.
const RETURNS: usize = 4;

/// Waits for each key's turn at a quota's rate: the slot is reserved in
/// the store at once and the caller sleeps until it (one timer, no
/// polling), so callers are served in the order they asked. Cheap to
/// clone; clones share the store and the pauses learnt.
///
/// ```
/// use std::time::Duration;
/// use tollgate::Quota;
/// use tollgate::outbound::{MemoryPace, Pacer, WaitError};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pacer = Pacer::new(MemoryPace::new(), &Quota::gcra(10, Duration::from_secs(1)).burst(1).build()?)
///     .max_wait(Duration::from_millis(250));
/// pacer.acquire("api.example.com", 1).await?; // at once
/// let second = pacer.acquire("api.example.com", 1).await?; // 100 ms later
/// assert_eq!(second.waited(), Duration::from_millis(100));
/// pacer.acquire("api.example.com", 1).await?; // 100 ms more
/// // The next turn is 300 ms away: refused at once.
/// let refused = pacer.acquire("api.example.com", 1).await;
/// assert!(matches!(refused, Err(WaitError::TooLong { .. })));
/// # Ok(())
/// # }
/// ```
pub struct Pacer<S> {
    store: S,
    plan: Arc<Plan>,
    max_wait: Duration,
    adapt: Option<Adapt>,
    pauses: Arc<Mutex<Pauses>>,
}

impl<S: Clone> Clone for Pacer<S> {
    fn clone(&self) -> Self {
        Pacer {
            store: self.store.clone(),
            plan: Arc::clone(&self.plan),
            max_wait: self.max_wait,
            adapt: self.adapt.clone(),
            pauses: Arc::clone(&self.pauses),
        }
    }
}

impl<S> fmt::Debug for Pacer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pacer")
            .field("interval_us", &self.plan.interval)
            .field("burst", &self.plan.burst)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

/// Gives a reserved slot back if the caller stops waiting for it.
struct Pending<S: PaceStore> {
    store: S,
    plan: Arc<Plan>,
    key: Box<str>,
    cost: u64,
    interval: u64,
    slot: u64,
    armed: bool,
}

impl<S: PaceStore> Drop for Pending<S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Without a runtime the slot stays spent: a dropped waiter is
        // counted, never more than it asked for.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, plan) = (self.store.clone(), Arc::clone(&self.plan));
        let key = std::mem::take(&mut self.key);
        let (cost, interval, slot) = (self.cost, self.interval, self.slot);
        runtime.spawn(async move {
            if let Err(error) = store.give_back(&key, &plan, cost, interval, slot).await {
                tracing::warn!(
                    error = error.to_string().as_str(),
                    "could not give back a turn no longer awaited"
                );
            }
        });
    }
}

impl<S> Pacer<S> {
    /// The adaptation, if any.
    pub(crate) fn adaptation(&self) -> Option<&Adapt> {
        self.adapt.as_ref()
    }
}

impl<S: PaceStore> Pacer<S> {
    /// Turns at `quota`'s rate, kept in `store`. GCRA and the token bucket
    /// keep their burst; the leaky bucket, the windows and the sliding log
    /// are paced with a burst of 1 (at most `limit` in any period, which is
    /// stricter than a window: safe for a limit someone else enforces).
    pub fn new(store: S, quota: &Quota) -> Self {
        Pacer {
            store,
            plan: Arc::new(Plan::of(quota)),
            max_wait: Duration::from_secs(30),
            adapt: None,
            pauses: Arc::default(),
        }
    }

    /// The longest a caller waits (30 s by default): a turn further away
    /// is refused at once with [`WaitError::TooLong`].
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// Adapts the rate to what the provider says (see [`Adapt`]).
    pub fn adapt(mut self, adapt: Adapt) -> Self {
        let mut plan = (*self.plan).clone();
        adapt.apply(&mut plan);
        self.plan = Arc::new(plan);
        self.adapt = Some(adapt);
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Waits for `key`'s turn to spend `cost` units, up to the pacer's
    /// longest wait.
    pub async fn acquire(&self, key: &str, cost: u64) -> Result<Turned, WaitError> {
        self.acquire_within(key, cost, self.max_wait).await
    }

    /// Waits for `key`'s turn to spend `cost` units, up to `max_wait`. The
    /// slot is reserved at once; if the future is dropped before it comes,
    /// the slot is given back. A turn further than `max_wait` is refused at
    /// once, with the time it would have taken.
    pub async fn acquire_within(
        &self,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Turned, WaitError> {
        let started = Instant::now();
        let mut left = max_wait;
        for _ in 0..RETURNS {
            let asked = Instant::now();
            let scheduled = self
                .store
                .acquire(key, &self.plan, cost, schedule::micros(left))
                .await
                .map_err(WaitError::Store)?;
            let (delay, interval) = match scheduled.turn {
                Turn::Go { delay, interval } => (delay, interval),
                Turn::TooLong { would_wait } => {
                    return Err(WaitError::TooLong {
                        would_wait: Duration::from_micros(would_wait),
                    });
                }
            };
            let mut pending = Pending {
                store: self.store.clone(),
                plan: Arc::clone(&self.plan),
                key: key.into(),
                cost,
                interval,
                slot: scheduled.now.saturating_add(delay),
                armed: delay > 0,
            };
            if delay > 0 {
                tokio::time::sleep(Duration::from_micros(delay)).await;
            }
            pending.armed = false;
            if !self.paused_since(key, asked) {
                return Ok(Turned {
                    scheduled_at: scheduled.now,
                    waited: started.elapsed(),
                });
            }
            // A pause arrived while this caller slept: its slot went by
            // inside it, and the store has moved the schedule past the
            // pause. Take a turn there, within what is left of the wait.
            left = max_wait.saturating_sub(started.elapsed());
        }
        Err(WaitError::TooLong {
            would_wait: self.max_wait.max(max_wait),
        })
    }

    /// Whether a pause of `key` learnt after `since` lasts until now.
    fn paused_since(&self, key: &str, since: Instant) -> bool {
        let pauses = lock(&self.pauses);
        match pauses.get(key) {
            Some(&(learnt, until)) => learnt >= since && until > Instant::now(),
            None => false,
        }
    }

    /// Tells the store what the provider answered to a request sent on
    /// `turn` for `key`: a pause (fleet-wide on a shared store), a cut of
    /// the rate on a refusal (once for all requests scheduled before it),
    /// an announced rate, as the pacer's [`Adapt`] allows. A signal with
    /// nothing to act on costs nothing.
    pub async fn obey(&self, key: &str, turn: &Turned, signal: &Signal) -> Result<(), BackendError> {
        let pause = signal.pause();
        let cut = signal.refused() && self.adapt.is_some();
        let announced = match (&self.adapt, signal.announced()) {
            (Some(a), Some(interval)) if a.follows_announcements() => interval,
            _ => 0,
        };
        if pause.is_none() && !cut && announced == 0 {
            return Ok(());
        }
        if let Some(pause) = pause {
            let now = Instant::now();
            let mut pauses = lock(&self.pauses);
            if pauses.len() >= PAUSES_SWEEP_AT {
                pauses.retain(|_, (_, until)| *until > now);
            }
            if pauses.len() < PAUSES_SWEEP_AT * 4 {
                pauses.insert(key.into(), (now, now + pause));
            }
        }
        let told = Told {
            pause_until: pause.map_or(0, |p| schedule::micros(p).max(1)),
            cut,
            scheduled_at: turn.scheduled_at,
            announced,
        };
        self.store.obey(key, &self.plan, told).await
    }
}
