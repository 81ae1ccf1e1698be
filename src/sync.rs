//! Locks that outlive a panic.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`. A poisoned lock means a panic elsewhere while it was held; the
/// data inside is still valid rate-limit state (every update is a single
/// assignment), so carry on with it rather than fail every later request.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
