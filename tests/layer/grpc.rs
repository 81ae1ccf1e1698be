//! gRPC through the layer: a real tonic server (the standard health service,
//! which needs no protoc) and a real tonic client on a loopback TCP port.
//! Refusals and failures arrive as gRPC statuses, not transport errors.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http::HeaderName;
use tollgate::backend::{BackendErrorKind, CheckRequest};
use tollgate::key::{HeaderKey, KeyError, KeyExtractor, KeyFuture};
use tollgate::layer::Policy;
use tollgate::{
    Backend, BackendError, Decision, Limiter, MemoryBackend, OnBackendError, Quota, RateLimitLayer,
};
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// Serves the health service behind `layer` on a free loopback port.
async fn serve<P: Policy>(layer: RateLimitLayer<P>) -> SocketAddr {
    let (_, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    addr
}

fn api_key() -> HeaderKey {
    HeaderKey::new(HeaderName::from_static("x-api-key"))
}

/// One health check with `key` as the `x-api-key` metadata, if any.
async fn call(addr: SocketAddr, key: Option<&str>) -> Result<(), tonic::Status> {
    call_with(addr, key.map(|k| ("x-api-key", k))).await
}

/// One health check with this metadata entry, if any.
async fn call_with(
    addr: SocketAddr,
    metadata: Option<(&'static str, &str)>,
) -> Result<(), tonic::Status> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    request.set_timeout(Duration::from_secs(5));
    if let Some((name, value)) = metadata {
        request.metadata_mut().insert(name, value.parse().unwrap());
    }
    client.check(request).await.map(|_| ())
}

#[tokio::test]
async fn a_refused_call_is_resource_exhausted_with_retry_after_in_its_metadata() {
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(2, Duration::from_secs(60)).build().unwrap(),
    );
    let addr = serve(RateLimitLayer::new(limiter, api_key())).await;
    call(addr, Some("alice")).await.unwrap();
    call(addr, Some("alice")).await.unwrap();
    let refused = call(addr, Some("alice")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        refused.message(),
        "rate limit exceeded; retry in 30 seconds"
    );
    let metadata = refused.metadata();
    assert_eq!(metadata.get("retry-after").unwrap(), "30");
    assert_eq!(metadata.get("ratelimit").unwrap(), "\"2-per-60s\";r=0;t=30");
    assert!(metadata.get("ratelimit-policy").is_some());
    // Another client is still served.
    call(addr, Some("bob")).await.unwrap();
}

#[tokio::test]
async fn a_call_without_a_key_is_invalid_argument() {
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(2, Duration::from_secs(60)).build().unwrap(),
    );
    let addr = serve(RateLimitLayer::new(limiter, api_key())).await;
    let refused = call(addr, None).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
}

/// A backend that always fails.
struct Down;

impl Backend for Down {
    fn check<'a>(
        &'a self,
        _: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        std::future::ready(Err(BackendError::new(
            BackendErrorKind::Unavailable,
            "down for the test",
        )))
    }
}

#[tokio::test]
async fn a_failed_backend_under_reject_is_unavailable() {
    let quota = Quota::gcra(2, Duration::from_secs(60)).build().unwrap();
    let reject = RateLimitLayer::builder(Limiter::new(Down, quota.clone()), api_key())
        .on_backend_error(OnBackendError::Reject)
        .build();
    let addr = serve(reject).await;
    let failed = call(addr, Some("alice")).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unavailable, "{failed:?}");
    assert_eq!(failed.message(), "the rate limiter is unavailable");
    // Under the default (allow), the call goes through.
    let addr = serve(RateLimitLayer::new(Limiter::new(Down, quota), api_key())).await;
    call(addr, Some("alice")).await.unwrap();
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn peer_ip_keys_a_call_by_the_address_tonic_records() {
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(2, Duration::from_secs(60)).build().unwrap(),
    );
    let addr = serve(RateLimitLayer::new(limiter, tollgate::key::PeerIp::new())).await;
    call(addr, None).await.unwrap();
    call(addr, None).await.unwrap();
    let refused = call(addr, None).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
}

#[cfg(feature = "tonic")]
#[tokio::test]
async fn client_ip_behind_a_trusted_proxy_reads_the_forwarded_metadata() {
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(1, Duration::from_secs(60)).build().unwrap(),
    );
    let key = tollgate::key::ClientIp::trusted_proxies(["127.0.0.1".parse().unwrap()]);
    let addr = serve(RateLimitLayer::new(limiter, key)).await;
    let from = |client| Some(("x-forwarded-for", client));
    call_with(addr, from("203.0.113.1")).await.unwrap();
    let refused = call_with(addr, from("203.0.113.1")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    // Another client behind the same proxy has its own count.
    call_with(addr, from("203.0.113.2")).await.unwrap();
}

/// A key extractor on a server that records no peer address.
struct NoPeer;

impl KeyExtractor for NoPeer {
    fn extract(&self, _: &http::request::Parts) -> KeyFuture {
        KeyFuture::ready(Err(KeyError::NoPeerAddress))
    }
}

#[tokio::test]
async fn a_server_that_records_no_peer_address_is_internal_and_says_what_to_do() {
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(2, Duration::from_secs(60)).build().unwrap(),
    );
    let addr = serve(RateLimitLayer::new(limiter, NoPeer)).await;
    let failed = call(addr, None).await.unwrap_err();
    assert_eq!(failed.code(), Code::Internal, "{failed:?}");
    assert!(failed.message().contains("`tonic` feature"), "{failed:?}");
}
