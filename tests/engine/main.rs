//! The decision engine through its public API: decisions on a manual clock,
//! properties over random request sequences, a backend written by a user
//! that passes the conformance traces, batches of a hot key's units per
//! stripe of threads, and the guide's picture of the algorithms drawn from
//! them.

#[path = "../support/mod.rs"]
mod support;

mod batch;
mod custom_backend;
mod decisions;
mod pictures;
mod properties;
