//! Rate limiting for tower and axum services, in one process or across a
//! fleet that shares Redis.
//!
//! An axum app limited to 5 requests per 10 s per client IP, with a route
//! whose requests cost 3 of 6 units a minute:
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::time::Duration;
//! use axum::{Router, routing::{get, post}};
//! use tollgate::key::PeerIp;
//! use tollgate::{Limiter, MemoryBackend, Quota, QuotaSet, RateLimitLayer};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let backend = MemoryBackend::new();
//!     let everywhere = Limiter::new(
//!         backend.clone(),
//!         QuotaSet::new("app", [Quota::gcra(5, Duration::from_secs(10)).name("app").build()?])?,
//!     );
//!     let reports = Limiter::new(
//!         backend,
//!         QuotaSet::new("reports", [Quota::sliding_window(6, Duration::from_secs(60)).name("reports").build()?])?,
//!     );
//!     let app = Router::new()
//!         .route(
//!             "/report",
//!             post(|| async { "report queued\n" })
//!                 .layer(RateLimitLayer::builder(reports, PeerIp::new()).cost(|_| 3).build()),
//!         )
//!         .route("/", get(|| async { "hello\n" }))
//!         .layer(RateLimitLayer::new(everywhere, PeerIp::new()));
//!
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // Record peer addresses, which `PeerIp` reads.
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! ```
//!
//! Admitted responses carry `RateLimit-Policy: "app";q=5;w=10` and
//! `RateLimit: "app";r=4;t=2`; the sixth request within 10 s gets 429 with
//! `Retry-After` and a problem-details body. This is `examples/quickstart.rs`
//! (`cargo run --example quickstart`).
//!
//! # The guide
//!
//! [`guide`] has a chapter per task: [keys](guide::keys) (client IP behind
//! proxies, API keys, users, routes), [headers](guide::headers),
//! [algorithms and quotas](guide::algorithms), [per-route limits and
//! response-aware limits](guide::routes), [memory and Redis](guide::redis),
//! [rules files](guide::rules), [the gateway](guide::gateway),
//! [gRPC](guide::grpc), [protecting the server](guide::protect),
//! [metrics](guide::metrics), [the direct API](guide::direct) and
//! [performance](guide::performance).
//!
//! # The parts
//!
//! The heart of the crate decides "may this key spend this much now?": a
//! [`Quota`] (limit per period, burst, [`Algorithm`], [`Mode`]) or several at
//! once in a [`QuotaSet`], kept in a [`Backend`] ([`MemoryBackend`], or
//! `RedisBackend` with the `redis` feature), asked through a [`Limiter`].
//! Each algorithm is plain arithmetic on the stored state, the cost and the
//! time, with no clock or I/O inside, so the in-memory and Redis backends
//! share one meaning and one test suite. [`RateLimitLayer`] puts a limiter in
//! front of any tower service, with a key extractor from [`key`]; `rules`
//! (feature `rules`) builds layers from a YAML file.
//!
//! | feature | adds |
//! |---|---|
//! | (none) | the algorithms, [`MemoryBackend`], [`Limiter`], the tower layer, metrics through the `metrics` facade |
//! | `redis` | `RedisBackend`, for Redis, Redis Cluster and Sentinel, with TLS (rustls) |
//! | `rules` | `rules::Rules`: limits from a YAML file, reloaded live |
//! | `rls` | `rls::RlsService`: Envoy's rate limit service (gRPC) from envoyproxy/ratelimit's YAML files |
//! | `gateway` | the `tollgate` binary (implies `rules`, `redis` and `rls`) |

#![warn(missing_docs)]

#[cfg(feature = "admin")]
pub mod admin;
mod algorithm;
pub mod backend;
pub mod calendar;
mod clock;
mod decision;
pub mod guide;
pub mod key;
pub mod layer;
mod limiter;
mod log_limit;
mod metrics;
pub mod outbound;
mod quota;
mod quota_set;
#[cfg(feature = "rls")]
pub mod rls;
#[cfg(feature = "rules")]
pub mod rules;
mod state;
mod sync;

// The names a user writes in ordinary use; the rest are in their modules
// (`tollgate::backend`, `tollgate::layer`, `tollgate::key`, `tollgate::rules`).
pub use backend::{Backend, BackendError, MemoryBackend};
#[cfg(feature = "redis")]
pub use backend::{Lease, OnFailure, RedisBackend};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use decision::{Decision, QuotaDecision};
pub use layer::{
    ConcurrencyQuota, CountStatus, HeaderStyle, OnBackendError, OnDelay, OnMissingKey,
    PartitionKey, Priority, RateLimitLayer, Shedding,
};
pub use limiter::{Error, Limiter, Reservation, Settle, WithRoom};
pub use quota::{Algorithm, Counts, Mode, Quota, QuotaBuilder, QuotaError};
pub use quota_set::{QuotaSet, QuotaSetError};
pub use state::{QuotaState, StateError};

/// The README's examples, compiled and run as doctests (they use every
/// feature, as CI's `--all-features` run does).
#[cfg(all(doctest, feature = "redis", feature = "rules"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
