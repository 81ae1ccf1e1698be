//! The tower layer in real servers (axum over TCP, tonic for gRPC): keys and
//! client addresses, the rate-limit headers, response-aware limits,
//! protecting the server, and the metrics it reports.

#[path = "../support/mod.rs"]
mod support;

mod backends;
mod client_ip_parsing;
mod count_status;
mod grpc;
mod http_layer;
mod http_server;
mod ietf_headers;
mod keys;
mod metrics;
mod protect;
