//! The decision engine through its public API: decisions on a manual clock,
//! properties over random request sequences, and a backend written by a
//! user that passes the conformance traces, and batches of a hot key's
//! units per stripe of threads.

#[path = "../support/mod.rs"]
mod support;

mod batch;
mod custom_backend;
mod decisions;
mod properties;
