//! A stripe's batches: the keys they are held under, their units, and
//! what is given back when they lapse.

use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use hashbrown::{Equivalent, HashMap};

use crate::Decision;
use crate::backend::Reserved;

/// One stripe's batches, on cache lines of its own: the point is that
/// threads of different stripes never write the same line.
#[repr(align(128))]
pub(super) struct Stripe {
    pub(super) held: Mutex<HashMap<Owned, Batch, foldhash::fast::RandomState>>,
}

/// A key and the state ids of its set: two sets checking the same key
/// have batches of their own.
#[derive(Hash, PartialEq, Eq)]
pub(super) struct Owned {
    pub(super) ids: Box<[u64]>,
    pub(super) key: Box<str>,
}

/// [`Owned`] as a request holds it, to look up without allocating. Hashes
/// as `Owned` does (a slice, then a string).
pub(super) struct Borrowed<'a> {
    pub(super) ids: &'a [u64],
    pub(super) key: &'a str,
}

impl Hash for Borrowed<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.ids.hash(state);
        self.key.hash(state);
    }
}

impl Equivalent<Owned> for Borrowed<'_> {
    fn equivalent(&self, owned: &Owned) -> bool {
        *owned.ids == *self.ids && *owned.key == *self.key
    }
}

/// A batch held by a stripe for one key.
pub(super) struct Batch {
    /// Units left.
    pub(super) units: u64,
    /// Units the batch took, the request that took it included.
    pub(super) size: u64,
    /// Until when its units may be spent (microseconds on the system clock).
    pub(super) expires: u64,
    /// The inner backend's reservation: what local admissions report, and
    /// what giving back needs.
    pub(super) reserved: Reserved,
}

impl Batch {
    /// Spends `cost` if the batch holds that much and is still live; the
    /// decision reported is the inner backend's on the batch (its
    /// `remaining` leaves out the units parked here).
    pub(super) fn spend(&mut self, cost: u64, now: u64) -> Option<Decision> {
        if now >= self.expires || self.units < cost || self.units == 0 {
            return None;
        }
        self.units -= cost;
        Some(self.reserved.decision().clone())
    }
}

/// A lapsed batch's units, to give back.
pub(super) struct Leftover {
    pub(super) key: Box<str>,
    pub(super) units: u64,
    pub(super) reserved: Reserved,
}

/// Drops a stripe's batches, the live ones too unless `live_at` is given,
/// and adds their units to `out`, to give back.
pub(super) fn sweep(
    map: &mut HashMap<Owned, Batch, foldhash::fast::RandomState>,
    out: &mut Vec<Leftover>,
    live_at: Option<u64>,
) {
    map.retain(|o, h| {
        if live_at.is_some_and(|now| now < h.expires && h.units > 0) {
            return true;
        }
        if h.units > 0 {
            out.push(Leftover {
                key: o.key.clone(),
                units: h.units,
                reserved: h.reserved.clone(),
            });
        }
        false
    });
}
