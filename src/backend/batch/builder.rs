//! [`BatchBackendBuilder`]: stripes, batch size, lifetime and keys.

use std::sync::Mutex;
use std::time::Duration;

use hashbrown::HashMap;

use super::BatchBackend;
use super::stripe::Stripe;
use crate::backend::Backend;
use crate::clock::micros;

/// Builds a [`BatchBackend`]; see [`BatchBackend::builder`].
#[derive(Debug)]
pub struct BatchBackendBuilder<B> {
    pub(super) inner: B,
    pub(super) stripes: usize,
    pub(super) max_batch: u64,
    pub(super) lifetime: Duration,
    pub(super) max_keys: usize,
}

impl<B: Backend> BatchBackendBuilder<B> {
    /// How many stripes of threads hold batches of their own (the number
    /// of cores by default): threads past that many share stripes. At
    /// least 1; each stripe may park a batch per key.
    pub fn stripes(mut self, stripes: usize) -> Self {
        self.stripes = stripes.clamp(1, 1024);
        self
    }

    /// The most units one batch holds (64 by default; 1 batches nothing).
    /// A batch also holds at most an eighth of the smallest capacity in
    /// its set.
    pub fn max_batch(mut self, units: u64) -> Self {
        self.max_batch = units.max(1);
        self
    }

    /// How long a batch's units may be spent after it was taken (10 ms by
    /// default): how far a window's units may spill into the next, and how
    /// long parked units may wait before they are given back.
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// How many keys each stripe holds batches for (1 024 by default):
    /// past that, lapsed batches are dropped, and then all of them.
    pub fn max_keys(mut self, keys: usize) -> Self {
        self.max_keys = keys.max(4);
        self
    }

    /// The backend.
    pub fn build(self) -> BatchBackend<B> {
        BatchBackend {
            inner: self.inner,
            stripes: (0..self.stripes)
                .map(|_| Stripe {
                    held: Mutex::new(HashMap::default()),
                })
                .collect(),
            max_batch: self.max_batch,
            lifetime: micros(self.lifetime).max(1),
            max_keys: self.max_keys,
        }
    }
}
