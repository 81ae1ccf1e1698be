//! Load shedding: refusing work the server has no room for, lowest
//! priority first.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

/// The problem type of a request shed under load (IANA HTTP problem types).
pub const TEMPORARY_REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

/// How much a request matters when the server is overloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Shed first: batch jobs, prefetches, test traffic.
    Background,
    /// Shed once only the reserved share is left (the default).
    #[default]
    Normal,
    /// Served in the reserved share; shed only at full capacity.
    Critical,
}

impl Priority {
    /// The priority's name in rules files: `background`, `normal`, `critical`.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Background => "background",
            Priority::Normal => "normal",
            Priority::Critical => "critical",
        }
    }
}

/// Why a [`Shedding`] setting was refused.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SheddingError {
    /// The reserved share is not between 0 and 0.5.
    Reserved(f64),
}

impl fmt::Display for SheddingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SheddingError::Reserved(r) => {
                write!(f, "the reserved share must be between 0 and 0.5, not {r}")
            }
        }
    }
}

impl std::error::Error for SheddingError {}

pub(crate) type PriorityFn = dyn Fn(&Parts) -> Priority + Send + Sync;

/// Load shedding: while the layer's [load signal](crate::layer::LoadSignal) is
/// high, refuse requests with 503, the problem type
/// [`TEMPORARY_REDUCED_CAPACITY`] and `Retry-After`, before their key or
/// quotas are looked at.
///
/// A share of the capacity (20% by default, as Stripe keeps) is reserved for
/// [`Priority::Critical`] requests: [`Normal`](Priority::Normal) ones are
/// shed at a load of `1 - reserved` (0.8), [`Background`](Priority::Background)
/// ones one share earlier, at `1 - 2 × reserved` (0.6), and critical ones only
/// at full load (1).
#[derive(Clone)]
pub struct Shedding {
    reserved: f64,
    retry_after: Duration,
    priority: Option<Arc<PriorityFn>>,
}

impl fmt::Debug for Shedding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shedding")
            .field("reserved", &self.reserved)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

impl Default for Shedding {
    fn default() -> Self {
        Shedding::new()
    }
}

impl Shedding {
    /// 20% reserved for critical requests, `Retry-After: 1`, every request
    /// of normal priority.
    pub fn new() -> Self {
        Shedding {
            reserved: 0.2,
            retry_after: Duration::from_secs(1),
            priority: None,
        }
    }

    /// The share of capacity kept for critical requests, from 0 to 0.5.
    pub fn reserved(mut self, share: f64) -> Result<Self, SheddingError> {
        if !(0.0..=0.5).contains(&share) {
            return Err(SheddingError::Reserved(share));
        }
        self.reserved = share;
        Ok(self)
    }

    /// The `Retry-After` of a shed request (1 s by default; rounded up to
    /// whole seconds, at least 1).
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// Each request's priority, from its head (by route, say).
    pub fn priority(
        mut self,
        priority: impl Fn(&Parts) -> Priority + Send + Sync + 'static,
    ) -> Self {
        self.priority = Some(Arc::new(priority));
        self
    }

    /// The load at which requests of `priority` are shed.
    pub fn threshold(&self, priority: Priority) -> f64 {
        match priority {
            Priority::Critical => 1.0,
            Priority::Normal => 1.0 - self.reserved,
            Priority::Background => 1.0 - 2.0 * self.reserved,
        }
    }

    pub(crate) fn priority_of(&self, parts: &Parts) -> Priority {
        self.priority
            .as_ref()
            .map_or_else(Priority::default, |f| f(parts))
    }

    /// Whether a request of `priority` is shed at `load`. A load that is not
    /// a number cannot say there is room, so it sheds.
    pub(crate) fn sheds(&self, priority: Priority, load: f64) -> bool {
        // NaN is below nothing, so an unknown load sheds.
        let has_room = load < self.threshold(priority);
        !has_room
    }

    pub(crate) fn retry_after_time(&self) -> Duration {
        self.retry_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_priorities_are_shed_first_and_a_share_is_kept_for_critical() {
        let s = Shedding::new();
        assert!(!s.sheds(Priority::Background, 0.59));
        assert!(s.sheds(Priority::Background, 0.6));
        assert!(!s.sheds(Priority::Normal, 0.79));
        assert!(s.sheds(Priority::Normal, 0.8));
        assert!(!s.sheds(Priority::Critical, 0.99));
        assert!(s.sheds(Priority::Critical, 1.0));
        assert!(s.sheds(Priority::Critical, f64::NAN));
        assert!(Shedding::new().reserved(0.6).is_err());
        assert!(Shedding::new().reserved(f64::NAN).is_err());
    }
}
