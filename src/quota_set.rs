//! Several quotas on one key, all of which must pass.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use smallvec::SmallVec;

use crate::algorithm::{
    self, Arrival, Branch, Checked, Outcome, Outcomes, State, Update, fixed_window, sliding_window,
};
use crate::clock::Timestamp;
use crate::decision::{Decision, QuotaDecision};
use crate::quota::{Algorithm, Params, Path, Quota};
use crate::state::QuotaState;

/// Quotas per set decided without a heap allocation (on the stack; a set of
/// more spills over).
const SET_INLINE: usize = 4;

/// A named set of quotas applied together: a request passes only if every
/// enforced quota admits it, and a request refused by one quota spends
/// nothing from the others.
///
/// The name is the set's identity in a backend: two limiters whose sets
/// have the same name and the same quota share counters, which is how
/// several servers share one limit through Redis. A set made from a quota
/// alone ([`single`](QuotaSet::single), or a [`Quota`] passed to
/// [`Limiter::new`](crate::Limiter::new)) has no name: it shares its
/// counters with its clones only, never with another set built separately,
/// so two limiters built from the same quota for two routes count apart.
/// Such a set lives in one process: a backend shared between processes
/// (Redis) refuses it (see [`Limiter::new`](crate::Limiter::new)).
///
/// A quota alone in a named set is shown under the set's name, unless it was
/// given its own ([`QuotaBuilder::name`](crate::QuotaBuilder::name)): in
/// headers, problem details and metrics alike. In a set of several, each
/// quota shows its own name (by default `<limit>-per-<period>`), and metrics
/// and logs the set's.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Quota, QuotaSet};
///
/// // ClassDojo's push notifications: 10 a minute, and 3 s between two.
/// let set = QuotaSet::new("push", [
///     Quota::sliding_log(10, Duration::from_secs(60)).build()?,
///     Quota::min_interval(Duration::from_secs(3)).build()?,
/// ])?;
/// assert_eq!(set.quotas().len(), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaSet {
    name: Arc<str>,
    /// False for a set of one quota made without a name, whose state ids
    /// are private to it and its clones.
    named: bool,
    quotas: Box<[Quota]>,
    ids: Box<[u64]>,
    /// The largest cost every quota could ever admit, so that the check
    /// before each request is one comparison.
    max_cost: u64,
}

/// Why a [`QuotaSet`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaSetError {
    /// No quotas were given.
    Empty,
    /// Two quotas share a name; clients could not tell them apart.
    DuplicateName(String),
}

impl fmt::Display for QuotaSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaSetError::Empty => f.write_str("a quota set needs at least one quota"),
            QuotaSetError::DuplicateName(n) => {
                write!(f, "two quotas are named {n:?}; give each a distinct name")
            }
        }
    }
}

impl std::error::Error for QuotaSetError {}

impl QuotaSet {
    /// A set named `name` of the given quotas.
    pub fn new(
        name: impl Into<Arc<str>>,
        quotas: impl IntoIterator<Item = Quota>,
    ) -> Result<Self, QuotaSetError> {
        let name = name.into();
        let mut quotas: Box<[Quota]> = quotas.into_iter().collect();
        if quotas.is_empty() {
            return Err(QuotaSetError::Empty);
        }
        if let [alone] = &mut *quotas {
            *alone = alone.clone().alone_in(&name);
        }
        for (i, q) in quotas.iter().enumerate() {
            if quotas[..i].iter().any(|o| o.name() == q.name()) {
                return Err(QuotaSetError::DuplicateName(q.name().to_owned()));
            }
        }
        let ids = quotas.iter().map(|q| fingerprint(&name, q)).collect();
        Ok(QuotaSet::assemble(name, true, quotas, ids))
    }

    /// A set of one quota, without a name: its counters are shared by its
    /// clones only, never by another set, even one of the same quota (see
    /// [`QuotaSet`]). Metrics and logs call it by the quota's name. A
    /// backend shared between processes refuses it: name the set with
    /// [`new`](QuotaSet::new) there.
    pub fn single(quota: Quota) -> Self {
        /// Tells apart the sets made without a name in this process. Never
        /// stored outside it: such a set is refused by a shared backend.
        static UNNAMED: AtomicU64 = AtomicU64::new(0);
        let private = format!("\0unnamed:{}", UNNAMED.fetch_add(1, Relaxed));
        let ids = Box::new([fingerprint(&private, &quota)]);
        QuotaSet::assemble(quota.name().into(), false, Box::new([quota]), ids)
    }

    /// A set of quotas already checked to be non-empty with distinct names.
    fn assemble(name: Arc<str>, named: bool, quotas: Box<[Quota]>, ids: Box<[u64]>) -> Self {
        let max_cost = quotas.iter().map(Quota::max_cost).min().unwrap_or(0);
        QuotaSet {
            name,
            named,
            quotas,
            ids,
            max_cost,
        }
    }

    /// The set's name: the one given to [`new`](QuotaSet::new), or for a
    /// set without one, its quota's.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the set was given a name ([`new`](QuotaSet::new)), which
    /// makes its counters shareable across limiters and processes; false
    /// for [`single`](QuotaSet::single), whose counters are its own.
    pub fn is_named(&self) -> bool {
        self.named
    }

    /// The quotas, in order.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }

    /// A stable identifier of each quota's state: the same on every server
    /// for the same set name and quota, different when the quota changes
    /// in a way that changes what its state means. A store keys each
    /// [`QuotaState`] by the client key and this id.
    pub fn state_ids(&self) -> &[u64] {
        &self.ids
    }

    /// Decides one request against the states a store keeps for one key
    /// (`states[i]` is quota `i`'s, `None` when nothing is stored) and
    /// updates them as the decision requires; a peek (`commit: false`)
    /// changes nothing. This is all a store outside the crate needs to
    /// implement [`Backend`](crate::Backend): load, decide, save, in one
    /// transaction.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Quota, QuotaSet, QuotaState, Timestamp};
    ///
    /// let set = QuotaSet::single(Quota::fixed_window(1, Duration::from_secs(60)).build()?);
    /// let mut states: Vec<Option<QuotaState>> = vec![None];
    /// let now = Timestamp::from_secs(1_800_000_000);
    /// assert!(set.decide(&mut states, 1, now, true).allowed());
    /// // What the store saves, and loads for the next request:
    /// let saved = states[0].as_ref().map(QuotaState::to_bytes).expect("a state");
    /// let mut states = vec![Some(QuotaState::from_bytes(&saved)?)];
    /// assert!(!set.decide(&mut states, 1, now, true).allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decide(
        &self,
        states: &mut [Option<QuotaState>],
        cost: u64,
        now: Timestamp,
        commit: bool,
    ) -> Decision {
        self.decide_with_room(states, cost, now, commit, false)
    }

    /// [`decide`](QuotaSet::decide), saying whether the server has room for
    /// [elastic](crate::Mode::Elastic) quotas' extra: a store passes
    /// [`CheckRequest::room`](crate::backend::CheckRequest::room).
    pub fn decide_with_room(
        &self,
        states: &mut [Option<QuotaState>],
        cost: u64,
        now: Timestamp,
        commit: bool,
        room: bool,
    ) -> Decision {
        self.evaluate(states, cost, now, commit, room)
    }

    /// Gives back a reservation: what `decision` (a committed decision of
    /// this set, of `cost` units, made at `at` on the store's clock) spent,
    /// at `now`, on the states a store keeps for its key, as
    /// [`decide`](QuotaSet::decide) reads them. Each quota that spent gets
    /// its units back as if the reservation had not happened, as far as
    /// that is still known: a window that has rolled over since gives
    /// nothing back, and nothing ever goes back beyond a fresh key's
    /// quota. A refused decision spent nothing, and gives nothing back.
    /// Returns what is left then: the decision of a peek at cost 0. What a
    /// store outside the crate calls in
    /// [`Backend::give_back`](crate::Backend::give_back).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Quota, QuotaSet, QuotaState, Timestamp};
    ///
    /// let set = QuotaSet::single(Quota::fixed_window(1, Duration::from_secs(60)).build()?);
    /// let mut states: Vec<Option<QuotaState>> = vec![None];
    /// let now = Timestamp::from_secs(1_800_000_000);
    /// let reserved = set.decide(&mut states, 1, now, true);
    /// assert!(!set.decide(&mut states, 1, now, false).allowed());
    /// let left = set.give_back(&mut states, &reserved, 1, now, now);
    /// assert_eq!(left.remaining(), 1);
    /// assert!(set.decide(&mut states, 1, now, false).allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn give_back(
        &self,
        states: &mut [Option<QuotaState>],
        decision: &Decision,
        cost: u64,
        at: Timestamp,
        now: Timestamp,
    ) -> Decision {
        self.give_back_in(states, decision, cost, at.as_micros(), now.as_micros())
    }

    /// [`give_back`](QuotaSet::give_back) on any [`States`].
    pub(crate) fn give_back_in(
        &self,
        states: &mut (impl States + ?Sized),
        decision: &Decision,
        cost: u64,
        at: u64,
        now: u64,
    ) -> Decision {
        if decision.allowed() && cost > 0 {
            self.give_back_spent(states, decision, cost, at, now);
        }
        self.evaluate(states, 0, Timestamp::from_micros(now), false, false)
    }

    fn give_back_spent(
        &self,
        states: &mut (impl States + ?Sized),
        decision: &Decision,
        cost: u64,
        at: u64,
        now: u64,
    ) {
        let answers = self.quotas.iter().zip(decision.quotas()).enumerate();
        for (i, (quota, answer)) in answers {
            // A shadow quota that refused admitted nothing of it.
            if !answer.allowed() {
                continue;
            }
            let spent = algorithm::Spent {
                cost,
                at,
                until: at.saturating_add(answer.reset_micros()),
            };
            let (algorithm, p) = (quota.algorithm(), &quota.params);
            let update = states.with(i, |s| algorithm::give_back(algorithm, s, p, spent, now));
            states.store(i, update, p);
        }
    }

    /// The first quota that could never admit `cost`, if any: one
    /// comparison, inline, for the costs every quota admits.
    #[inline]
    pub(crate) fn too_costly(&self, cost: u64) -> Option<&Quota> {
        if cost <= self.max_cost {
            return None;
        }
        self.first_too_costly(cost)
    }

    #[cold]
    fn first_too_costly(&self, cost: u64) -> Option<&Quota> {
        self.quotas.iter().find(|q| cost > q.max_cost())
    }

    /// Decides one request against the stored states and hands each
    /// quota's update to [`States::store`]. `commit: false` is a peek;
    /// `room`: whether elastic quotas may use their extra.
    pub(crate) fn evaluate(
        &self,
        states: &mut (impl States + ?Sized),
        cost: u64,
        now: Timestamp,
        commit: bool,
        room: bool,
    ) -> Decision {
        let now = now.as_micros();
        if let [quota] = &*self.quotas {
            let (decision, update) =
                states.with(0, |s| self.evaluate_one(s, cost, now, commit, room));
            states.store(0, update, &quota.params);
            return decision;
        }
        // Pushed once and settled in place, never moved again.
        let mut checks = SmallVec::<[Checked; SET_INLINE]>::new();
        let mut outcomes = Outcomes::new();
        for (i, quota) in self.quotas.iter().enumerate() {
            let check = states.with(i, |s| {
                Checked::new(quota, s, cost, now, room, &mut outcomes)
            });
            checks.push(check);
        }
        let allowed = self.admits(checks.iter().map(Checked::allowed));
        // Each check turned into its decision, and its update stored, as it
        // settles: no list of either between.
        Decision::new(
            allowed,
            checks
                .iter_mut()
                .zip(&*self.quotas)
                .enumerate()
                .map(|(i, (checked, quota))| {
                    let (decision, update) =
                        checked.settle(quota, allowed, commit, cost, &mut outcomes);
                    states.store(i, update, &quota.params);
                    decision
                }),
        )
    }

    /// [`evaluate`](QuotaSet::evaluate) for a set of one quota, the common
    /// case: no list of outcomes or updates, and the decision built in place.
    #[inline]
    pub(crate) fn evaluate_one(
        &self,
        state: Option<&State>,
        cost: u64,
        now: u64,
        commit: bool,
        room: bool,
    ) -> (Decision, Update) {
        // Alone in its set: when it admits, its refusal is never read.
        self.settle_one(
            |q| q.check(state, cost, now, room, true),
            commit,
            RawQuotaDecision::decision,
        )
    }

    /// An admission by a set of one sliding window, not elastic
    /// (`Path::SlidingWindow`), on its stored `counters`: the decision,
    /// whose numbers (a search, for replenish) are computed only when read,
    /// and the counters to store. `None` for a refusal or a clock behind
    /// the window, which [`evaluate_one`](QuotaSet::evaluate_one) decides.
    #[inline]
    pub(crate) fn admit_sliding_window(
        &self,
        counters: Option<&sliding_window::Counters>,
        cost: u64,
        now: u64,
    ) -> Option<(Decision, sliding_window::Counters)> {
        let p = &self.quotas[0].params;
        let admitted = sliding_window::admit_alone(counters, p, cost, now)?;
        let decision = QuotaDecision::sliding_window(p, admitted);
        Some((Decision::one(true, decision), admitted.counters))
    }

    /// [`evaluate_one`](QuotaSet::evaluate_one) for a quota whose state is
    /// the arrival time `tat` (see [`Quota::kept_as_arrival`]): unless it is
    /// elastic,
    /// its algorithm is called directly, so the whole decision inlines into
    /// the backend's compare-and-swap loop, where what the outcome holds is
    /// known and nothing of it is dropped or moved at run time.
    #[inline(always)]
    pub(crate) fn evaluate_arrival(
        &self,
        tat: u64,
        cost: u64,
        now: u64,
        commit: bool,
        room: bool,
    ) -> (Decision, Update) {
        let quota = &self.quotas[0];
        if quota.params.elastic_margin != 0 {
            return self.evaluate_one(Some(&State::Word(tat)), cost, now, commit, room);
        }
        // Remaining and replenish are left to be computed when read: the
        // division they take is then never made for a caller that does
        // not read them.
        self.settle_one(
            |q| algorithm::check_arrival(q.algorithm(), Some(tat), &q.params, cost, now, true),
            commit,
            RawQuotaDecision::arrival_decision,
        )
    }

    /// [`evaluate_one`](QuotaSet::evaluate_one) for a fixed window, not
    /// elastic, kept as one number, `end_and_count`: its algorithm called
    /// directly, and its numbers counted, not derived from a reset.
    #[inline(always)]
    pub(crate) fn evaluate_window(
        &self,
        end_and_count: u64,
        cost: u64,
        now: u64,
        commit: bool,
    ) -> (Decision, Update) {
        let state = State::Word(end_and_count);
        self.settle_one(
            |q| algorithm::fixed_window::check(Some(&state), &q.params, cost, now),
            commit,
            RawQuotaDecision::decision,
        )
    }

    /// A set of one quota decided: its outcome settled into the update to
    /// store and the decision, in the form `report` gives it.
    #[inline(always)]
    fn settle_one(
        &self,
        check: impl FnOnce(&Quota) -> Outcome,
        commit: bool,
        report: impl FnOnce(&RawQuotaDecision, &Quota) -> QuotaDecision,
    ) -> (Decision, Update) {
        let quota = &self.quotas[0];
        let mut outcome = check(quota);
        let allowed = outcome.allowed || quota.params.shadow;
        let (verdict, update) = settle(&mut outcome, allowed, commit);
        (Decision::one(allowed, report(&verdict, quota)), update)
    }

    /// Whether a request passes, given whether each quota admits it: every
    /// enforced quota must.
    pub(crate) fn admits(&self, allowed: impl IntoIterator<Item = bool>) -> bool {
        self.quotas
            .iter()
            .zip(allowed)
            .all(|(q, allowed)| allowed || q.params.shadow)
    }

    /// The decision reported for the quotas' verdicts (one per quota, in
    /// order), however they were computed: in this process or by the Redis
    /// script, which returns the same numbers.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))] // the Redis backend's
    pub(crate) fn decision_from(&self, verdicts: &[RawQuotaDecision]) -> Decision {
        let allowed = self.admits(verdicts.iter().map(|v| v.allowed));
        let decisions = verdicts
            .iter()
            .zip(&*self.quotas)
            .map(|(v, q)| v.decision(q));
        Decision::new(allowed, decisions)
    }
}

// A set's checks, made and settled: here, where quotas and decisions are.
impl Checked {
    /// `quota`'s check of a request on its stored `state`; a whole outcome
    /// is kept in `outcomes`.
    #[inline]
    fn new(
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
            let outcome = algorithm::check_arrival(quota.algorithm(), tat, p, cost, now, false);
            return Checked::Arrival(Arrival::of(&outcome));
        }
        if quota.path == Path::SlidingWindow {
            // Another algorithm's state counts as none, as in `check`.
            let counters = match state {
                Some(State::SlidingWindow(c)) => Some(c),
                _ => None,
            };
            return sliding_window::admit_or_check(counters, p, cost, now, outcomes);
        }
        if quota.algorithm() == Algorithm::FixedWindow && p.elastic_margin == 0 {
            return Checked::FixedWindow(fixed_window::count(state, p, cost, now));
        }
        Checked::outcome(quota.check(state, cost, now, room, false), outcomes)
    }

    /// What the check means once the set has decided (`allowed`): the
    /// quota's decision, and the update to store (none for a peek).
    #[inline]
    fn settle(
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
                    let (verdict, update) = settle(outcome, allowed, commit);
                    (verdict.decision(quota), update)
                }
                // Never: a check's outcome is kept where `at` says. Were it
                // missing, the quota would refuse, and store nothing.
                None => {
                    let refused = RawQuotaDecision::settled(false, 1, false, [0; 3]);
                    (refused.decision(quota), Update::Keep)
                }
            },
            Checked::FixedWindow(counted) => {
                let admitted = allowed && counted.allowed;
                let mut branch = counted.branch(&quota.params, cost, admitted);
                let (verdict, update) = settle_branch(
                    counted.allowed,
                    counted.wait(),
                    admitted,
                    &mut branch,
                    commit,
                );
                (verdict.decision(quota), update)
            }
            Checked::Arrival(a) => {
                let admitted = allowed && a.allowed;
                let update = if admitted && commit {
                    Update::Set(State::Word(a.next))
                } else {
                    Update::Keep
                };
                let reset = if admitted {
                    a.admit_reset
                } else {
                    a.refuse_reset
                };
                // Remaining and replenish are derived from the reset.
                let verdict = RawQuotaDecision::settled(a.allowed, a.wait, admitted, [0, reset, 0]);
                (verdict.arrival_decision(quota), update)
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
/// the verdict to report, and the update to store (none for a peek).
#[inline]
fn settle(outcome: &mut Outcome, allowed: bool, commit: bool) -> (RawQuotaDecision, Update) {
    let admitted = allowed && outcome.allowed;
    let (quota_allowed, wait) = (outcome.allowed, outcome.wait);
    let branch = if admitted {
        &mut outcome.admit
    } else {
        &mut outcome.refuse
    };
    settle_branch(quota_allowed, wait, admitted, branch, commit)
}

/// [`settle`] once the branch that holds is chosen: a quota whose check
/// `allowed` the request with `wait` (see `Outcome::wait`), `admitted` or
/// not by its set. The update is taken out of the branch, not copied.
#[inline]
fn settle_branch(
    allowed: bool,
    wait: u64,
    admitted: bool,
    branch: &mut Branch,
    commit: bool,
) -> (RawQuotaDecision, Update) {
    let numbers = [branch.remaining, branch.reset, branch.replenish];
    let verdict = RawQuotaDecision::settled(allowed, wait, admitted, numbers);
    let update = if commit {
        std::mem::replace(&mut branch.update, Update::Keep)
    } else {
        Update::Keep
    };
    (verdict, update)
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
    /// The verdict of a quota whose check `allowed` it with `wait` (see
    /// `Outcome::wait`), once its set has decided: `admitted` if the set
    /// admits it too, reporting the `[remaining, reset, replenish]` of the
    /// branch that holds.
    #[inline]
    fn settled(allowed: bool, wait: u64, admitted: bool, numbers: [u64; 3]) -> Self {
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

    /// The verdict as quota `q` reports it: soft or elastic mode's margin taken off,
    /// times as durations.
    fn decision(&self, q: &Quota) -> QuotaDecision {
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
    }

    /// [`decision`](Self::decision) for an arrival-time quota decided
    /// alone, whose `remaining` and `replenish` are not read here: the
    /// decision derives them from the reset when asked.
    #[inline]
    fn arrival_decision(&self, q: &Quota) -> QuotaDecision {
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

impl From<Quota> for QuotaSet {
    fn from(quota: Quota) -> Self {
        QuotaSet::single(quota)
    }
}

/// The stored states a decision reads and updates, quota by quota: kept as
/// [`State`]s and lent, or kept otherwise (the memory backend's states of
/// one number) and made for the call.
pub(crate) trait States {
    /// Calls `f` with quota `i`'s state, if there is one.
    fn with<R>(&self, i: usize, f: impl FnOnce(Option<&State>) -> R) -> R;

    /// Stores what the decision made of quota `i`'s state (`p`, its
    /// params).
    fn store(&mut self, i: usize, update: Update, p: &Params);
}

impl States for [Option<QuotaState>] {
    fn with<R>(&self, i: usize, f: impl FnOnce(Option<&State>) -> R) -> R {
        f(self.get(i).and_then(Option::as_ref).map(|s| &s.0))
    }

    fn store(&mut self, i: usize, update: Update, p: &Params) {
        if let Some(slot) = self.get_mut(i) {
            let mut state = slot.take().map(|s| s.0);
            update.apply(&mut state, p);
            *slot = state.map(QuotaState);
        }
    }
}

/// FNV-1a over what gives a quota's state its meaning. Stable across
/// processes and versions, unlike `std`'s hashers, because Redis keys are
/// named by it.
fn fingerprint(set: &str, q: &Quota) -> u64 {
    let p = &q.params;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    };
    eat(set.as_bytes());
    eat(q.name().as_bytes());
    eat(q.algorithm().name().as_bytes());
    for n in [
        p.period.get(),
        p.limit,
        p.capacity,
        u64::from(p.count_rejected),
    ] {
        eat(&n.to_le_bytes());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Mode, QuotaBuilder};
    use std::time::Duration;

    /// What a caller reads of a quota's decision, now and aged as a cached
    /// answer is.
    #[derive(Debug, PartialEq)]
    struct Read {
        now: (bool, u64, Duration, Duration),
        retry_after: Option<Duration>,
        delay: Duration,
        aged: (u64, Duration),
    }

    fn read(q: &QuotaDecision) -> Read {
        let aged = q.aged(150_000);
        Read {
            now: (q.allowed(), q.remaining(), q.reset(), q.replenish()),
            retry_after: q.retry_after(),
            delay: q.delay(),
            aged: (aged.remaining(), aged.reset()),
        }
    }

    /// Asserts that two decisions of one quota read alike; returns whether
    /// it admits.
    fn read_alike(general: &Decision, derived: &Decision) -> bool {
        let ([g], [d]) = (general.quotas(), derived.quotas()) else {
            panic!("one quota each")
        };
        assert_eq!(read(g), read(d));
        assert_eq!(general, derived);
        g.allowed()
    }

    #[test]
    fn an_arrival_time_reports_when_read_what_the_algorithm_computes() {
        // Each request is decided both ways on the same state: the decision
        // whose remaining and replenish are derived when read must report
        // what the general path computed, in every mode and on refusals.
        let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
        for mode in modes {
            // A token bucket of 4 per 3 s (6 in soft mode) refills one unit
            // a microsecond: it is kept as an arrival time too.
            let builders = [
                Quota::gcra(4, Duration::from_secs(2)),
                Quota::leaky_bucket(4, Duration::from_secs(2)),
                Quota::token_bucket(4, Duration::from_secs(3)),
            ];
            for builder in builders {
                let quota = builder.burst(3).mode(mode).build().unwrap();
                assert!(quota.kept_as_arrival());
                let set = QuotaSet::single(quota);
                let mut tat = None;
                let mut seen = [false; 2];
                for (i, cost) in [1, 1, 2, 1, 3, 1, 1, 2, 1, 1].into_iter().enumerate() {
                    let now = 1_000_000 + i as u64 * 170_000;
                    let state = tat.map(State::Word);
                    let (general, update) =
                        set.evaluate_one(state.as_ref(), cost, now, true, false);
                    let (derived, same) =
                        set.evaluate_arrival(tat.unwrap_or(0), cost, now, true, false);
                    assert_eq!(update, same, "{mode:?}, request {i}");
                    let g = read_alike(&general, &derived);
                    seen[usize::from(g)] = true;
                    if let Update::Set(State::Word(next)) = update {
                        tat = Some(next);
                    }
                }
                assert_eq!(seen, [true, true], "admissions and refusals both checked");
            }
        }
    }

    #[test]
    fn a_sliding_window_admission_reports_when_read_what_the_algorithm_computes() {
        // Each request is decided both ways on the same counters: an
        // admission whose numbers are derived when read must report what
        // the general path computed, in every mode, across windows, with a
        // previous window fading, and aged as a cached answer is.
        let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
        for mode in modes {
            let quota = Quota::sliding_window(6, Duration::from_secs(2))
                .mode(mode)
                .build()
                .unwrap();
            assert_eq!(quota.path, crate::quota::Path::SlidingWindow);
            let set = QuotaSet::single(quota);
            let mut counters = None;
            let (mut derived_admissions, mut refusals) = (0, 0);
            for i in 0..60u64 {
                // 0.25 s apart, crossing windows; a clock one step behind
                // every tenth request.
                let now = 4_000_000 + i * 250_000 - if i % 10 == 9 { 300_000 } else { 0 };
                let cost = [1, 2, 1, 3, 0][i as usize % 5];
                let state = counters.map(State::SlidingWindow);
                let (general, update) = set.evaluate_one(state.as_ref(), cost, now, true, false);
                match set.admit_sliding_window(counters.as_ref(), cost, now) {
                    Some((derived, after)) => {
                        derived_admissions += 1;
                        read_alike(&general, &derived);
                        assert_eq!(update, Update::Set(State::SlidingWindow(after)));
                    }
                    // Only a refusal, or a clock behind the window, is left
                    // to the general path.
                    None => refusals += u64::from(general.exceeded()),
                }
                if let Update::Set(State::SlidingWindow(next)) = update {
                    counters = Some(next);
                }
            }
            assert!(
                derived_admissions > 10 && refusals > 5,
                "{mode:?}: {derived_admissions}, {refusals}"
            );
        }
    }

    /// A set decided with every quota's outcome computed in full, both
    /// branches: the reference for the numbers a set derives when read.
    fn decided_in_full(
        set: &QuotaSet,
        states: &mut [Option<QuotaState>],
        cost: u64,
        now: u64,
    ) -> Decision {
        let mut outcomes: Vec<Outcome> = (0..set.quotas().len())
            .map(|i| states.with(i, |s| set.quotas()[i].check(s, cost, now, false, false)))
            .collect();
        let allowed = set.admits(outcomes.iter().map(|o| o.allowed));
        let mut decisions = Vec::new();
        for (i, (outcome, q)) in outcomes.iter_mut().zip(set.quotas()).enumerate() {
            let (verdict, update) = settle(outcome, allowed, true);
            states.store(i, update, &q.params);
            decisions.push(verdict.decision(q));
        }
        Decision::new(allowed, decisions.into_iter())
    }

    /// Decides 120 requests on `set` both ways, as `evaluate` does and in
    /// full, asserting that they agree on the states stored and on what
    /// every quota reports, read now and aged; with a clock stepping back
    /// every tenth request. Costs are 0 to 3 times `unit`. Returns how often
    /// the first quota admitted with the set, admitted but was refused by
    /// another quota, and refused.
    fn decided_both_ways(set: &QuotaSet, unit: u64, label: &str) -> [u32; 3] {
        let mut states: Vec<Option<QuotaState>> = vec![None; set.quotas().len()];
        let mut seen = [0; 3];
        for i in 0..120u64 {
            let now = 4_000_000 + i * 125_000 - if i % 10 == 9 { 300_000 } else { 0 };
            let cost = [1, 2, 1, 3, 0][i as usize % 5] * unit;
            let mut expected_states = states.clone();
            let expected = decided_in_full(set, &mut expected_states, cost, now);
            let at = Timestamp::from_micros(now);
            let decision = set.evaluate(states.as_mut_slice(), cost, at, true, false);
            assert_eq!(states, expected_states, "{label}, request {i}");
            assert_eq!(decision.allowed(), expected.allowed());
            for (d, e) in decision.quotas().iter().zip(expected.quotas()) {
                assert_eq!(read(d), read(e), "{label}, request {i}");
            }
            assert_eq!(decision, expected);
            let first = &decision.quotas()[0];
            seen[match (first.allowed(), decision.allowed()) {
                (true, true) => 0,
                (true, false) => 1,
                (false, _) => 2,
            }] += 1;
        }
        seen
    }

    #[test]
    fn a_sliding_window_in_a_set_reports_when_read_what_the_algorithm_computes() {
        // A sliding window beside a quota that refuses some of what the
        // window admits: the window reports from its counters after the
        // admission, or as they were when another quota refuses, and must
        // read as the full computation does, in every mode, across windows,
        // with a clock stepping back, and aged as a cached answer is.
        let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
        for mode in modes {
            let window = Quota::sliding_window(5, Duration::from_secs(2))
                .name("window")
                .mode(mode)
                .build()
                .unwrap();
            let interval = Quota::min_interval(Duration::from_millis(250))
                .name("interval")
                .build()
                .unwrap();
            let set = QuotaSet::new("pair", [window, interval]).unwrap();
            let seen = decided_both_ways(&set, 1, &format!("{mode:?}"));
            assert!(seen.iter().all(|&n| n > 5), "{mode:?}: {seen:?}");
        }
    }

    #[test]
    fn a_fixed_window_in_a_set_reports_what_its_full_outcome_does() {
        // A set keeps a fixed window's count, not its outcome, and makes
        // only the branch the set takes: it must report and store what the
        // full outcome does, for a window kept as one number (5 per 2 s)
        // and one that is not (more than one a microsecond), in every mode.
        let modes = [Mode::Enforce, Mode::Shadow, Mode::Soft { percent: 50 }];
        for mode in modes {
            for (limit, unit) in [(5, 1), (5_000_000, 1_000_000)] {
                let window = Quota::fixed_window(limit, Duration::from_secs(2))
                    .name("window")
                    .mode(mode)
                    .build()
                    .unwrap();
                // Refuses some of what the window admits: 4 units a second,
                // 3 at once. (At 4 000 000 a second, its check is kept whole,
                // beside the window's count.)
                let spacing = Quota::token_bucket(4 * unit, Duration::from_secs(1))
                    .burst(3 * unit)
                    .name("spacing")
                    .build()
                    .unwrap();
                let set = QuotaSet::new("pair", [window, spacing]).unwrap();
                let label = format!("{mode:?}, limit {limit}");
                let seen = decided_both_ways(&set, unit, &label);
                assert!(seen.iter().all(|&n| n > 5), "{label}: {seen:?}");
            }
        }
    }

    #[test]
    fn a_sets_check_is_small() {
        // A set moves each check into its list; a whole outcome is kept
        // aside (see `Checked`).
        assert!(std::mem::size_of::<Checked>() <= 48);
        assert_eq!(std::mem::size_of::<Outcome>(), 128);
    }

    #[test]
    fn sets_refuse_duplicates_and_emptiness() {
        let q = Quota::gcra(1, Duration::from_secs(1)).build().unwrap();
        assert_eq!(QuotaSet::new("x", []), Err(QuotaSetError::Empty));
        assert!(matches!(
            QuotaSet::new("x", [q.clone(), q]),
            Err(QuotaSetError::DuplicateName(_))
        ));
    }

    #[test]
    fn state_ids_ignore_the_mode_but_not_the_numbers() {
        let base = Quota::gcra(5, Duration::from_secs(1));
        let set = |name: &str, quota: QuotaBuilder| QuotaSet::new(name, [quota.build().unwrap()]);
        let enforce = set("api", base.clone()).unwrap();
        let shadow = set("api", base.clone().mode(Mode::Shadow)).unwrap();
        let bigger = set("api", Quota::gcra(6, Duration::from_secs(1))).unwrap();
        let other_set = set("other", base.clone()).unwrap();
        assert_eq!(enforce.state_ids(), shadow.state_ids());
        assert_ne!(enforce.state_ids(), bigger.state_ids());
        assert_ne!(enforce.state_ids(), other_set.state_ids());
        // A set without a name is only its own (and its clones').
        let unnamed = QuotaSet::single(base.clone().build().unwrap());
        assert_eq!(unnamed.clone().state_ids(), unnamed.state_ids());
        assert_ne!(
            QuotaSet::single(base.build().unwrap()).state_ids(),
            unnamed.state_ids()
        );
    }
}
