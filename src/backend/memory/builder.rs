//! How a memory backend is made: its bounds and its clock.

use std::sync::Arc;

use super::{Inner, MemoryBackend};
use crate::backend::table::Table;
use crate::clock::{Clock, SystemClock};
use crate::metrics::MemoryMetrics;

impl MemoryBackend {
    /// A backend on the system clock with the default bounds.
    pub fn new() -> Self {
        MemoryBackend::builder().build()
    }

    /// A builder for the bounds and the clock.
    pub fn builder() -> MemoryBackendBuilder<SystemClock> {
        MemoryBackendBuilder {
            max_keys: 1_000_000,
            shards: None,
            clock: SystemClock,
        }
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

/// Builds a [`MemoryBackend`].
#[derive(Debug, Clone)]
#[must_use = "call .build() to get the backend"]
pub struct MemoryBackendBuilder<C> {
    max_keys: usize,
    shards: Option<usize>,
    clock: C,
}

impl<C: Clock> MemoryBackendBuilder<C> {
    /// The most states kept at once (one per key and quota), exactly: with
    /// fewer than the shard count, there are fewer shards.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// The number of shards (rounded up to a power of two); by default 16 per
    /// available core, at least 64.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// The clock (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn clock<D: Clock>(self, clock: D) -> MemoryBackendBuilder<D> {
        MemoryBackendBuilder {
            max_keys: self.max_keys,
            shards: self.shards,
            clock,
        }
    }

    /// Builds the backend.
    pub fn build(self) -> MemoryBackend<C> {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let shards = self.shards.unwrap_or((cores * 16).max(64));
        MemoryBackend {
            inner: Arc::new(Inner {
                table: Table::new(self.max_keys, shards),
                clock: self.clock,
                metrics: MemoryMetrics::new(),
            }),
        }
    }
}
