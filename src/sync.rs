//! Locks that outlive a panic.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`. A poisoned lock means a panic elsewhere while it was held; the
/// data inside is still valid rate-limit state (every update is a single
/// assignment), so carry on with it rather than fail every later request.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Locks `l` to read, carrying on past a poisoned lock as [`lock`] does.
/// Inline: the memory backend takes it on every check.
#[inline]
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Locks `l` to write, carrying on past a poisoned lock as [`lock`] does.
#[inline]
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}
