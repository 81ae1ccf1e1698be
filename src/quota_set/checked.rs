//! A quota's check in a set of several, kept until the set has decided,
//! and resolved into the quota's decision once it has.

use smallvec::SmallVec;

use crate::algorithm::{
    self, Algorithm, Branch, Outcome, State, Update, fixed_window, gcra, sliding_window,
};
use crate::decision::QuotaDecision;
use crate::quota::{Path, Quota};

/// One quota's check in a set of several, kept until the set has decided.
/// Small (48 bytes), since a set makes one per quota and moves it into its
/// list: an outcome's 128 bytes, written as the check returns and read
/// back at once, made each move wait for its stores (guide::performance,
/// "Notes on the hot path"). So the common algorithms keep only what their branches
/// are made of, and the rest keep their outcome in the set's [`Outcomes`].
pub(crate) enum Checked {
    /// The algorithm's outcome, both branches computed: the set's
    /// `outcomes[at]`.
    Outcome { allowed: bool, at: usize },
    /// An arrival-time quota's check, not elastic: what it reports is
    /// derived from its reset when read, as for such a quota alone, so
    /// neither branch's division is made here.
    Arrival(gcra::Arrival),
    /// An admission by a sliding window, not elastic: the counters after
    /// it and how far into their window it came. Whichever way the set
    /// decides, what the quota reports is derived from counters when read,
    /// so neither branch's search for its replenish is made here.
    SlidingWindow(sliding_window::Admitted),
    /// A fixed window, not elastic: the window counted in, from which the
    /// branch the set takes is made.
    FixedWindow(fixed_window::Counted),
}

/// Where a set keeps the outcomes of its [`Checked::Outcome`]s: inline for
/// two, which most sets never fill.
pub(crate) type Outcomes = SmallVec<[Outcome; 2]>;

impl Checked {
    /// A check that keeps its whole `outcome`, in `outcomes`.
    #[inline]
    pub(crate) fn outcome(outcome: Outcome, outcomes: &mut Outcomes) -> Checked {
        let allowed = outcome.allowed;
        outcomes.push(outcome);
        Checked::Outcome {
            allowed,
            at: outcomes.len() - 1,
        }
    }

    /// Whether the quota admits the request.
    pub(crate) fn allowed(&self) -> bool {
        match self {
            Checked::Outcome { allowed, .. } => *allowed,
            Checked::Arrival(arrival) => arrival.allowed,
            Checked::SlidingWindow(_) => true,
            Checked::FixedWindow(counted) => counted.allowed,
        }
    }
}

impl Checked {
    /// `quota`'s check of a request on its stored `state`; a whole outcome
    /// is kept in `outcomes`. Inlined into the set's loop, as
    /// [`resolve`](Self::resolve) is: left to LLVM, each was a call per
    /// quota, spilling and restoring registers around it.
    #[inline(always)]
    pub(super) fn new(
        quota: &Quota,
        state: Option<&State>,
        cost: u64,
        now: u64,
        room: bool,
        outcomes: &mut Outcomes,
    ) -> Checked {
        let p = &quota.params;
        if quota.path == Path::Arrival && p.elastic_margin == 0 {
            let tat = algorithm::arrival_time(quota.algorithm(), state, p);
            return Checked::Arrival(algorithm::arrive(quota.algorithm(), tat, p, cost, now));
        }
        if quota.path == Path::SlidingWindow {
            // Another algorithm's state counts as none, as in `check`.
            let counters = match state {
                Some(State::SlidingWindow(c)) => Some(c),
                _ => None,
            };
            return sliding_window::admit_or_check(
                counters,
                p,
                cost,
                now,
                Checked::SlidingWindow,
                |outcome| Checked::outcome(outcome, outcomes),
            );
        }
        if quota.algorithm() == Algorithm::FixedWindow && p.elastic_margin == 0 {
            return Checked::FixedWindow(fixed_window::count(state, p, cost, now));
        }
        Checked::outcome(quota.check(state, cost, now, room, false), outcomes)
    }

    /// What the check means once the set has decided (`allowed`): the
    /// quota's decision, and the update to store (none for a peek).
    #[inline(always)]
    pub(super) fn resolve(
        &mut self,
        quota: &Quota,
        allowed: bool,
        commit: bool,
        cost: u64,
        outcomes: &mut Outcomes,
    ) -> (QuotaDecision, Update) {
        match self {
            Checked::Outcome { at, .. } => match outcomes.get_mut(*at) {
                Some(outcome) => {
                    let (raw, update) = resolve(outcome, allowed, commit);
                    (raw.decision(quota), update)
                }
                // Never: a check's outcome is kept where `at` says. Were it
                // missing, the quota would refuse, and store nothing.
                None => {
                    let refused = RawQuotaDecision::resolved(false, 1, false, [0; 3]);
                    (refused.decision(quota), Update::Keep)
                }
            },
            Checked::FixedWindow(counted) => resolve_counted(counted, quota, allowed, commit, cost),
            Checked::Arrival(a) => {
                let admitted = allowed && a.allowed;
                let update = if admitted && commit {
                    Update::Set(State::Word(a.next))
                } else {
                    Update::Keep
                };
                // Remaining and replenish are derived from the reset.
                let numbers = [0, a.reset(admitted), 0];
                let raw = RawQuotaDecision::resolved(a.allowed, a.wait, admitted, numbers);
                (raw.arrival_decision(quota), update)
            }
            Checked::SlidingWindow(admitted) => {
                let update = if allowed && commit {
                    Update::Set(State::SlidingWindow(admitted.counters))
                } else {
                    Update::Keep
                };
                // Refused by another quota: the counters as they were.
                let shown = if allowed {
                    *admitted
                } else {
                    admitted.before(cost)
                };
                (QuotaDecision::sliding_window(&quota.params, shown), update)
            }
        }
    }
}

/// What one quota's outcome means once the set has decided (`allowed`):
/// the raw decision to report, and the update to store (none for a peek).
#[inline]
pub(super) fn resolve(
    outcome: &mut Outcome,
    allowed: bool,
    commit: bool,
) -> (RawQuotaDecision, Update) {
    let admitted = allowed && outcome.allowed;
    let (quota_allowed, wait) = (outcome.allowed, outcome.wait);
    let branch = if admitted {
        &mut outcome.admit
    } else {
        &mut outcome.refuse
    };
    resolve_branch(quota_allowed, wait, admitted, branch, commit)
}

/// A fixed window's count once the set has decided (`allowed`): only the
/// branch that holds is made.
#[inline(always)]
pub(super) fn resolve_counted(
    counted: &fixed_window::Counted,
    quota: &Quota,
    allowed: bool,
    commit: bool,
    cost: u64,
) -> (QuotaDecision, Update) {
    let admitted = allowed && counted.allowed;
    let mut branch = counted.branch(&quota.params, cost, admitted);
    let (raw, update) = resolve_branch(
        counted.allowed,
        counted.wait(),
        admitted,
        &mut branch,
        commit,
    );
    (raw.decision(quota), update)
}

/// [`resolve`] once the branch that holds is chosen: a quota whose check
/// `allowed` the request with `wait` (see `Outcome::wait`), `admitted` or
/// not by its set. The update is taken out of the branch, not copied.
#[inline]
fn resolve_branch(
    allowed: bool,
    wait: u64,
    admitted: bool,
    branch: &mut Branch,
    commit: bool,
) -> (RawQuotaDecision, Update) {
    let numbers = [branch.remaining, branch.reset, branch.replenish];
    let raw = RawQuotaDecision::resolved(allowed, wait, admitted, numbers);
    let update = if commit {
        std::mem::replace(&mut branch.update, Update::Keep)
    } else {
        Update::Keep
    };
    (raw, update)
}

/// One quota's decision on one request in raw numbers (the algorithms'
/// integers, as the Redis script returns them): admit or refuse already
/// chosen by whether the whole set admits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawQuotaDecision {
    /// Whether this quota admits the request.
    pub allowed: bool,
    /// Units left (effective: soft mode's margin not yet taken off).
    pub remaining: u64,
    /// Microseconds until the quota is fully restored.
    pub reset: u64,
    /// Microseconds until more quota is available.
    pub replenish: u64,
    /// Microseconds until the same request would pass (when not allowed).
    pub retry_after: u64,
    /// Microseconds the admitted request waits for its turn.
    pub delay: u64,
}

impl RawQuotaDecision {
    /// The raw decision of a quota whose check `allowed` it with `wait` (see
    /// `Outcome::wait`), once its set has decided: `admitted` if the set
    /// admits it too, reporting the `[remaining, reset, replenish]` of the
    /// branch that holds.
    #[inline]
    pub(super) fn resolved(allowed: bool, wait: u64, admitted: bool, numbers: [u64; 3]) -> Self {
        let [remaining, reset, replenish] = numbers;
        RawQuotaDecision {
            allowed,
            remaining,
            reset,
            replenish,
            retry_after: if allowed { 0 } else { wait },
            delay: if admitted { wait } else { 0 },
        }
    }

    /// The raw decision as quota `q` reports it: soft or elastic mode's margin taken off,
    /// times as durations.
    pub(super) fn decision(&self, q: &Quota) -> QuotaDecision {
        let soft_margin = q.params.capacity - q.params.reported_capacity;
        QuotaDecision::new(
            self.allowed,
            q.params.shadow,
            q.params.reported_capacity,
            self.remaining.saturating_sub(soft_margin),
            self.reset,
            self.replenish,
            self.retry_after,
            self.delay,
        )
        .over(self.remaining < soft_margin)
    }

    /// [`decision`](Self::decision) for an arrival-time quota decided
    /// alone, whose `remaining` and `replenish` are not read here: the
    /// decision derives them from the reset when asked.
    #[inline]
    pub(super) fn arrival_decision(&self, q: &Quota) -> QuotaDecision {
        let p = &q.params;
        QuotaDecision::arrival(
            self.allowed,
            p.shadow,
            p.reported_capacity,
            self.reset,
            self.retry_after,
            self.delay,
            p.capacity,
            p.interval,
        )
    }
}
