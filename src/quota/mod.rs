//! Quotas: how much a key may spend, over what period, by which algorithm.

mod algorithm;
mod builder;
mod elastic;
mod error;
mod params;
#[allow(clippy::module_inception)]
mod quota;

pub use algorithm::{Algorithm, Mode};
pub use builder::QuotaBuilder;
pub use error::QuotaError;
pub(crate) use params::{EXACT_MAX, Params};
pub(crate) use quota::Path;
pub use quota::Quota;

#[cfg(test)]
mod tests;
