//! The request pipeline, written once for the layer's [`LimitPolicy`] and
//! the rules: shed -> key -> slots -> limits -> finish.
//!
//! A policy does the first two its own way (the layer sheds by the
//! request's priority and extracts one key; the rules shed by the matching
//! rule's priority and plan one [`Check`] per rule) and hands the checks
//! here. Slots, limits and finish are the same for both, in two forms that
//! share every step but the waiting: [`Pipeline::decide_now`], which never
//! waits and gives up having changed nothing, and [`Pipeline::decide`].
//!
//! [`LimitPolicy`]: super::LimitPolicy

// Verdicts are large because their headers are kept inline (saving an
// allocation per request); they are moved once.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use smallvec::SmallVec;

use super::count_status::CountStatus;
use super::headers::Headers;
use super::limit::{Limit, check_within, reserve_within};
use super::reason::Reason;
use super::reason::ReasonMetrics;
use super::respond::ResponsePolicy;
use super::usage::{CostFromResponse, Usage, UsageWatch};
use super::verdict::Verdict;
use crate::backend::{Backend, Now};
use crate::decision::Decision;
use crate::key::Key;
use crate::layer::protect::{Admission, Protection};
use crate::limiter::Error;

mod key;

pub(crate) use key::{DEFAULT_MAX_KEY_LEN, KeyOutcome, admit_key};

/// One limit a request is checked against: a limiter (none for a
/// concurrency quota alone), the key, the cost.
pub(crate) struct Check<'a, B> {
    pub limit: Option<LimitRef<'a, B>>,
    pub key: Key,
    pub cost: u64,
    /// Response-aware: reserve now, keep for these statuses after the
    /// response, give back for the others.
    pub count_status: Option<&'a CountStatus>,
    /// The cost known from the response: `cost` is the estimate reserved
    /// now, settled with the real cost when the response body ends.
    pub cost_from_response: Option<&'a Arc<CostFromResponse>>,
    /// A concurrency quota: a slot taken before any rate check.
    pub concurrency: Option<&'a Protection>,
    /// Told of the limit's decision (the rules' top offenders and penalty
    /// box).
    pub watch: Option<&'a dyn Watch>,
}

/// A check's limit: the policy's own, or one made at run time (a rules
/// override set through the admin API), owned while the request is decided.
pub(crate) enum LimitRef<'a, B> {
    Borrowed(&'a Arc<Limit<B>>),
    // Only rules make overrides; without them the layer borrows alone.
    #[cfg_attr(not(feature = "rules"), allow(dead_code))]
    Owned(Arc<Limit<B>>),
}

impl<B> std::ops::Deref for LimitRef<'_, B> {
    type Target = Arc<Limit<B>>;

    #[inline]
    fn deref(&self) -> &Arc<Limit<B>> {
        match self {
            LimitRef::Borrowed(l) => l,
            LimitRef::Owned(l) => l,
        }
    }
}

/// Told of each limit's decision as it is made.
pub(crate) trait Watch: Sync {
    fn decided(&self, key: &Key, decision: &Decision);
}

/// The checks of one request; one, most often.
pub(crate) type Checks<'a, B> = SmallVec<[Check<'a, B>; 1]>;

/// The concurrency slots a request took, one per check with a quota.
type Admissions = SmallVec<[Admission; 1]>;

/// Whether a policy's backend has said it never decides now
/// ([`Now::Never`]): learned from its first answer, and then asked before
/// any request is prepared, so that a request bound for `decide` has its
/// key extracted (or its rules planned) once. One per policy (per version
/// of the rules), as its limits share one backend.
#[derive(Debug, Default)]
pub(crate) struct Waits(AtomicBool);

impl Waits {
    /// Whether to go straight to `decide`.
    #[inline]
    pub(crate) fn always(&self) -> bool {
        // Relaxed: a request that misses the news only asks once more.
        self.0.load(Ordering::Relaxed)
    }

    fn learn(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What the steps after the key share: how decisions are told, the
/// server's protection (shedding's load, elastic room, the measured load),
/// how long to wait for a store, and the reason counters.
pub(crate) struct Pipeline<'a> {
    pub respond: &'a ResponsePolicy,
    pub protect: &'a Protection,
    pub timeout: Duration,
    /// Whether a passed request carries its decision in its extensions.
    pub decisions: bool,
    pub reasons: &'a ReasonMetrics,
    /// Told when a backend never decides now.
    pub waits: &'a Waits,
}

impl Pipeline<'_> {
    /// The verdict, if it can be reached without waiting; `None` has changed
    /// nothing (slots taken are given back), since [`decide`](Self::decide)
    /// follows.
    // Only the rules plan several checks; the layer asks `decide_one_now`.
    #[cfg_attr(not(feature = "rules"), allow(dead_code))]
    pub(crate) fn decide_now<B: Backend>(&self, checks: &[Check<'_, B>]) -> Option<Verdict> {
        if let [check] = checks {
            return self.decide_one_now(check);
        }
        // A response-aware limit reserves and settles, both awaited.
        if checks
            .iter()
            .any(|c| c.count_status.is_some() || c.cost_from_response.is_some())
        {
            return None;
        }
        // A shared store answers now only from what it holds here (a
        // lease): one limit's `Later` after another limit spent would
        // spend that one twice, so several limits on it are awaited whole.
        // (A `Never` comes before anything is spent: a request's limits
        // share one backend, which says it from its first answer.)
        let mut limits = checks.iter().filter_map(|c| c.limit.as_deref());
        if limits.clone().nth(1).is_some() && limits.any(|l| l.limiter.backend().shared()) {
            return None;
        }
        let mut admissions = Admissions::new();
        for protect in checks
            .iter()
            .filter_map(|c| c.concurrency.map(|p| (p, &c.key)))
        {
            match protect.0.acquire_now(protect.1, self.respond)? {
                Ok(admission) => admissions.push(admission),
                Err(refused) => return Some(self.finish(admissions, refused)),
            }
        }
        let mut verdict = None;
        for check in checks {
            let Some(limit) = check.limit.as_deref() else {
                continue;
            };
            let judged = self.limit_now(limit, check)?;
            if add(&mut verdict, judged) {
                break;
            }
        }
        Some(self.finish(admissions, verdict.unwrap_or_else(admitted)))
    }

    /// [`decide_now`](Self::decide_now) for a request with one check (the
    /// layer's, and a request one rule matches): the same steps, without
    /// the lists and loops that several need.
    #[inline]
    pub(crate) fn decide_one_now<B: Backend>(&self, check: &Check<'_, B>) -> Option<Verdict> {
        if check.count_status.is_some() || check.cost_from_response.is_some() {
            return None;
        }
        let admission = match check.concurrency {
            None => None,
            Some(protect) => match protect.acquire_now(&check.key, self.respond)? {
                Ok(admission) => Some(admission),
                Err(refused) => return Some(self.finish_held(refused)),
            },
        };
        let verdict = match check.limit.as_deref() {
            Some(limit) => self.limit_now(limit, check)?,
            None => admitted(),
        };
        // Matched rather than folded: most requests hold no slot, and a
        // fold moves the verdict (128 bytes) through it all the same.
        Some(self.finish_held(match admission {
            Some(admission) => admission.hold(verdict),
            None => verdict,
        }))
    }

    /// One limit's verdict without waiting; `None` when its backend must be
    /// awaited.
    #[inline]
    fn limit_now<B: Backend>(&self, limit: &Limit<B>, check: &Check<'_, B>) -> Option<Verdict> {
        let room = limit.room(self.protect);
        let outcome = match (limit.limiter.with_room(room)).now(check.key.as_str(), check.cost) {
            Now::Decided(outcome) => outcome,
            Now::Later => return None,
            Now::Never => {
                self.waits.learn();
                return None;
            }
        };
        if let (Some(watch), Ok(decision)) = (check.watch, &outcome) {
            watch.decided(&check.key, decision);
        }
        // A shared store that answered now did so from a lease or a
        // remembered refusal.
        let local = limit.limiter.backend().shared();
        Some(self.judge(limit, &check.key, outcome.as_ref(), local))
    }

    /// The verdict, waiting for slots and stores within the timeout.
    pub(crate) async fn decide<B: Backend>(&self, checks: Checks<'_, B>) -> Verdict {
        let mut admissions = Admissions::new();
        for check in &checks {
            let Some(protect) = check.concurrency else {
                continue;
            };
            match protect
                .acquire(&check.key, self.respond, self.timeout)
                .await
            {
                Ok(admission) => admissions.push(admission),
                // Dropping the admissions gives their slots back.
                Err(refused) => return self.finish(admissions, refused),
            }
        }
        let mut verdict = None;
        // Reservations made so far, given back if a later limit
        // refuses: a request answered here was never served.
        let mut reserved = SmallVec::<[_; 1]>::new();
        let timeout = self.timeout;
        for check in &checks {
            let Some(limit) = check.limit.as_deref() else {
                continue;
            };
            let room = limit.room(self.protect);
            let (limiter, key, cost) = (&limit.limiter, &check.key, check.cost);
            let judged = match check.count_status {
                _ if check.cost_from_response.is_some() => {
                    let made = reserve_within(limiter, key, cost, timeout, room).await;
                    let made = match made {
                        Ok(made) => made,
                        Err(e) => {
                            return self.finish(admissions, self.judge(limit, key, Err(&e), false));
                        }
                    };
                    let judged = self.judge(limit, key, Ok(made.decision()), false);
                    match check.cost_from_response {
                        Some(from) if made.decision().allowed() => {
                            reserved.push((limit, key, cost, made.clone()));
                            let settle =
                                Arc::clone(limit).settle_with(key.clone(), cost, made, timeout);
                            judged.watching(UsageWatch::new(
                                Arc::clone(from),
                                Usage::default(),
                                settle,
                            ))
                        }
                        _ => judged,
                    }
                }
                None => {
                    let outcome = check_within(limiter, key, cost, timeout, room).await;
                    if let (Some(watch), Ok(decision)) = (check.watch, &outcome) {
                        watch.decided(key, decision);
                    }
                    self.judge(limit, key, outcome.as_ref(), false)
                }
                Some(counts) => {
                    let made = reserve_within(limiter, key, cost, timeout, room).await;
                    let made = match made {
                        Ok(made) => made,
                        Err(e) => {
                            return self.finish(admissions, self.judge(limit, key, Err(&e), false));
                        }
                    };
                    if let Some(watch) = check.watch {
                        watch.decided(key, made.decision());
                    }
                    let judged = self.judge(limit, key, Ok(made.decision()), false);
                    if made.decision().allowed() {
                        reserved.push((limit, key, cost, made.clone()));
                    }
                    let settle = Arc::clone(limit).settlement(
                        self.respond,
                        counts,
                        key.clone(),
                        cost,
                        made,
                        timeout,
                    );
                    judged.settling(settle)
                }
            };
            if add(&mut verdict, judged) {
                for (limit, key, cost, made) in &reserved {
                    limit.give_back(key, *cost, made, timeout).await;
                }
                break;
            }
        }
        self.finish(admissions, verdict.unwrap_or_else(admitted))
    }

    /// A verdict reached before any slot or limit (shed, no key, a list):
    /// finished as any other.
    pub(crate) fn settled(&self, verdict: Verdict) -> Verdict {
        self.finish_held(verdict)
    }

    /// The final verdict: a passing one holds every slot taken and is
    /// counted in flight by the measured load; a refusal gives the slots
    /// back, so a request's concurrency and rate quotas are all-or-nothing.
    /// Its reason is counted here, once per request.
    #[inline]
    fn finish(&self, admissions: Admissions, verdict: Verdict) -> Verdict {
        let verdict = admissions.into_iter().fold(verdict, |v, a| a.hold(v));
        self.finish_held(verdict)
    }

    /// [`finish`](Self::finish) once the slots are held (or there are none).
    #[inline]
    fn finish_held(&self, mut verdict: Verdict) -> Verdict {
        self.reasons.count(verdict.reason());
        if self.decisions {
            verdict = verdict.handing_over();
        }
        self.protect.finish(verdict)
    }

    /// `limit`'s verdict, carrying the decision for the inner service when
    /// asked to.
    #[inline]
    fn judge<B>(
        &self,
        limit: &Limit<B>,
        key: &Key,
        outcome: Result<&Decision, &Error>,
        local: bool,
    ) -> Verdict {
        let verdict = limit.judge(self.respond, key, outcome, local);
        match outcome {
            Ok(decision) if self.decisions => verdict.with_decision(decision.clone()),
            _ => verdict,
        }
    }
}

/// Adds one limit's verdict to the request's so far; whether the request
/// is now answered (then no further limit is asked).
#[inline]
fn add(verdict: &mut Option<Verdict>, judged: Verdict) -> bool {
    let next = match verdict.take() {
        None => judged,
        Some(so_far) => so_far.and(judged),
    };
    let answered = next.is_response();
    *verdict = Some(next);
    answered
}

/// The verdict of a request no limit refused, with no limit to say more.
fn admitted() -> Verdict {
    Verdict::pass(Headers::new(), Reason::Admitted)
}
