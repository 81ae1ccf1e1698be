//! What a limiter answers.

use std::cell::Cell;
use std::time::Duration;

mod quota;

pub use quota::QuotaDecision;

/// The answer to one check: whether the request may proceed, and what each
/// quota reported, in the order of the limiter's quotas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    /// Whether any quota refused, shadow ones included: kept, as the
    /// metrics ask it of every decision.
    exceeded: bool,
    quotas: Answers,
}

/// A decision's answers: a set of one quota (the common case) keeps its
/// one inline; several are a list taken from this thread's [`SPARE`] and
/// given back to it when the decision is dropped.
///
/// Tagged by a word of its own. Hidden in a niche of the answer, every
/// check's `Some(Ok(..))` took several loads and compares to tell apart
/// (GCRA +15 instructions). Tagged by a byte, each move of a decision
/// through the enums around it (`Now`, `Result`) copied the byte apart
/// from the 63 after it, in 16-byte loads at odd offsets that straddle
/// the stores that wrote them, which the processor cannot forward: a
/// stall of about ten cycles each. The word tag took GCRA on one hot
/// key from governor's time to about three quarters of it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[repr(u64)]
enum Answers {
    One(QuotaDecision),
    Several(Vec<QuotaDecision>),
}

impl std::ops::Deref for Answers {
    type Target = [QuotaDecision];

    #[inline]
    fn deref(&self) -> &[QuotaDecision] {
        match self {
            Answers::One(one) => std::slice::from_ref(one),
            Answers::Several(all) => all,
        }
    }
}

impl Drop for Answers {
    #[inline]
    fn drop(&mut self) {
        if let Answers::Several(all) = self {
            keep(std::mem::take(all));
        }
    }
}

/// Keeps `list`, emptied, as this thread's spare; a list already kept
/// there is freed instead.
#[inline]
fn keep(mut list: Vec<QuotaDecision>) {
    list.clear();
    let _ = SPARE.try_with(|spare| spare.replace(list));
}

thread_local! {
    /// The list of answers of the last decision of several quotas dropped
    /// on this thread, emptied, for the next one to fill: a decision of
    /// several quotas otherwise allocated its list and freed it on every
    /// check, ~110 of a three-quota set's ~2 060 instructions.
    static SPARE: Cell<Vec<QuotaDecision>> = const { Cell::new(Vec::new()) };
}

impl Decision {
    /// The decision of a set that `allowed` or not, from its quotas'
    /// answers in order: one kept inline, several in a list this thread
    /// kept from a decision dropped before (see [`SPARE`]).
    #[inline]
    pub(crate) fn new(allowed: bool, quotas: impl ExactSizeIterator<Item = QuotaDecision>) -> Self {
        // Filled here rather than by `collect`, and taken over where the
        // decision is built: a list made first and then moved in is read
        // back at once, wider than it was written, a load that waits
        // (guide::performance, "Notes on the hot path"). Never a panic,
        // even while the thread's locals are being torn down.
        let mut all = SPARE.try_with(Cell::take).unwrap_or_default();
        all.reserve_exact(quotas.len());
        let mut exceeded = false;
        for quota in quotas {
            exceeded |= !quota.allowed;
            all.push(quota);
        }
        if let [one] = all[..] {
            keep(all);
            return Decision::one(allowed, one);
        }
        Decision {
            allowed,
            exceeded,
            quotas: Answers::Several(all),
        }
    }

    /// The decision of a set of one quota.
    #[inline]
    pub(crate) fn one(allowed: bool, quota: QuotaDecision) -> Self {
        Decision {
            allowed,
            exceeded: !quota.allowed,
            quotas: Answers::One(quota),
        }
    }

    /// Whether the request may proceed. Shadow quotas never make this false.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Whether any quota refused the request or would have (in shadow mode):
    /// what enforcing every quota would have done, inverted.
    pub fn exceeded(&self) -> bool {
        self.exceeded
    }

    /// Each quota's answer, in the order the quotas were given.
    pub fn quotas(&self) -> &[QuotaDecision] {
        &self.quotas
    }

    /// The indices of the enforced quotas that refused.
    pub fn violated(&self) -> impl Iterator<Item = usize> + '_ {
        self.quotas
            .iter()
            .enumerate()
            .filter(|(_, q)| !q.allowed && !q.shadow)
            .map(|(i, _)| i)
    }

    /// When refused: the time until the same request would pass, the longest
    /// wait among the enforced quotas that refused it. (A shadow quota's wait
    /// is in its own [`QuotaDecision`].)
    pub fn retry_after(&self) -> Option<Duration> {
        if self.allowed {
            return None;
        }
        self.quotas
            .iter()
            .filter(|q| !q.allowed && !q.shadow)
            .map(|q| q.wait)
            .max()
            .map(Duration::from_micros)
    }

    /// How long an admitted request must wait for its turn (leaky bucket).
    pub fn delay(&self) -> Duration {
        self.quotas
            .iter()
            .map(QuotaDecision::delay_micros)
            .max()
            .map_or(Duration::ZERO, Duration::from_micros)
    }

    /// The quota closest to refusing: least remaining, then longest reset.
    /// Its numbers are the ones to report when only one set fits.
    pub fn binding(&self) -> Option<&QuotaDecision> {
        self.quotas
            .iter()
            .min_by_key(|q| (q.remaining(), std::cmp::Reverse(q.reset_micros())))
    }

    /// Units left on the binding quota.
    pub fn remaining(&self) -> u64 {
        self.binding().map_or(0, QuotaDecision::remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_fits_in_a_cache_line() {
        // It is moved several times between the backend and the caller: the
        // two ways of keeping what is left share one pair of numbers.
        assert_eq!(std::mem::size_of::<QuotaDecision>(), 48);
        assert!(std::mem::size_of::<Decision>() <= 64);
    }

    fn answer(remaining: u64) -> QuotaDecision {
        QuotaDecision::new(true, false, 10, remaining, 1_000, 100, 0, 0)
    }

    #[test]
    fn a_list_of_answers_is_reused_once_its_decision_is_dropped() {
        let first = Decision::new(true, [answer(1), answer(2), answer(3)].into_iter());
        let list = first.quotas().as_ptr();
        drop(first);
        let second = Decision::new(true, [answer(4), answer(5)].into_iter());
        assert_eq!(second.quotas().as_ptr(), list, "the dropped list is reused");
        // Built while `second` holds the spare: a list of its own, and
        // neither disturbs the other.
        let third = Decision::new(false, [answer(6), answer(7), answer(8)].into_iter());
        assert_ne!(third.quotas().as_ptr(), list);
        let left = |d: &Decision| d.quotas().iter().map(|q| q.remaining()).collect::<Vec<_>>();
        assert_eq!(left(&second), [4, 5]);
        assert_eq!(left(&third), [6, 7, 8]);
        // A decision dropped on another thread leaves its list there.
        std::thread::spawn(move || drop(third)).join().unwrap();
        assert_eq!(left(&second), [4, 5]);
    }

    #[test]
    fn a_decision_of_one_answer_keeps_it_inline_however_built() {
        let one = Decision::new(true, [answer(3)].into_iter());
        assert!(matches!(one.quotas, Answers::One(_)));
        assert_eq!(one, Decision::one(true, answer(3)));
        assert!(Decision::new(true, std::iter::empty()).quotas().is_empty());
    }
}
