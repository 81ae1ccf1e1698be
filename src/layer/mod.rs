//! The tower layer: `.layer(RateLimitLayer::new(limiter, key))`.
//!
//! A [`RateLimitLayer`] wraps a service in [`RateLimit`]; for each request a
//! [`Policy`] (one limiter and key, [`LimitPolicy`], or a rules file) reaches
//! a [`Verdict`]: pass the request on with rate-limit headers, maybe after a
//! leaky-bucket delay, or answer it (429 with `Retry-After` and a problem
//! body, 400 for a missing key, 503 when the limiter is down and the policy
//! says so). A gRPC call (`content-type: application/grpc...`) gets those
//! answers as gRPC statuses instead: HTTP 200 with `grpc-status` 8
//! (RESOURCE_EXHAUSTED), 3, 13 or 14 (UNAVAILABLE), the rate-limit fields
//! and `Retry-After` kept as metadata. The response future is the inner service's, a ready response,
//! or a decision under way; the body is the inner service's or the layer's
//! own, without constraining the inner body type.
//!
//! Beside rate quotas, a layer can protect the server itself: a
//! [`ConcurrencyQuota`] (requests of one key at once, elastic while there is
//! room), a [`LoadSignal`] ([`MeasuredLoad`] or the user's own), and
//! [`Shedding`] (503 under overload, lowest [`Priority`] first).
//!
//! Files, each one job, in the order they depend on each other: `headers`,
//! `partition_key`, `problem` and `grpc` (what clients are told), `load`,
//! `shed` and `concurrency` (protecting the server), `held` (what a passed
//! request carries to its response: a reservation to settle, slots),
//! `count_status`, `verdict`, `respond` (decision to verdict), `protect` (shedding and
//! slots around a decision), `policy` (request to decision), `body`,
//! `future`, `service`, `layer` (the layer and its builder).

mod body;
mod concurrency;
mod count_status;
mod future;
mod grpc;
mod headers;
mod held;
#[allow(clippy::module_inception)]
mod layer;
mod load;
mod partition_key;
mod policy;
mod problem;
mod protect;
mod respond;
mod service;
mod shed;
mod verdict;

pub use body::ResponseBody;
pub use concurrency::ConcurrencyQuota;
pub use count_status::{CountStatus, CountStatusError};
pub use future::ResponseFuture;
pub use headers::HeaderStyle;
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use load::{LoadSignal, MeasuredLoad};
pub use partition_key::PartitionKey;
pub use policy::{LimitPolicy, OnMissingKey, Policy};
pub use problem::{QUOTA_EXCEEDED, problem_response};
pub use respond::{OnBackendError, OnDelay, Refused, Rejection};
pub use service::RateLimit;
pub use shed::{Priority, Shedding, SheddingError, TEMPORARY_REDUCED_CAPACITY};
pub use verdict::Verdict;

#[cfg(feature = "rules")]
pub(crate) use headers::Headers;
#[cfg(feature = "rules")]
pub(crate) use held::Settlement;
#[cfg(feature = "rules")]
pub(crate) use policy::{
    DEFAULT_MAX_KEY_LEN, KeyOutcome, Limit, Sealed, admit_key, check_within, reserve_within,
};
#[cfg(feature = "rules")]
pub(crate) use problem::problem;
#[cfg(feature = "rules")]
pub(crate) use protect::{Admission, Protection};
#[cfg(feature = "rules")]
pub(crate) use respond::ResponsePolicy;
