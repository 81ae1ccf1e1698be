//! State in Redis, shared by every server of a fleet (the `redis` feature).

mod admin;
mod backend;
mod breaker;
mod builder;
mod cache;
mod concurrency;
mod config_error;
mod connection;
mod lease;
mod on_failure;
mod probe;
mod script;
mod source;
mod stats;

pub use backend::RedisBackend;
pub use breaker::CircuitBreaker;
pub use builder::RedisBackendBuilder;
pub use concurrency::RedisSlots;
pub use config_error::RedisConfigError;
pub(crate) use connection::Connections;
pub use lease::Lease;
pub use on_failure::OnFailure;
pub(crate) use source::connections;
pub use stats::RedisStats;
