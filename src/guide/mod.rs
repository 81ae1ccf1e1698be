//! The guide: how to use tollgate, one chapter per task.
//!
//! Each chapter is a Markdown file beside this module, and its examples are
//! compiled and run as doctests, so they stay true to the code.
//!
//! | chapter | read it to |
//! |---|---|
//! | [`keys`] | limit per client IP (behind proxies too), API key, user or route |
//! | [`headers`] | know what a client is told: 429, `Retry-After`, the `RateLimit` fields, problem details, failures |
//! | [`algorithms`] | pick an algorithm and a quota: bursts, costs, several quotas, modes, minimum intervals |
//! | [`usage`] | limit costs known only from the response (LLM tokens): reserve, then settle with the real cost |
//! | [`routes`] | give routes their own limits, costs read from the request, and limits that count only some responses (failed logins) |
//! | [`redis`] | keep limits in memory, or share them across a fleet through Redis, with leases |
//! | [`rules`] | write limits in a YAML file, reloaded live |
//! | [`gateway`] | put the `tollgate` binary in front of a service in any language |
//! | [`envoy`] | run `tollgate rls` as Envoy's rate limit service, from envoyproxy/ratelimit's files |
//! | [`grpc`] | limit a tonic service |
//! | [`protect`] | protect the server itself: concurrency, elastic quotas, load shedding |
//! | [`metrics`] | export decisions and Redis health to Prometheus or another recorder |
//! | [`outbound`] | limit what you send: wait your turn across a fleet, obey the provider's 429s |
//! | [`operating`] | operate it live: inspect and reset keys, overrides, blocks, the penalty box, top offenders, the admin API |
//! | [`direct`] | limit things that are not HTTP requests (jobs, notifications), test with a manual clock, keep state in a store of your own |
//! | [`performance`] | know what it costs beside governor and tower_governor |

#[doc = include_str!("keys.md")]
pub mod keys {}

#[doc = include_str!("headers.md")]
pub mod headers {}

#[doc = include_str!("algorithms.md")]
// The picture is inline SVG, so that it shows wherever the docs are read
// (docs.rs serves no files beside the crate's pages).
#[doc = include_str!("algorithms.svg")]
pub mod algorithms {}

#[doc = include_str!("routes.md")]
pub mod routes {}

#[doc = include_str!("usage.md")]
pub mod usage {}

// Chapters whose examples need a feature show a pointer without it, so that
// `cargo test --doc` passes with any set of features; docs.rs builds with
// all of them (Cargo.toml's `package.metadata.docs.rs`).
#[cfg_attr(feature = "redis", doc = include_str!("redis.md"))]
#[cfg_attr(
    not(feature = "redis"),
    doc = "Memory and Redis backends. This chapter needs the `redis` feature."
)]
pub mod redis {}

#[cfg_attr(feature = "rules", doc = include_str!("rules.md"))]
#[cfg_attr(
    not(feature = "rules"),
    doc = "Rules in a YAML file. This chapter needs the `rules` feature."
)]
pub mod rules {}

#[doc = include_str!("gateway.md")]
pub mod gateway {}

#[doc = include_str!("envoy.md")]
pub mod envoy {}

#[doc = include_str!("grpc.md")]
pub mod grpc {}

#[doc = include_str!("protect.md")]
pub mod protect {}

#[doc = include_str!("metrics.md")]
pub mod metrics {}

#[doc = include_str!("outbound.md")]
pub mod outbound {}
#[cfg_attr(feature = "admin", doc = include_str!("operating.md"))]
#[cfg_attr(
    not(feature = "admin"),
    doc = "Operating tollgate: the admin API, overrides, top offenders, the penalty box. This chapter needs the `admin` feature."
)]
pub mod operating {}

#[doc = include_str!("direct.md")]
pub mod direct {}

#[doc = include_str!("performance.md")]
// Inline SVG, as the algorithms' picture; drawn by scripts/bench-ratios.py.
#[doc = include_str!("bench-ratios.svg")]
pub mod performance {}
