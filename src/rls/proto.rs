//! The messages of Envoy's rate limit service
//! (`envoy.service.ratelimit.v3`, `rls.proto`), written with prost's
//! derive and the field numbers of Envoy's definitions; only what the
//! service reads or writes. Unknown fields are skipped by prost, so a newer
//! Envoy's additions do not break decoding.

#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// A `google.protobuf.UInt64Value`: set (even to 0) or not.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitResponse.Code`.
pub mod code {
    /// Within the limit.
    pub const OK: i32 = 1;
    /// Over the limit.
    pub const OVER_LIMIT: i32 = 2;
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CurrentLimit {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(int32, tag = "2")]
    pub unit: i32,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<CurrentLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<ProtoDuration>,
}

/// The gRPC path of `ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What answers `ShouldRateLimit`.
pub(crate) trait Decide: Send + Sync + 'static {
    fn should_rate_limit(
        &self,
        request: RateLimitRequest,
    ) -> impl Future<Output = Result<RateLimitResponse, tonic::Status>> + Send;
}

/// `envoy.service.ratelimit.v3.RateLimitService` as a tower service for
/// tonic's router: what tonic's code generator would write, by hand, as
/// the crate builds without `protoc`.
pub(crate) struct RateLimitServer<T> {
    inner: Arc<T>,
}

impl<T> RateLimitServer<T> {
    pub(crate) fn new(inner: Arc<T>) -> Self {
        RateLimitServer { inner }
    }
}

impl<T> Clone for RateLimitServer<T> {
    fn clone(&self) -> Self {
        RateLimitServer {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> tonic::server::NamedService for RateLimitServer<T> {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

struct Unary<T>(Arc<T>);

impl<T: Decide> tonic::server::UnaryService<RateLimitRequest> for Unary<T> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<tonic::Response<RateLimitResponse>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move {
            inner
                .should_rate_limit(request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

/// The largest request decoded: Envoy's are a few hundred bytes; a larger
/// one is refused by tonic before it is read whole.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

impl<T, B> tower_service::Service<http::Request<B>> for RateLimitServer<T>
where
    T: Decide,
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async {
                Ok(tonic::Status::unimplemented("no such method").into_http())
            });
        }
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_REQUEST_BYTES), None);
            Ok(grpc.unary(Unary(inner), request).await)
        })
    }
}
