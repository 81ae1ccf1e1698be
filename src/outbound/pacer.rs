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
use crate::backend::{BackendError, BackendErrorKind};
use crate::quota::Quota;
use crate::sync::lock;

mod outcome;

pub use outcome::{Turned, WaitError};

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
/// // The next turn is 100 ms away: with at most 50 ms to wait, refused at
/// // once, with the time it would have taken.
/// let refused = pacer.acquire_within("api.example.com", 1, Duration::from_millis(50)).await;
/// assert!(matches!(
///     refused,
///     Err(WaitError::TooLong { would_wait }) if would_wait == Duration::from_millis(100)
/// ));
/// # Ok(())
/// # }
/// ```
pub struct Pacer<S> {
    store: S,
    plan: Arc<Plan>,
    max_wait: Duration,
    late_after: Duration,
    adapt: Option<Adapt>,
    pauses: Arc<Mutex<Pauses>>,
    clock: Arc<ClockMap>,
}

/// How the store's clock maps onto this process's: the smallest difference
/// seen between a reply's arrival here and the store's time in it, which
/// is the clocks' offset plus the quickest reply. A slot is slept until at
/// that offset, so that a reply slowed down (a busy Redis, a busy process)
/// does not send its request late by as much: what the provider sees is
/// spread by the quickest reply's time, not the slowest's. The smallest is
/// taken afresh every `CLOCK_MAP_EPOCH`, so that the clocks' drift and a
/// changed route are followed.
struct ClockMap {
    zero: Instant,
    /// (smallest offset, when it was first taken), microseconds.
    least: Mutex<Option<(i64, Instant)>>,
}

/// How long a smallest offset is kept before it is taken afresh.
const CLOCK_MAP_EPOCH: Duration = Duration::from_secs(10);

impl ClockMap {
    fn new() -> Self {
        ClockMap {
            zero: Instant::now(),
            least: Mutex::new(None),
        }
    }

    /// How long to sleep for a slot `delay` after the store's `now`, the
    /// reply having arrived at `received`: the delay less how much later
    /// than the quickest this reply came; and how far behind its slot the
    /// caller is already, when that is more than the delay.
    fn sleep_for(&self, now: u64, delay: u64, received: Instant) -> (u64, u64) {
        let here = i64::try_from(schedule::micros(received - self.zero)).unwrap_or(i64::MAX);
        let offset = here.saturating_sub(i64::try_from(now).unwrap_or(i64::MAX));
        let mut least = lock(&self.least);
        let smallest = match *least {
            Some((o, since)) if received - since < CLOCK_MAP_EPOCH => {
                let smallest = o.min(offset);
                *least = Some((smallest, since));
                smallest
            }
            _ => {
                *least = Some((offset, received));
                offset
            }
        };
        let late = u64::try_from(offset.saturating_sub(smallest)).unwrap_or(0);
        (delay.saturating_sub(late), late.saturating_sub(delay))
    }
}

impl<S: Clone> Clone for Pacer<S> {
    fn clone(&self) -> Self {
        Pacer {
            store: self.store.clone(),
            plan: Arc::clone(&self.plan),
            max_wait: self.max_wait,
            late_after: self.late_after,
            adapt: self.adapt.clone(),
            pauses: Arc::clone(&self.pauses),
            clock: Arc::clone(&self.clock),
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
            late_after: Duration::from_millis(20),
            adapt: None,
            pauses: Arc::default(),
            clock: Arc::new(ClockMap::new()),
        }
    }

    /// The longest a caller waits (30 s by default): a turn further away
    /// is refused at once with [`WaitError::TooLong`].
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// How late after its slot a caller may wake and still go (20 ms by
    /// default). A caller woken later (its process busy, the store's reply
    /// slow) takes a new turn instead: sent so late, its request would
    /// reach the provider among the next slots' and exceed the rate there.
    /// The missed slot stays unused. `Duration::MAX` sends however late.
    pub fn late_after(mut self, late_after: Duration) -> Self {
        self.late_after = late_after;
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
        for attempt in 1..=RETURNS {
            let asked = Instant::now();
            let scheduled = self
                .store
                .acquire(key, &self.plan, cost, schedule::micros(left))
                .await
                .map_err(WaitError::Store)?;
            if scheduled.paused > 0 {
                // Told by the store: a pause another process learnt of
                // reaches this one's sleepers too.
                self.learn_pause(key, Duration::from_micros(scheduled.paused));
            }
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
            // A store answering a wait beyond the one asked is not obeyed:
            // its answer cannot be trusted, and such a sleep may not even
            // be representable.
            if delay > schedule::micros(left) {
                return Err(WaitError::Store(BackendError::new(
                    BackendErrorKind::Protocol,
                    "the pacing store gave a turn beyond the longest wait asked",
                )));
            }
            let received = Instant::now();
            let (sleep, behind) = self.clock.sleep_for(scheduled.now, delay, received);
            let Some(wake) = received.checked_add(Duration::from_micros(sleep)) else {
                return Err(WaitError::TooLong {
                    would_wait: Duration::from_micros(delay),
                });
            };
            if sleep > 0 {
                tokio::time::sleep_until(wake).await;
            }
            pending.armed = false;
            let late = Duration::from_micros(behind) + wake.elapsed();
            let paused = self.paused_since(key, asked);
            if !paused && (late <= self.late_after || attempt == RETURNS) {
                return Ok(Turned {
                    scheduled_at: scheduled.now,
                    waited: started.elapsed(),
                });
            }
            // A pause arrived while this caller slept: its slot went by
            // inside it, and the store has moved the schedule past the
            // pause. Or the caller woke well after its slot (a slow reply,
            // a busy process): sent now, it would crowd the next slots'
            // requests. Either way, take a new turn, within what is left
            // of the wait.
            left = max_wait.saturating_sub(started.elapsed());
        }
        Err(WaitError::TooLong {
            would_wait: self.max_wait.max(max_wait),
        })
    }

    /// Records that `key` is paused for `pause` from now, unless a pause
    /// known already ends as late.
    fn learn_pause(&self, key: &str, pause: Duration) {
        let now = Instant::now();
        let until = now + pause;
        let mut pauses = lock(&self.pauses);
        if pauses.get(key).is_some_and(|&(_, known)| known >= until) {
            return;
        }
        if pauses.len() >= PAUSES_SWEEP_AT {
            pauses.retain(|_, (_, until)| *until > now);
        }
        if pauses.len() < PAUSES_SWEEP_AT * 4 {
            pauses.insert(key.into(), (now, until));
        }
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
    pub async fn obey(
        &self,
        key: &str,
        turn: &Turned,
        signal: &Signal,
    ) -> Result<(), BackendError> {
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
            self.learn_pause(key, pause);
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
