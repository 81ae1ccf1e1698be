//! The decision engine through its public API: decisions on a manual clock,
//! properties over random request sequences, and a backend written by a
//! user that passes the conformance traces.

#[path = "../support/mod.rs"]
mod support;

mod custom_backend;
mod decisions;
mod properties;
