//! What a passed request holds until its response is over.

use smallvec::SmallVec;

use super::load::InFlight;
use crate::backend::Slot;

/// Held from the decision until the response body has been sent or dropped
/// (a client gone, a panic in the handler): dropping it gives back the
/// concurrency slots and ends the in-flight count.
#[derive(Default)]
pub(crate) struct Held {
    pub slots: SmallVec<[Slot; 1]>,
    pub in_flight: Option<InFlight>,
}
