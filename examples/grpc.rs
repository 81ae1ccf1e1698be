//! A tonic gRPC server rate-limited per API key: the standard health
//! service, 3 calls per 30 seconds for each `x-api-key`. A refused call is
//! answered with the gRPC status RESOURCE_EXHAUSTED, `retry-after` and the
//! rate-limit fields in its metadata, which the client below prints.
//!
//! Run with `cargo run --example grpc` (`PORT` overrides 50051). It starts
//! the server, makes four calls with a real tonic client, and keeps serving
//! (try `grpcurl -plaintext -H 'x-api-key: me' 127.0.0.1:50051
//! grpc.health.v1.Health/Check`).

use std::net::SocketAddr;
use std::time::Duration;

use http::HeaderName;
use tollgate::key::HeaderKey;
use tollgate::{Limiter, MemoryBackend, Quota, RateLimitLayer};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Limiter::new(
        MemoryBackend::new(),
        Quota::gcra(3, Duration::from_secs(30)).build()?,
    );
    let layer = RateLimitLayer::new(
        limiter,
        HeaderKey::new(HeaderName::from_static("x-api-key")),
    );

    let (_reporter, health) = tonic_health::server::health_reporter();
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(50051);
    // Bound before the client connects, so the calls below find it.
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    println!("gRPC health service on {addr}, 3 calls per 30 s per x-api-key");

    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for i in 1..=4 {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request.metadata_mut().insert("x-api-key", "demo".parse()?);
        match client.check(request).await {
            Ok(reply) => println!(
                "call {i}: {:?}, ratelimit: {:?}",
                reply.get_ref().status(),
                reply.metadata().get("ratelimit")
            ),
            Err(status) => println!(
                "call {i}: {:?} {:?}, retry-after: {:?}, ratelimit: {:?}",
                status.code(),
                status.message(),
                status.metadata().get("retry-after"),
                status.metadata().get("ratelimit")
            ),
        }
    }
    server.await??;
    Ok(())
}
