//! Limits on what we send: wait for a turn, fleet-wide, and obey the
//! provider.
//!
//! The other side of rate limiting: a worker pool calling an API with a
//! contract of 100 requests a second, a crawler per host, a fleet of job
//! runners sharing one quota. Each request *waits its turn* rather than
//! fails.
//!
//! - [`Pacer`]: the direct API. [`acquire`](Pacer::acquire) reserves the
//!   key's next slot at once (one call to the store, atomically) and sleeps
//!   until it: callers are served in the order they asked, a turn further
//!   than the longest wait is refused at once, and a caller that stops
//!   waiting gives its slot back.
//! - [`MemoryPace`] keeps the schedules in this process; [`RedisPace`] (the
//!   `redis` feature) in Redis, on Redis's clock, so that a fleet queues on
//!   one schedule.
//! - [`OutboundLayer`]: a tower layer for clients (hyper, tonic), keyed by
//!   [`DestinationHost`], a [`RequestHeader`], [`OneKey`] or a closure,
//!   with a limit on requests in flight; it reads the provider's answers
//!   ([`Signal`]) and pauses the key, fleet-wide on Redis.
//! - [`Adapt`]: cut the rate on refusals (AIMD) and follow announced rates,
//!   within bounds.
//!
//! The schedule is a GCRA whose tolerance is stretched by the wait a
//! caller accepts, for every algorithm (see [`Pacer::new`]). The guide's
//! chapter [`outbound`](crate::guide::outbound) shows the pool pattern, a
//! tonic client, and what happens when the provider's limit shrinks.

mod adapt;
mod keys;
mod layer;
mod pacer;
mod provider;
#[cfg(feature = "redis")]
mod redis;
mod schedule;
mod store;

pub use adapt::Adapt;
pub use keys::{ClientKey, DestinationHost, MAX_KEY_LEN, OneKey, RequestHeader};
pub use layer::{Outbound, OutboundError, OutboundLayer};
pub use pacer::{Pacer, Turned, WaitError};
pub use provider::{MAX_PAUSE, Signal};
#[cfg(feature = "redis")]
pub use redis::RedisPace;
pub use store::{MemoryPace, PaceStore, Scheduled};
