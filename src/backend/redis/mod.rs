//! State in Redis, shared by every server of a fleet (the `redis` feature).

mod admin;
mod backend;
mod breaker;
mod builder;
mod cache;
mod concurrency;
mod config_error;
mod connection;
mod lazy;
mod lease;
mod on_failure;
mod probe;
mod script;
mod source;
mod stats;

pub use backend::RedisBackend;
// The one mapping of Redis errors, the outbound pacer's included: a Redis
// that refuses the scripts (ACL, OOM, no scripting) is named as such.
pub use breaker::CircuitBreaker;
pub use builder::RedisBackendBuilder;
pub use concurrency::RedisSlots;
pub use config_error::RedisConfigError;
pub(crate) use connection::redis_error;
pub(crate) use lazy::LazyConnection;
pub use lease::Lease;
pub use on_failure::OnFailure;
pub use stats::RedisStats;
