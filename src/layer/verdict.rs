//! What a policy decides for one request.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

use super::headers::Headers;
use super::held::Held;

/// What becomes of a request: pass it on (maybe after a delay, adding
/// headers), or answer it. Made by a [`Policy`](super::Policy); opaque, as
/// only the layer acts on it.
pub struct Verdict(pub(crate) VerdictKind);

pub(crate) enum VerdictKind {
    Pass {
        headers: Headers,
        delay: Duration,
        /// A response-aware limit to charge once the response is known.
        charge: Option<Charge>,
        /// Given back when the response is over; boxed, as most requests
        /// hold nothing.
        held: Option<Box<Held>>,
    },
    Respond(Response<Bytes>),
}

/// Charges a response-aware limit after the inner service has answered:
/// given the response's status, the charge under way if that status counts.
pub(crate) type Charge = Box<dyn FnOnce(StatusCode) -> Option<Charging> + Send>;

/// A charge under way; it yields the rate-limit headers to send instead of
/// those decided before the request went on (`None`: keep those).
pub(crate) type Charging = Pin<Box<dyn Future<Output = Option<Headers>> + Send>>;

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            VerdictKind::Pass { delay, .. } => {
                f.debug_struct("Pass").field("delay", delay).finish()
            }
            VerdictKind::Respond(r) => f.debug_tuple("Respond").field(&r.status()).finish(),
        }
    }
}

impl Verdict {
    pub(crate) fn pass(headers: Headers) -> Self {
        Verdict::pass_after(headers, Duration::ZERO)
    }

    pub(crate) fn pass_after(headers: Headers, delay: Duration) -> Self {
        Verdict(VerdictKind::Pass {
            headers,
            delay,
            charge: None,
            held: None,
        })
    }

    /// This verdict, charging `charge` after the response if it passes.
    pub(crate) fn charging(mut self, charge: Charge) -> Self {
        if let VerdictKind::Pass { charge: slot, .. } = &mut self.0 {
            *slot = Some(charge);
        }
        self
    }

    pub(crate) fn respond(response: Response<Bytes>) -> Self {
        Verdict(VerdictKind::Respond(response))
    }

    /// Whether the request is answered by the layer rather than passed on.
    #[cfg(feature = "rules")]
    pub(crate) fn is_response(&self) -> bool {
        matches!(self.0, VerdictKind::Respond(_))
    }

    #[cfg(feature = "rules")]
    /// Combines the verdicts of several limits on one request: the first
    /// response wins; otherwise the request passes after the longest delay
    /// with every limit's headers.
    pub(crate) fn and(self, other: Verdict) -> Verdict {
        match (self.0, other.0) {
            (VerdictKind::Respond(r), _) | (_, VerdictKind::Respond(r)) => Verdict::respond(r),
            (
                VerdictKind::Pass {
                    headers,
                    delay,
                    charge,
                    held,
                },
                VerdictKind::Pass {
                    headers: more,
                    delay: later,
                    charge: also,
                    held: more_held,
                },
            ) => {
                let mut headers = headers;
                headers.extend(more);
                let held = match (held, more_held) {
                    (Some(mut held), Some(more)) => {
                        let more = *more;
                        held.slots.extend(more.slots);
                        held.in_flight = held.in_flight.or(more.in_flight);
                        Some(held)
                    }
                    (held, more) => held.or(more),
                };
                Verdict(VerdictKind::Pass {
                    headers,
                    delay: delay.max(later),
                    charge: charge.into_iter().chain(also).reduce(both),
                    held,
                })
            }
        }
    }
}

/// Two charges as one. Headers are all-or-nothing: a charge's new headers
/// replace every limit's, so both are kept only when both have them.
#[cfg(feature = "rules")]
fn both(a: Charge, b: Charge) -> Charge {
    Box::new(move |status| match (a(status), b(status)) {
        (None, None) => None,
        (Some(one), None) | (None, Some(one)) => Some(Box::pin(async move {
            one.await;
            None
        }) as Charging),
        (Some(a), Some(b)) => Some(Box::pin(async move {
            let (a, b) = (a.await, b.await);
            a.zip(b).map(|(mut a, b)| {
                a.extend(b);
                a
            })
        })),
    })
}
