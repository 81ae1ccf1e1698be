//! What operators change while the rules run: overrides (a key's own
//! quotas), blocks (an operator's, or the penalty box's), and resets.
//!
//! In memory they are this process's. On Redis they live in Redis (a hash,
//! a version counter and a short list of resets under the backend's
//! prefix, one hash tag), and every process polls the version (see
//! [`POLL_EVERY`]): a change made through one gateway is in force on every
//! other within one poll and a round trip, which the tests bound at one
//! second.

// Read by the admin API (the `admin` feature); the request path uses a part.
#![cfg_attr(not(feature = "admin"), allow(dead_code))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::backend::AnyBackend;
use crate::layer::limit::Limit;

/// How often the `tollgate` gateway asks Redis whether an operator changed
/// an override or a block ([`Rules::watch_overrides`](crate::rules::Rules::watch_overrides)):
/// one `GET` of a version. A change reaches every process within this and
/// a round trip (the documented bound is one second).
pub const POLL_EVERY: Duration = Duration::from_millis(250);

/// The most overrides and blocks held at once (each kind): past it, a new
/// one is refused (the admin API says so; the penalty box logs it), so
/// that a flood of offending keys cannot grow the process without bound.
pub(crate) const MAX_ENTRIES: usize = 100_000;

/// Milliseconds since the Unix epoch: expiries are wall-clock times, as
/// they are shared between machines.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A key's own quotas, set at run time.
#[derive(Clone)]
pub(crate) struct Override {
    /// The quotas as given (JSON text), for reading back.
    pub quotas_json: String,
    /// When it ends (ms since the epoch), if ever.
    pub expires_at_ms: Option<u64>,
    /// The quotas' limiter; they count in counters of their own.
    pub limit: Arc<Limit<AnyBackend>>,
}

/// A key refused until a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    /// Until when (ms since the epoch).
    pub until_ms: u64,
    /// Whether the penalty box set it (else an operator).
    pub penalty: bool,
}

/// What a request's key has, as the request path asks.
pub(crate) enum Found {
    /// Refused for this many more milliseconds.
    Blocked(u64),
    /// Checked against these quotas instead of the rule's.
    Override(Arc<Limit<AnyBackend>>),
}

/// Every rule's entries.
#[derive(Default, Clone)]
pub(crate) struct Entries {
    pub overrides: HashMap<String, HashMap<String, Override>>,
    pub blocks: HashMap<String, HashMap<String, Block>>,
}

impl Entries {
    fn len(&self) -> usize {
        let o: usize = self.overrides.values().map(HashMap::len).sum();
        let b: usize = self.blocks.values().map(HashMap::len).sum();
        o + b
    }

    pub(crate) fn count_overrides(&self) -> usize {
        self.overrides.values().map(HashMap::len).sum()
    }

    pub(crate) fn count_blocks(&self) -> usize {
        self.blocks.values().map(HashMap::len).sum()
    }
}

/// The entries in force, shared by every version of the rules.
#[derive(Default)]
pub(crate) struct Runtime {
    /// Whether there is any entry: while not, the request path looks no
    /// further (one load).
    any: AtomicBool,
    pub(crate) entries: RwLock<Entries>,
    /// One more than the store's version last read (0: not read yet).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) version: AtomicU64,
}

impl Runtime {
    /// What `key` of `rule` has now: a block in force first, else an
    /// override in force. Expired entries are ignored here and dropped by
    /// the next change or poll.
    #[inline]
    pub(crate) fn find(&self, rule: &str, key: &str) -> Option<Found> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.find_slow(rule, key)
    }

    #[inline(never)]
    fn find_slow(&self, rule: &str, key: &str) -> Option<Found> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let now = now_ms();
        if let Some(b) = entries.blocks.get(rule).and_then(|m| m.get(key)) {
            if b.until_ms > now {
                return Some(Found::Blocked(b.until_ms - now));
            }
        }
        let o = entries.overrides.get(rule).and_then(|m| m.get(key))?;
        if o.expires_at_ms.is_some_and(|t| t <= now) {
            return None;
        }
        Some(Found::Override(Arc::clone(&o.limit)))
    }

    /// Changes the entries with `f`, dropping expired ones.
    pub(crate) fn change<R>(&self, f: impl FnOnce(&mut Entries) -> R) -> R {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let r = f(&mut entries);
        let now = now_ms();
        for m in entries.blocks.values_mut() {
            m.retain(|_, b| b.until_ms > now);
        }
        for m in entries.overrides.values_mut() {
            m.retain(|_, o| o.expires_at_ms.is_none_or(|t| t > now));
        }
        entries.blocks.retain(|_, m| !m.is_empty());
        entries.overrides.retain(|_, m| !m.is_empty());
        self.any.store(entries.len() > 0, Ordering::Relaxed);
        r
    }

    /// A copy of the entries, for reading.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&Entries) -> R) -> R {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        f(&entries)
    }
}
