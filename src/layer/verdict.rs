//! What a policy decides for one request.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

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
        /// Given back when the response is over; boxed, as most requests
        /// hold nothing.
        held: Option<Box<Held>>,
    },
    Respond(Response<Bytes>),
}

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
            held: None,
        })
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
                    held,
                },
                VerdictKind::Pass {
                    headers: more,
                    delay: later,
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
                    held,
                })
            }
        }
    }
}
