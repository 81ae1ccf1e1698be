//! `tollgate rls`, Envoy's rate limit service: driven over gRPC by a client
//! that is not tollgate's (Python grpcio), and by a real Envoy with its HTTP
//! rate limit filter, on memory and on real Redis servers.

#![cfg(feature = "gateway")]

#[path = "../support/mod.rs"]
mod support;

/// Matching, limits, addends and costs, as the reference decides them.
mod decisions;
/// Validation of the files, and their live reload.
mod files;
/// Damaged configuration files, refused without a panic.
mod parsers;
/// A real Envoy in front of the service, and the service on real Redis
/// servers.
mod servers;

use serde_json::{Value, json};

/// A call of one descriptor of `entries` in `domain`.
pub fn call(domain: &str, entries: &[(&str, &str)]) -> Value {
    json!({"domain": domain, "descriptors": [{"entries": entries}]})
}

pub fn code(answer: &Value, i: usize) -> &str {
    answer["statuses"][i]["code"].as_str().unwrap()
}

pub fn remaining(answer: &Value, i: usize) -> u64 {
    answer["statuses"][i]["remaining"].as_u64().unwrap()
}

/// `[requests_per_unit, unit]` of descriptor `i`'s limit, or `None`.
pub fn limit(answer: &Value, i: usize) -> Option<(u64, u64)> {
    let l = &answer["statuses"][i]["limit"];
    (!l.is_null()).then(|| (l[0].as_u64().unwrap(), l[1].as_u64().unwrap()))
}

pub const MINUTE: u64 = 2;
pub const HOUR: u64 = 3;
pub const DAY: u64 = 4;
