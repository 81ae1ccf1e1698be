//! What a passed request carries past its decision.

use smallvec::SmallVec;

use super::load::InFlight;
use super::verdict::Charge;
use crate::backend::Slot;

/// Carried from the decision to the response, boxed beside the headers (most
/// requests carry nothing): a response-aware limit to charge once the
/// response's status is known, and what is held until the response body has
/// been sent or dropped (a client gone, a panic in the handler). Dropping it
/// gives back the concurrency slots and ends the in-flight count.
#[derive(Default)]
pub(crate) struct Held {
    pub charge: Option<Charge>,
    pub slots: SmallVec<[Slot; 1]>,
    pub in_flight: Option<InFlight>,
}

impl Held {
    /// What two limits on one request carry, as one.
    #[cfg(feature = "rules")]
    pub(crate) fn and(mut self: Box<Self>, more: Held) -> Box<Held> {
        self.slots.extend(more.slots);
        self.in_flight = self.in_flight.or(more.in_flight);
        self.charge = self
            .charge
            .into_iter()
            .chain(more.charge)
            .reduce(super::verdict::both);
        self
    }
}
