//! What a passed request carries past its decision.

use std::future::Future;
use std::pin::Pin;

use http::StatusCode;
use smallvec::SmallVec;

use super::load::InFlight;
use crate::backend::Slot;
use crate::decision::Decision;
use crate::layer::headers::Headers;

/// Carried from the decision to the response, boxed beside the headers (most
/// requests carry nothing): a response-aware limit's reservation to settle
/// once the response's status is known (kept if it is dropped unsettled),
/// and what is held until the response body has been sent or dropped (a
/// client gone, a panic in the handler). Dropping it gives back the
/// concurrency slots and ends the in-flight count.
#[derive(Default)]
pub(crate) struct Held {
    pub settle: Option<Settlement>,
    pub slots: SmallVec<[Slot; 1]>,
    pub in_flight: Option<InFlight>,
    /// The decision, for the inner service (taken out when the request is
    /// passed on).
    pub decision: Option<Decision>,
    /// Whether the decision (if any) and the reason go in the request's
    /// extensions for the inner service.
    pub hand_over: bool,
    /// A cost known from the response: the watch that settles the
    /// reservation when the body ends.
    pub usage: Option<crate::layer::usage::UsageWatch>,
}

impl Held {
    /// What two limits on one request carry, as one.
    pub(crate) fn and(mut self: Box<Self>, more: Held) -> Box<Held> {
        self.slots.extend(more.slots);
        self.in_flight = self.in_flight.or(more.in_flight);
        self.decision = self.decision.or(more.decision);
        self.hand_over |= more.hand_over;
        self.usage = self.usage.or(more.usage);
        self.settle = self.settle.into_iter().chain(more.settle).reduce(both);
        self
    }
}

/// Settles a response-aware limit's reservation after the inner service has
/// answered: given the response's status, the settling under way, if it
/// has anything to wait for (a give-back; keeping waits for nothing).
pub(crate) type Settlement = Box<dyn FnOnce(StatusCode) -> Option<Settling> + Send>;

/// A settling under way; it yields the rate-limit headers to send instead
/// of those decided before the request went on (`None`: keep those).
pub(crate) type Settling = Pin<Box<dyn Future<Output = Option<Headers>> + Send>>;

/// Two settlements as one. Headers are all-or-nothing: a settling's new
/// headers replace every limit's, so both are kept only when both have them.
fn both(a: Settlement, b: Settlement) -> Settlement {
    Box::new(move |status| match (a(status), b(status)) {
        (None, None) => None,
        (Some(one), None) | (None, Some(one)) => Some(Box::pin(async move {
            one.await;
            None
        }) as Settling),
        (Some(a), Some(b)) => Some(Box::pin(async move {
            let (a, b) = (a.await, b.await);
            a.zip(b).map(|(mut a, b)| {
                a.extend(b);
                a
            })
        })),
    })
}
