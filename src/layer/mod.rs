//! The tower layer: `.layer(RateLimitLayer::new(limiter, key))`.
//!
//! [`RateLimitLayer::new`] limits a service with one [`Limiter`](crate::Limiter)
//! and a key extractor; [`RateLimitLayer::builder`] sets the rest: the
//! [`HeaderStyle`], a cost per request, what to do when the key is missing
//! ([`OnMissingKey`]) or the limiter cannot decide ([`OnBackendError`]),
//! [`count_status`](RateLimitLayerBuilder::count_status) for limits that count
//! only some responses, and the server's own protection. The guide explains
//! each: [keys](crate::guide::keys), [headers](crate::guide::headers),
//! [per-route limits](crate::guide::routes),
//! [protecting the server](crate::guide::protect), [gRPC](crate::guide::grpc).
//!
//! For each request a [`Policy`] (one limiter and key, [`LimitPolicy`], or a
//! rules file) reaches a [`Verdict`]: pass the request on with rate-limit
//! headers, maybe after a leaky-bucket delay, or answer it (429 with
//! `Retry-After` and a problem body, 400 for a missing key, 503 when the
//! limiter is down and the policy says so). A gRPC call
//! (`content-type: application/grpc...`) gets those answers as gRPC statuses
//! instead. Beside rate quotas, a layer can protect the server itself: a
//! [`ConcurrencyQuota`] (requests of one key at once, elastic while there is
//! room), a [`LoadSignal`] ([`MeasuredLoad`] or the user's own), and
//! [`Shedding`] (503 under overload, lowest [`Priority`] first).

// Files, each one job, in the order they depend on each other: `headers`,
// `partition_key`, `reason`, `problem` and `grpc` (what clients are told),
// `count_status`, `verdict`, `respond` (decision to verdict), `pipeline`
// (slots, limits and finish, shared with the rules), `policy` (request to
// decision), `body`, `future`, `service`, `layer` (the layer and its
// builder). Protecting the server (shedding, concurrency slots, the load)
// is `crate::layer::protect`. The response
// future is the inner service's, a ready response, or a decision under way;
// the body is the inner service's or the layer's own, without constraining
// the inner body type.

mod body;
mod count_status;
mod future;
mod grpc;
pub(crate) mod headers;
#[allow(clippy::module_inception)]
mod layer;
pub(crate) mod limit;
mod partition_key;
pub(crate) mod pipeline;
mod policy;
pub(crate) mod problem;
pub(crate) mod protect;
mod reason;
pub(crate) mod respond;
mod service;
pub(crate) mod usage;
pub(crate) mod verdict;

pub use body::ResponseBody;
pub use count_status::{CountStatus, CountStatusError};
pub use future::ResponseFuture;
pub use headers::HeaderStyle;
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use partition_key::PartitionKey;
pub use policy::{LimitPolicy, OnMissingKey, Policy};
pub use problem::{QUOTA_EXCEEDED, problem_response};
pub use reason::Reason;
#[cfg(feature = "rules")]
pub(crate) use reason::ReasonMetrics;
pub use respond::{OnBackendError, OnDelay, Refused, Rejection};
pub use service::RateLimit;
pub use usage::{CostFromResponse, Usage};
pub use verdict::Verdict;
// Server protection lives in `crate::layer::protect`; its public types keep
// their paths here, where users name them.
pub use crate::layer::protect::{
    ConcurrencyQuota, LoadSignal, MeasuredLoad, Priority, Shedding, SheddingError,
    TEMPORARY_REDUCED_CAPACITY,
};

#[cfg(feature = "rules")]
pub(crate) use headers::Headers;
#[cfg(feature = "rules")]
pub(crate) use policy::Sealed;
#[cfg(feature = "rules")]
pub(crate) use problem::problem;
#[cfg(feature = "rules")]
pub(crate) use respond::ResponsePolicy;
