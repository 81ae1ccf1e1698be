//! The Redis backend against real servers (Redis 7.0 and 8.2, Valkey 9.1):
//! conformance with memory, storage, faults and misbehaving servers,
//! fleets, leases, Cluster, and production deployments (TLS, AUTH,
//! Sentinel); and outbound limits, paced through Redis.

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod conformance;
mod deploy;
mod faults;
mod fleet;
mod leases;
mod misbehaving;
mod outbound;
mod storage;
