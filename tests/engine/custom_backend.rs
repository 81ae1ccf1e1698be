//! A backend written only against the public API, as a user adding their
//! own store (Postgres, DynamoDB, a file) would write it: a map of
//! serialised states behind a mutex. It passes the conformance traces the
//! memory and Redis backends pass.

use crate::support::conformance;

use std::collections::HashMap;
use std::future::{Future, ready};
use std::sync::{Arc, Mutex};

use conformance::T0;
use tollgate::backend::{BackendErrorKind, CheckRequest, GiveBackRequest, Reserved};
use tollgate::{Backend, BackendError, Clock, Decision, ManualClock, QuotaState, Timestamp};

/// Rows of (client key, state id) -> serialised state, as a table holds them.
type Rows = HashMap<(String, u64), Vec<u8>>;

/// A store of rows; the clock stands for the store's own (a database's
/// `now()`).
#[derive(Clone)]
struct MapStore {
    rows: Arc<Mutex<Rows>>,
    clock: ManualClock,
}

impl MapStore {
    /// Load, decide, save: one transaction under the lock.
    fn decide(&self, request: CheckRequest<'_>) -> Result<Decision, BackendError> {
        self.transaction(request.key(), request.quotas(), |states| {
            request.quotas().decide_with_room(
                states,
                request.cost(),
                self.clock.now(),
                request.commit(),
                request.room(),
            )
        })
    }

    /// Load, give back, save.
    fn give_back_now(&self, request: GiveBackRequest<'_>) -> Result<Decision, BackendError> {
        let reserved = request.reserved();
        self.transaction(request.key(), request.quotas(), |states| {
            request.quotas().give_back(
                states,
                reserved.decision(),
                request.cost(),
                request.requests(),
                reserved.at(),
                self.clock.now(),
            )
        })
    }

    fn transaction(
        &self,
        key: &str,
        quotas: &tollgate::QuotaSet,
        work: impl FnOnce(&mut [Option<QuotaState>]) -> Decision,
    ) -> Result<Decision, BackendError> {
        let mut rows = self
            .rows
            .lock()
            .map_err(|_| BackendError::new(BackendErrorKind::Unavailable, "store poisoned"))?;
        let ids = quotas.state_ids();
        let mut states = ids
            .iter()
            .map(|&id| {
                rows.get(&(key.to_owned(), id))
                    .map(|bytes| QuotaState::from_bytes(bytes))
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| BackendError::new(BackendErrorKind::Protocol, "bad row").with_source(e))?;
        let decision = work(&mut states);
        for (&id, state) in ids.iter().zip(states) {
            let row = (key.to_owned(), id);
            match state {
                Some(state) => rows.insert(row, state.to_bytes()),
                None => rows.remove(&row),
            };
        }
        Ok(decision)
    }
}

impl Backend for MapStore {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        ready(self.decide(request))
    }

    /// A reservation on the store's own clock, so that giving it back
    /// knows which window it was counted in.
    fn reserve<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Reserved, BackendError>> + Send + 'a {
        let at = self.clock.now();
        ready(self.decide(request).map(|d| Reserved::new(d, at)))
    }

    fn give_back<'a>(
        &'a self,
        request: GiveBackRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        ready(self.give_back_now(request))
    }
}

/// A store that only decides: it cannot give back, and says so.
#[derive(Clone)]
struct DecideOnly(MapStore);

impl Backend for DecideOnly {
    fn check<'a>(
        &'a self,
        request: CheckRequest<'a>,
    ) -> impl Future<Output = Result<Decision, BackendError>> + Send + 'a {
        self.0.check(request)
    }
}

fn fixture() -> (MapStore, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_micros(T0));
    let store = MapStore {
        rows: Arc::default(),
        clock: clock.clone(),
    };
    (store, clock)
}

macro_rules! traces {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test]
        async fn $name() {
            let (store, clock) = fixture();
            conformance::$name(&store, &clock).await;
        }
    )*};
}

traces!(
    seeds_fixed_window_boundary_burst,
    seeds_sliding_log_with_rejected_attempts_logged,
    seeds_sliding_window_counter_examples,
    classdojo_push_notifications_and_the_peers_examples,
    leaky_bucket_delays_and_refusals_match,
    many_requests_in_one_microsecond_are_all_logged,
    costs_peeks_and_too_costly_requests_match,
    a_billion_a_second_is_counted_exactly,
    a_clock_behind_the_state_is_decided_alike,
    random_traces_match,
    elastic_quotas_match_with_room_and_without,
    reservations_given_back_kept_and_dropped_match,
    random_give_back_traces_match,
);

/// A backend without `give_back` reserves (as a check) but refuses to give
/// back with an error saying so: the units stay spent, loudly.
#[tokio::test]
async fn a_backend_that_cannot_give_back_says_so() {
    use std::time::Duration;
    use tollgate::{Error, Limiter, Quota};
    let (store, _clock) = fixture();
    let quota = Quota::fixed_window(3, Duration::from_secs(60))
        .build()
        .unwrap();
    let limiter = Limiter::new(DecideOnly(store), quota);
    let reservation = limiter.reserve("k", 1).await.unwrap();
    assert!(reservation.decision().allowed());
    match reservation.give_back().await {
        Err(Error::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::Unsupported);
            assert!(e.to_string().contains("give_back"), "{e}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(limiter.peek("k", 0).await.unwrap().remaining(), 2);
}

#[tokio::test]
async fn expired_state_can_be_dropped_by_the_store() {
    use std::time::Duration;
    use tollgate::{Limiter, Quota};
    let (store, clock) = fixture();
    let quota = Quota::gcra(2, Duration::from_secs(1))
        .build()
        .expect("quota");
    let limiter = Limiter::new(store.clone(), quota.clone());
    assert!(limiter.check("k", 2).await.expect("decides").allowed());
    let bytes = store
        .rows
        .lock()
        .expect("lock")
        .values()
        .next()
        .cloned()
        .expect("a row");
    let state = QuotaState::from_bytes(&bytes).expect("a state");
    assert_eq!(
        state.expires_at(&quota),
        Timestamp::from_micros(T0 + 1_000_000)
    );
    // Past its expiry the state means nothing: dropping it changes no answer.
    clock.advance(Duration::from_secs(1));
    let with_row = limiter.peek("k", 2).await.expect("decides");
    store.rows.lock().expect("lock").clear();
    assert_eq!(limiter.peek("k", 2).await.expect("decides"), with_row);
}
