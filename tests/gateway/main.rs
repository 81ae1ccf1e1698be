//! The `tollgate` gateway binary run as a process in front of a real
//! upstream on loopback: its commands, logs and metrics, rules that count
//! by status or protect the upstream, hostile clients and intermediaries,
//! and Redis behind it.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod calendar;
mod cli;
mod count_status;
mod dodges;
mod hostile;
mod intermediary;
mod logs;
mod metrics;
mod protect;
mod redis;
mod usage;
mod usage_gateway;
mod usage_layer;
