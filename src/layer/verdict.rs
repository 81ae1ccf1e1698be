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

// 128 bytes: a verdict is moved from the policy to the response future,
// and up to 128 bytes a move is copied inline, without calling `memcpy`.
pub(crate) enum VerdictKind {
    Pass {
        headers: Headers,
        delay: Duration,
        /// The charge and what is held until the response is over.
        held: Option<Box<Held>>,
    },
    /// Boxed: a response inline would make every verdict larger.
    Respond(Box<Response<Bytes>>),
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
            held: None,
        })
    }

    /// This verdict, charging `charge` after the response if it passes.
    pub(crate) fn charging(mut self, charge: Charge) -> Self {
        if let VerdictKind::Pass { held, .. } = &mut self.0 {
            held.get_or_insert_default().charge = Some(charge);
        }
        self
    }

    pub(crate) fn respond(response: Response<Bytes>) -> Self {
        Verdict(VerdictKind::Respond(Box::new(response)))
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
            (VerdictKind::Respond(r), _) | (_, VerdictKind::Respond(r)) => {
                Verdict(VerdictKind::Respond(r))
            }
            (
                VerdictKind::Pass {
                    mut headers,
                    delay,
                    held,
                },
                VerdictKind::Pass {
                    headers: more,
                    delay: later,
                    held: more_held,
                },
            ) => {
                headers.extend(more);
                let held = match (held, more_held) {
                    (Some(held), Some(more)) => Some(held.and(*more)),
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

/// Two charges as one. Headers are all-or-nothing: a charge's new headers
/// replace every limit's, so both are kept only when both have them.
#[cfg(feature = "rules")]
pub(crate) fn both(a: Charge, b: Charge) -> Charge {
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_verdict_is_moved_without_memcpy() {
        // Up to 128 bytes, a move is copied inline; beyond, it calls
        // `memcpy`, several times a request.
        assert!(std::mem::size_of::<super::Verdict>() <= 128);
        assert!(std::mem::size_of::<Option<super::Verdict>>() <= 128);
    }
}
