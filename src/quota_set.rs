//! Several quotas on one key, all of which must pass.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::algorithm::{Params, State, Update};
use crate::clock::Timestamp;
use crate::decision::Decision;
use crate::quota::{Counts, Quota};
use crate::state::QuotaState;

mod checked;
mod evaluate;
mod settle;

#[cfg(feature = "redis")]
pub(crate) use checked::RawQuotaDecision;
pub(crate) use evaluate::{arrival_decision, arrive};

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
    /// Whether the set is one quota counting requests ([`Counts`]): its
    /// cost is then made its units before any backend sees it, so that
    /// the one-quota paths, which read the cost as it comes, need not ask.
    alone_counting_requests: bool,
    /// Whether some quota counts requests ([`Counts`]).
    counts_requests: bool,
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
        // A quota counting requests spends at most 1 whatever the cost.
        let max_cost = quotas
            .iter()
            .filter(|q| q.counts() == Counts::Cost)
            .map(Quota::max_cost)
            .min()
            .unwrap_or(u64::MAX);
        let alone_counting_requests = matches!(&*quotas, [q] if q.counts() == Counts::Requests);
        let counts_requests = quotas.iter().any(|q| q.counts() == Counts::Requests);
        QuotaSet {
            name,
            named,
            quotas,
            ids,
            max_cost,
            alone_counting_requests,
            counts_requests,
        }
    }

    /// The cost a request of `cost` (`commit`: spent, not a peek) is
    /// decided at: its own, except for a set of one quota counting
    /// requests, whose units it is made here (see [`requests`]).
    #[inline]
    pub(crate) fn cost_of(&self, cost: u64, commit: bool) -> u64 {
        if self.alone_counting_requests {
            requests(cost, commit)
        } else {
            cost
        }
    }

    /// Whether some quota counts requests ([`Counts::Requests`]): such a
    /// set's quotas spend different units on one call, so a backend that
    /// hands out units ahead (a lease) cannot serve it.
    pub(crate) fn counts_requests(&self) -> bool {
        self.counts_requests
    }

    /// Quota `i` alone, under this set's name and with its state id (an
    /// unnamed quota alone in a new set would take the set's name, and so
    /// another id): what resets one quota of a set.
    pub(crate) fn only(&self, i: usize) -> Option<QuotaSet> {
        let quota = self.quotas.get(i)?.clone();
        let id = *self.ids.get(i)?;
        let name = Arc::clone(&self.name);
        Some(QuotaSet::assemble(
            name,
            self.named,
            Box::new([quota]),
            Box::new([id]),
        ))
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
        self.quotas
            .iter()
            .find(|q| q.counts() == Counts::Cost && cost > q.max_cost())
    }
}

/// The requests a quota counting requests spends of a call of `cost`:
/// 1 for a request, committed whatever its cost (a request of cost 0 is
/// still a request); for a peek, 1 unless it asks what is left (cost 0).
#[inline]
pub(crate) fn requests(cost: u64, commit: bool) -> u64 {
    u64::from(commit || cost > 0)
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
    // Requests and costs are other units: their own state. (Nothing
    // eaten for the cost, so that the ids of quotas counting it stay.)
    if q.counts() == Counts::Requests {
        eat(b"requests");
    }
    // Another calendar counts other windows: its own state.
    if let Some(c) = q.calendar() {
        eat(format!("{:?}", c.period()).as_bytes());
        eat(c.time_zone().as_bytes());
    }
    h
}

#[cfg(test)]
mod tests;
