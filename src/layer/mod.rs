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
//! Files, each one job, in the order they depend on each other: `headers`,
//! `partition_key`, `problem` and `grpc` (what clients are told), `verdict`,
//! `respond` (decision to verdict), `policy` (request to decision), `body`,
//! `future`, `service`, `layer` (the layer and its builder).

mod body;
mod count_status;
mod future;
mod grpc;
mod headers;
#[allow(clippy::module_inception)]
mod layer;
mod partition_key;
mod policy;
mod problem;
mod respond;
mod service;
mod verdict;

pub use body::ResponseBody;
pub use count_status::{CountStatus, CountStatusError};
pub use future::ResponseFuture;
pub use headers::HeaderStyle;
pub use layer::{RateLimitLayer, RateLimitLayerBuilder};
pub use partition_key::PartitionKey;
pub use policy::{LimitPolicy, OnMissingKey, Policy};
pub use problem::{QUOTA_EXCEEDED, problem_response};
pub use respond::{OnBackendError, OnDelay, Rejection};
pub use service::RateLimit;
pub use verdict::Verdict;

#[cfg(feature = "rules")]
pub(crate) use headers::Headers;
#[cfg(feature = "rules")]
pub(crate) use policy::{
    DEFAULT_MAX_KEY_LEN, KeyOutcome, Limit, Sealed, admit_key, check_within, look_within,
};
#[cfg(feature = "rules")]
pub(crate) use problem::problem;
#[cfg(feature = "rules")]
pub(crate) use respond::ResponsePolicy;
