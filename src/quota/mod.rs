//! Quotas: how much a key may spend, over what period, by which algorithm.

mod builder;
mod elastic;
mod error;
#[allow(clippy::module_inception)]
mod quota;

pub use crate::algorithm::{Algorithm, Mode};
pub(crate) use crate::algorithm::{EXACT_MAX, Params};
pub use builder::QuotaBuilder;
pub use error::QuotaError;
pub(crate) use quota::Path;
pub use quota::{Counts, Quota};

#[cfg(test)]
mod tests;
