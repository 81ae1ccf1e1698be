//! What a policy decides for one request.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::Response;

use super::headers::Headers;
use super::reason::Reason;
use crate::decision::Decision;
use crate::layer::protect::held::{Held, Settlement};

/// What becomes of a request: pass it on (maybe after a delay, adding
/// headers), or answer it. Made by a [`Policy`](super::Policy); opaque, as
/// only the layer acts on it.
pub struct Verdict(pub(crate) VerdictKind);

// 128 bytes: a verdict is moved from the policy to the response future,
// and up to 128 bytes a move is copied inline, without calling `memcpy`.
pub(crate) enum VerdictKind {
    Pass {
        headers: Headers,
        delay: Delay,
        /// The settlement and what is held until the response is over.
        held: Option<Box<Held>>,
        reason: Reason,
    },
    /// Boxed: a response inline would make every verdict larger. Its
    /// [`Reason`] is in its extensions.
    Respond(Box<Response<Bytes>>),
}

/// A [`Duration`] kept in 12 bytes aligned to 4 rather than 16 aligned to
/// 8, so that the reason fits beside it within a verdict's 128 bytes.
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
pub(crate) struct Delay {
    secs: u64,
    nanos: u32,
}

impl Delay {
    pub(crate) fn get(self) -> Duration {
        let (secs, nanos) = (self.secs, self.nanos);
        Duration::new(secs, nanos)
    }

    pub(crate) fn is_zero(self) -> bool {
        let (secs, nanos) = (self.secs, self.nanos);
        secs == 0 && nanos == 0
    }
}

impl From<Duration> for Delay {
    fn from(d: Duration) -> Self {
        Delay {
            secs: d.as_secs(),
            nanos: d.subsec_nanos(),
        }
    }
}

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            VerdictKind::Pass { delay, .. } => {
                f.debug_struct("Pass").field("delay", &delay.get()).finish()
            }
            VerdictKind::Respond(r) => f.debug_tuple("Respond").field(&r.status()).finish(),
        }
    }
}

impl Verdict {
    pub(crate) fn pass(headers: Headers, reason: Reason) -> Self {
        Verdict::pass_after(headers, Duration::ZERO, reason)
    }

    pub(crate) fn pass_after(headers: Headers, delay: Duration, reason: Reason) -> Self {
        Verdict(VerdictKind::Pass {
            headers,
            delay: delay.into(),
            held: None,
            reason,
        })
    }

    /// Why the request is passed or answered.
    pub fn reason(&self) -> Reason {
        match &self.0 {
            VerdictKind::Pass { reason, .. } => *reason,
            // A response of the layer's own always has one; a custom
            // rejection whose reason was lost was still a refusal.
            VerdictKind::Respond(r) => r.extensions().get().copied().unwrap_or(Reason::Quota),
        }
    }

    /// This verdict, settling `settle` after the response if it passes
    /// (a refusal drops it: the caller gives back what it reserved).
    pub(crate) fn settling(mut self, settle: Settlement) -> Self {
        if let VerdictKind::Pass { held, .. } = &mut self.0 {
            held.get_or_insert_default().settle = Some(settle);
        }
        self
    }

    /// This verdict, settling its reservation with the cost the response
    /// reports if it passes (a refusal drops it: nothing was spent).
    pub(crate) fn watching(mut self, watch: super::usage::UsageWatch) -> Self {
        if let VerdictKind::Pass { held, .. } = &mut self.0 {
            held.get_or_insert_default().usage = Some(watch);
        }
        self
    }

    /// The usage report the inner service may fill in, if the verdict
    /// watches for one.
    pub(crate) fn usage(&self) -> Option<super::usage::Usage> {
        match &self.0 {
            VerdictKind::Pass {
                held: Some(held), ..
            } => held.usage.as_ref().map(|w| w.usage().clone()),
            _ => None,
        }
    }

    /// This verdict, handing `decision` to the inner service if it passes.
    pub(crate) fn with_decision(mut self, decision: Decision) -> Self {
        if let VerdictKind::Pass { held, .. } = &mut self.0 {
            held.get_or_insert_default().decision = Some(decision);
        }
        self
    }

    /// This verdict, handing its reason (and decision, if it has one) to
    /// the inner service if it passes.
    pub(crate) fn handing_over(mut self) -> Self {
        if let VerdictKind::Pass { held, .. } = &mut self.0 {
            held.get_or_insert_default().hand_over = true;
        }
        self
    }

    /// What to hand to the inner service, taken out of the verdict: the
    /// decision if there is one, and the reason.
    pub(crate) fn take_hand_over(&mut self) -> Option<(Option<Decision>, Reason)> {
        match &mut self.0 {
            VerdictKind::Pass {
                held: Some(held),
                reason,
                ..
            } if held.hand_over => Some((held.decision.take(), *reason)),
            _ => None,
        }
    }

    /// Answers the request with `response`, which carries `reason` in its
    /// extensions (for the layers around this one, and the metrics).
    pub(crate) fn respond(mut response: Response<Bytes>, reason: Reason) -> Self {
        response.extensions_mut().insert(reason);
        Verdict(VerdictKind::Respond(Box::new(response)))
    }

    /// Whether the request is answered by the layer rather than passed on.
    pub(crate) fn is_response(&self) -> bool {
        matches!(self.0, VerdictKind::Respond(_))
    }

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
                    reason,
                },
                VerdictKind::Pass {
                    headers: more,
                    delay: later,
                    held: more_held,
                    reason: other,
                },
            ) => {
                headers.extend(more);
                let held = match (held, more_held) {
                    (Some(held), Some(more)) => Some(held.and(*more)),
                    (held, more) => held.or(more),
                };
                Verdict(VerdictKind::Pass {
                    headers,
                    delay: delay.get().max(later.get()).into(),
                    held,
                    reason: reason.and(other),
                })
            }
        }
    }
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
