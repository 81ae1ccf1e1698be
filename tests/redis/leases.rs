//! Leases on real Redis servers (and a real Redis Cluster): a fleet of
//! backends taking batches of a key's units never admits more than the
//! quota, and at most the documented bound less; a server that stops while
//! holding a lease costs the fleet at most that lease; a lease never holds
//! more than an eighth of a quota; leases in hand keep deciding while Redis
//! is down; units given back reach Redis at most once, even when the
//! connection breaks after the script ran.

#![cfg(feature = "redis")]

use crate::support;
use crate::support::redis as redis_support;

use std::time::{Duration, Instant};

use redis_support::{RedisCluster, RedisServer};
use tollgate::backend::{BackendErrorKind, RedisBackendBuilder, RedisConfigError};
use tollgate::{Algorithm, Error, Lease, Limiter, Quota, QuotaSet, RedisBackend};

/// A set named "t": Redis refuses a set without a name, whose counters
/// could not be shared by a fleet.
fn set(quota: Quota) -> QuotaSet {
    QuotaSet::new("t", [quota]).unwrap()
}

/// Fixed windows are aligned to the epoch: ten-year windows cannot roll over
/// during a test.
const DECADE: Duration = Duration::from_secs(10 * 365 * 86_400);
const SERVERS: usize = 3;
const CLIENTS: usize = 24;
/// The most units one lease holds in these tests.
const MAX_LEASE: u64 = 25;

fn leasing(builder: RedisBackendBuilder, lease: Lease) -> RedisBackend {
    builder
        .lease(lease)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("build the Redis backend")
}

/// Every server's clients hammer `key` until `run` is over; returns how
/// many were admitted and how long the run took.
async fn hammer(
    backends: &[RedisBackend],
    quotas: &QuotaSet,
    key: &str,
    run: Duration,
) -> (u64, Duration) {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for backend in backends {
        let limiter = Limiter::new(backend.clone(), quotas.clone());
        for _ in 0..CLIENTS {
            let limiter = limiter.clone();
            let key = key.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..200_000 {
                    if start.elapsed() >= run {
                        break;
                    }
                    let d = limiter.check(&key, 1).await.expect("a decision");
                    admitted += u64::from(d.allowed());
                    // Let the other clients of this runtime in.
                    tokio::task::yield_now().await;
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("a client panicked");
    }
    (admitted, start.elapsed())
}

fn fleet(builder: impl Fn() -> RedisBackendBuilder) -> Vec<RedisBackend> {
    (0..SERVERS)
        .map(|_| leasing(builder(), Lease::Max(MAX_LEASE)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_fleet_admits_the_quota_less_at_most_the_parked_units() {
    let server = RedisServer::start();
    let backends = fleet(|| RedisBackend::from_url(server.url()).prefix("fleet:"));
    // Nothing refills in a decade: exactly the limit, less parked units.
    for (i, algorithm) in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ]
    .into_iter()
    .enumerate()
    {
        let limit = 500;
        let quotas = set(Quota::builder(algorithm, limit, DECADE).build().unwrap());
        let key = format!("hot:{i}");
        // Long enough for a loaded machine to spend the 500 units.
        let (admitted, _) = hammer(&backends, &quotas, &key, Duration::from_secs(2)).await;
        let bound = MAX_LEASE * SERVERS as u64;
        assert!(
            admitted <= limit && admitted >= limit - bound,
            "{algorithm}: {admitted} admitted of {limit}"
        );
    }
    let stats: Vec<_> = backends.iter().map(RedisBackend::stats).collect();
    let calls: u64 = stats.iter().map(|s| s.calls).sum();
    let from_leases: u64 = stats.iter().map(|s| s.lease_hits).sum();
    eprintln!("{calls} Redis calls, {from_leases} decisions from leases: {stats:?}");
    assert!(stats.iter().all(|s| s.leases > 0 && s.failures == 0));
    // How many depends on the pace, which sizes the leases: on a loaded
    // machine they stay small.
    assert!(from_leases > 0, "admissions come from leases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_fleet_stays_within_the_limit_plus_the_refill() {
    let server = RedisServer::start();
    let backends = fleet(|| RedisBackend::from_url(server.url()).prefix("refill:"));
    // 400 a second, a burst of 200: in a run of t seconds, at most
    // 200 + 400 t.
    for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
        let quotas = set(Quota::builder(algorithm, 400, Duration::from_secs(1))
            .burst(200)
            .build()
            .unwrap());
        let (admitted, run) = hammer(&backends, &quotas, "k", Duration::from_millis(500)).await;
        let most = 200 + (400.0 * run.as_secs_f64()).ceil() as u64;
        // The last lease of each server may be parked, and the refill of
        // the last few milliseconds not yet asked for (each server asks at
        // most once per retry-after, 2.5 ms here, plus a round trip).
        let least = most.saturating_sub(MAX_LEASE * SERVERS as u64 + 400 / 20);
        assert!(
            admitted <= most && admitted >= least,
            "{algorithm}: {admitted} admitted in {run:?}, expected {least}..={most}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_holding_a_lease_costs_the_fleet_that_lease_only() {
    let server = RedisServer::start();
    let quotas = set(Quota::gcra(400, Duration::from_secs(1))
        .burst(50)
        .build()
        .unwrap());
    // A server that takes leases, then stops (is dropped) mid-lease.
    let stopping = leasing(
        RedisBackend::from_url(server.url()).lease_lifetime(Duration::from_secs(5)),
        Lease::Max(MAX_LEASE),
    );
    let (first, _) = hammer(
        std::slice::from_ref(&stopping),
        &quotas,
        "k",
        Duration::from_millis(200),
    )
    .await;
    assert!(stopping.stats().leases > 0);
    drop(stopping);
    // The rest of the fleet gets the full rate at once: its units were
    // spent in Redis when leased, and the refill goes on.
    let rest = fleet(|| RedisBackend::from_url(server.url()));
    let (admitted, run) = hammer(&rest, &quotas, "k", Duration::from_millis(500)).await;
    let rate = 400.0 * run.as_secs_f64();
    // At most one burst beyond the rate (the stopped server's lease could
    // not have left more than that in Redis), and at least the rate less
    // the parked units of both generations.
    let most = 50 + rate.ceil() as u64;
    let least = (rate as u64).saturating_sub(MAX_LEASE * (SERVERS as u64 + 1) + 20);
    assert!(
        admitted <= most && admitted >= least,
        "{admitted} admitted in {run:?} after the first server's {first}; expected {least}..={most}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_in_hand_keep_deciding_while_redis_is_down() {
    let mut server = RedisServer::start();
    let backend = leasing(
        RedisBackend::from_url(server.url())
            .timeout(Duration::from_millis(200))
            .lease_slice(Duration::from_secs(1))
            .lease_lifetime(Duration::from_secs(10)),
        Lease::Max(MAX_LEASE),
    );
    let limiter = Limiter::new(
        backend.clone(),
        set(Quota::fixed_window(1_000, DECADE).build().unwrap()),
    );
    // Leases grow with the pace: 1, 4, 16, then 25 units.
    let mut checks = 0;
    while backend.stats().leases < 3 {
        checks += 1;
        assert!(checks < 1_000, "no lease grew: {:?}", backend.stats());
        assert!(limiter.check("k", 1).await.unwrap().allowed());
    }
    // Whatever the last lease left: spend it with Redis gone.
    server.kill();
    let calls = backend.stats().calls;
    let mut from_lease = 0;
    let error = loop {
        match limiter.check("k", 1).await {
            Ok(d) => {
                assert!(d.allowed());
                from_lease += 1;
                assert!(from_lease <= MAX_LEASE, "more than a lease admitted");
            }
            Err(e) => break e,
        }
    };
    assert!(from_lease >= 1, "the lease in hand decided nothing");
    assert_eq!(backend.stats().calls, calls + 1, "only the failed call");
    // Then the failure policy applies, as without leases.
    match error {
        Error::Backend(e) => assert!(
            matches!(
                e.kind(),
                BackendErrorKind::Unavailable | BackendErrorKind::Timeout
            ),
            "{e}"
        ),
        other => panic!("unexpected error {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_fleet_on_a_cluster_is_exact_on_every_node() {
    let cluster = RedisCluster::start();
    let backends = fleet(|| RedisBackend::from_cluster_urls(cluster.urls()));
    let quotas = QuotaSet::new(
        "cluster",
        [
            Quota::gcra(300, DECADE).name("gcra").build().unwrap(),
            Quota::fixed_window(200, DECADE)
                .name("window")
                .build()
                .unwrap(),
        ],
    )
    .unwrap();
    // Keys on different slots, so on different masters.
    let mut admitted = Vec::new();
    for key in ["a", "b", "c", "user:7"] {
        // Long enough for a loaded machine to spend the 200 units.
        admitted.push(
            hammer(&backends, &quotas, key, Duration::from_secs(1))
                .await
                .0,
        );
    }
    let bound = MAX_LEASE * SERVERS as u64;
    for (n, key) in admitted.iter().zip(["a", "b", "c", "user:7"]) {
        assert!(*n <= 200 && *n >= 200 - bound, "{key}: {n}");
    }
    assert!(backends.iter().all(|b| b.stats().leases > 0));
    for node in &cluster.nodes {
        let size: u64 = node.cli(&["DBSIZE"]).parse().unwrap();
        assert!(size > 0, "node {} holds nothing", node.port());
    }
}

#[tokio::test]
async fn sets_that_need_every_arrival_are_named_and_decided_one_at_a_time() {
    let server = RedisServer::start();
    let backend = leasing(RedisBackend::from_url(server.url()), Lease::Auto);
    let log = QuotaSet::new(
        "log",
        [
            Quota::gcra(10, DECADE).name("gcra").build().unwrap(),
            Quota::sliding_log(3, DECADE).name("log").build().unwrap(),
        ],
    )
    .unwrap();
    let err = backend.supports_leases(&log).unwrap_err();
    assert!(
        matches!(&err, RedisConfigError::LeaseUnsupported { quota, algorithm: Algorithm::SlidingLog } if quota == "log")
    );
    assert!(err.to_string().contains("cannot be leased"), "{err}");
    let limiter = Limiter::new(backend.clone(), log);
    let admitted = {
        let mut n = 0;
        for _ in 0..10 {
            n += u64::from(limiter.check("k", 1).await.unwrap().allowed());
        }
        n
    };
    assert_eq!(admitted, 3);
    assert_eq!(backend.stats().leases, 0);
    // With leases off, every set is fine.
    let off = RedisBackend::from_url(server.url()).build().unwrap();
    assert!(off.supports_leases(limiter.quotas()).is_ok());
    // Out-of-range settings are refused when built.
    for bad in [
        RedisBackend::from_url(server.url()).lease(Lease::Max(0)),
        RedisBackend::from_url(server.url())
            .lease(Lease::Auto)
            .lease_slice(Duration::from_millis(100))
            .lease_lifetime(Duration::from_millis(10)),
    ] {
        assert!(matches!(bad.build(), Err(RedisConfigError::Lease(_))));
    }
}

/// A lease holds at most an eighth of the smallest capacity in its set, so
/// one process hammering a small quota cannot park its whole allowance:
/// another process sharing the key is still admitted.
#[tokio::test]
async fn a_lease_never_parks_a_small_quotas_allowance_in_one_process() {
    let server = RedisServer::start();
    let two = || {
        let b = || leasing(RedisBackend::from_url(server.url()), Lease::Auto);
        (b(), b())
    };
    // A quota of 10: an eighth is less than 2, so every admission is its
    // own Redis call, however hot the key.
    let (a, b) = two();
    let ten = set(Quota::gcra(10, DECADE).build().unwrap());
    let (la, lb) = (
        Limiter::new(a.clone(), ten.clone()),
        Limiter::new(b.clone(), ten),
    );
    for _ in 0..5 {
        assert!(la.check("ten", 1).await.unwrap().allowed());
    }
    for _ in 0..5 {
        assert!(lb.check("ten", 1).await.unwrap().allowed(), "b's share");
    }
    assert!(!la.check("ten", 1).await.unwrap().allowed());
    assert!(!lb.check("ten", 1).await.unwrap().allowed());
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.leases, sa.lease_hits, sb.leases), (0, 0, 0), "{sa:?}");
    // A quota of 80: leases of at most 10. After 40 quick admissions in
    // one process (leases grow fourfold each time, so without the cap they
    // would have taken all 80), at most 10 are parked there: the other
    // process gets 30 more.
    let (a, b) = two();
    let eighty = set(Quota::gcra(80, DECADE).build().unwrap());
    let (la, lb) = (
        Limiter::new(a.clone(), eighty.clone()),
        Limiter::new(b.clone(), eighty),
    );
    for _ in 0..40 {
        assert!(la.check("eighty", 1).await.unwrap().allowed());
    }
    assert!(
        a.stats().leases > 0 && a.stats().lease_hits > 0,
        "{:?}",
        a.stats()
    );
    assert!(a.stats().calls >= 4, "40 units in leases of at most 10");
    for i in 0..30 {
        assert!(lb.check("eighty", 1).await.unwrap().allowed(), "b's {i}th");
    }
    // Both hammering a fresh key at once: both are admitted, and together
    // they admit the quota less at most one lease each.
    let (a, b) = two();
    let quotas = set(Quota::gcra(80, DECADE).build().unwrap());
    let run = Duration::from_millis(200);
    let ((from_a, _), (from_b, _)) = tokio::join!(
        hammer(std::slice::from_ref(&a), &quotas, "both", run),
        hammer(std::slice::from_ref(&b), &quotas, "both", run),
    );
    assert!(from_a > 0 && from_b > 0, "a {from_a}, b {from_b}");
    assert!(
        (60..=80).contains(&(from_a + from_b)),
        "a {from_a}, b {from_b}"
    );
}

/// Behind the HTTP layer a lease decides inside `call` (`check_now`), and
/// Redis is asked only when the lease is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_layer_decides_from_a_lease_through_a_real_server() {
    let server = RedisServer::start();
    let backend = leasing(RedisBackend::from_url(server.url()), Lease::Max(MAX_LEASE));
    let limiter = Limiter::new(
        backend.clone(),
        set(Quota::gcra(50, DECADE).build().unwrap()),
    );
    // A generous timeout, refusing when it passes: on a loaded machine a
    // Redis call past the default 100 ms would let the request through
    // (failing open), which reads as an over-admission.
    let layer = tollgate::RateLimitLayer::builder(limiter, tollgate::key::PeerIp::new())
        .timeout(Duration::from_secs(5))
        .on_backend_error(tollgate::OnBackendError::Reject)
        .build();
    let app = axum::Router::new().fallback(|| async { "ok" }).layer(layer);
    let addr = support::serve(app).await;
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let c = support::client();
            let mut admitted = 0u64;
            for _ in 0..5 {
                let status = support::get(&c, addr, "/", &[]).await.status;
                assert!(
                    status == http::StatusCode::OK || status == http::StatusCode::TOO_MANY_REQUESTS
                );
                admitted += u64::from(status == http::StatusCode::OK);
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    // 120 requests for 50 units: all of them, less at most one lease.
    let stats = backend.stats();
    assert!(
        (50 - MAX_LEASE..=50).contains(&admitted),
        "{admitted} {stats:?}"
    );
    // Decisions from a lease spared Redis calls (how many depends on the
    // pace, which a loaded machine slows: leases are sized by it).
    assert!(stats.lease_hits > 0 && stats.calls < 120, "{stats:?}");
}

/// A proxy to `redis` on a port of its own that, once `cut` is set,
/// passes the next script call on, waits for Redis's answer (the script has
/// run) and then closes the client's connection instead of answering.
async fn cutting_proxy(
    redis: std::net::SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::net::SocketAddr {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let cut = cut.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(redis).await else {
                    return;
                };
                let (mut up, mut down) = ([0u8; 16_384], [0u8; 16_384]);
                loop {
                    tokio::select! {
                        n = client.read(&mut up) => {
                            let Ok(n @ 1..) = n else { return };
                            let script = up[..n].windows(4).any(|w| w.eq_ignore_ascii_case(b"eval"));
                            let cutting = script && cut.swap(false, Ordering::SeqCst);
                            if server.write_all(&up[..n]).await.is_err() {
                                return;
                            }
                            if cutting {
                                // Redis answers once the script has run;
                                // the answer never reaches the client.
                                let _ = server.read(&mut down).await;
                                return;
                            }
                        }
                        n = server.read(&mut down) => {
                            let Ok(n @ 1..) = n else { return };
                            if client.write_all(&down[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    addr
}

/// A reservation given back to Redis on a connection that breaks after the
/// script ran is not sent again on a new one: sent twice, its units went
/// back twice, and one more request than the quota allows was admitted.
#[tokio::test]
async fn a_give_back_is_not_sent_again_after_the_connection_broke_under_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let redis = RedisServer::start();
    let cut = Arc::new(AtomicBool::new(false));
    let redis_addr = std::net::SocketAddr::from(([127, 0, 0, 1], redis.port()));
    let proxy = cutting_proxy(redis_addr, cut.clone()).await;
    // Leases of one unit: every decision is a Redis call, counted exactly.
    let backend = leasing(
        RedisBackend::from_url(format!("redis://{proxy}")),
        Lease::Max(1),
    );
    let limiter = Limiter::new(backend, set(Quota::gcra(4, DECADE).build().unwrap()));
    let first = limiter.reserve("k", 1).await.unwrap();
    // The second call takes the key's lease in turn: the first reservation
    // is no longer this process's to take back, and goes to Redis, on the
    // connection kept since.
    let second = limiter.reserve("k", 1).await.unwrap();
    assert!(first.decision().allowed() && second.decision().allowed());
    cut.store(true, Ordering::SeqCst);
    let given = first.give_back().await;
    assert!(
        !cut.load(Ordering::SeqCst),
        "the give-back did not reach Redis"
    );
    second.keep();
    let mut admitted = 0;
    for _ in 0..10 {
        if !limiter.check("k", 1).await.unwrap().allowed() {
            break;
        }
        admitted += 1;
    }
    assert_eq!(admitted, 3, "4 units, 1 kept, 1 given back once");
    // Redis took the unit back, but no answer said so.
    assert!(given.is_err(), "{given:?}");
}

/// The scripts Redis has run: every decision it makes is one.
#[cfg(feature = "rules")]
fn scripts_run(server: &RedisServer) -> u64 {
    server.command_calls("evalsha") + server.command_calls("eval")
}

/// The gateway's path: a rules decision on a leasing Redis, with a lease
/// covering the request, is made inside `call` (its future is ready at the
/// first poll, with no waker ever woken), and Redis runs one script per
/// lease, not per request.
#[cfg(feature = "rules")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_decision_on_a_covering_lease_waits_for_nothing() {
    use std::convert::Infallible;
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    use tower::{Layer, Service};

    const REQUESTS: u64 = 600;
    const LEASE: u64 = 50;
    let server = RedisServer::start();
    let rules = tollgate::rules::Rules::parse(&format!(
        "backend:\n  redis:\n    url: {}\n    lease: {LEASE}\ntimeout: 5s\non_backend_error: reject\nrules:\n  - {{ name: api, key: peer_ip, quotas: [{{ algorithm: gcra, limit: 1000000, period: 1h }}] }}\n",
        server.url()
    ))
    .unwrap();
    let hello = tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, Infallible>(http::Response::new(axum::body::Body::empty()))
    });
    let mut service = tollgate::RateLimitLayer::from_policy(rules).layer(hello);
    let request = || {
        let mut request = http::Request::new(());
        let peer: std::net::SocketAddr = "192.0.2.7:4000".parse().unwrap();
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        request
    };
    // The first request takes the first lease (and loads the scripts).
    let first = service.call(request()).await.unwrap();
    assert_eq!(first.status(), http::StatusCode::OK);
    let scripts_before = scripts_run(&server);
    let (mut now, mut awaited) = (0u64, 0u64);
    for _ in 0..REQUESTS {
        let mut answer = std::pin::pin!(service.call(request()));
        let response = match answer
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(response) => {
                now += 1;
                response
            }
            Poll::Pending => {
                awaited += 1;
                answer.await
            }
        };
        assert_eq!(response.unwrap().status(), http::StatusCode::OK);
    }
    let scripts = scripts_run(&server) - scripts_before;
    // A lease of up to 50 units at a time, taken ahead (in the background)
    // or awaited by the request that found none: a few requests in a
    // hundred wait, and Redis runs a few scripts a hundred requests.
    assert!(awaited <= REQUESTS / 10, "awaited {awaited}, now {now}");
    assert_eq!(now + awaited, REQUESTS);
    assert!(scripts <= REQUESTS / 10, "{scripts} scripts");
}
