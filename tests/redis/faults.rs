//! Redis losing its scripts, restarting, dying under load, pausing: no
//! panic, every check answered within the timeout, and decisions from Redis
//! again once it is back.

#![cfg(feature = "redis")]

use crate::support::redis as redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis_support::{RedisServer, Server};
use tollgate::backend::{BackendErrorKind, CircuitBreaker};
use tollgate::{Error, Limiter, MemoryBackend, OnFailure, Quota, QuotaSet, RedisBackend};

/// A set named "t": Redis refuses a set without a name, whose counters
/// could not be shared by a fleet.
fn set(quota: Quota) -> QuotaSet {
    QuotaSet::new("t", [quota]).unwrap()
}

const LONG: Duration = Duration::from_secs(3600);

/// Enough for every check of a load run, and each check's state lasts
/// seconds (3.6 s of the hour), long enough to be seen with redis-cli.
fn quota() -> Quota {
    Quota::gcra(1_000, LONG).build().unwrap()
}

#[tokio::test]
async fn script_flush_and_restart_keep_decisions_working() {
    let mut server = RedisServer::start();
    let backend = RedisBackend::from_url(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let limiter = Limiter::new(backend.clone(), set(Quota::gcra(3, LONG).build().unwrap()));

    assert!(limiter.check("k", 1).await.unwrap().allowed());
    // A fresh Redis did not know the script.
    assert_eq!(backend.stats().script_loads, 1);

    server.cli(&["SCRIPT", "FLUSH"]);
    let d = limiter.check("k", 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 1, "the state survived the flush");
    assert_eq!(backend.stats().script_loads, 2);

    server.restart();
    // Nothing was persisted: the restarted Redis starts from scratch.
    let d = limiter.check("k", 1).await.unwrap();
    assert!(d.allowed());
    assert_eq!(d.remaining(), 2);
    assert_eq!(backend.stats().script_loads, 3);
    assert_eq!(backend.stats().failures, 0, "{:?}", backend.stats());
}

/// What a load run saw.
#[derive(Default, Debug)]
struct Run {
    ok: u64,
    errors: Vec<BackendErrorKind>,
    slowest: Duration,
    /// Whether the last checks of the run were all answered without error.
    ends_well: bool,
}

/// Checks from `tasks` tasks until `stop`, measuring each.
async fn load(limiter: Limiter<RedisBackend>, tasks: usize, stop: Arc<AtomicBool>) -> Run {
    let mut handles = Vec::new();
    for t in 0..tasks {
        let limiter = limiter.clone();
        let stop = stop.clone();
        handles.push(tokio::spawn(async move {
            let mut run = Run::default();
            let mut last_ok = false;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let result = limiter.check(&format!("task{t}:{}", i % 8), 1).await;
                run.slowest = run.slowest.max(started.elapsed());
                match result {
                    Ok(_) => {
                        run.ok += 1;
                        last_ok = true;
                    }
                    Err(Error::Backend(e)) => {
                        run.errors.push(e.kind());
                        last_ok = false;
                    }
                    Err(e) => panic!("unexpected error: {e}"),
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            run.ends_well = last_ok;
            run
        }));
    }
    let mut total = Run {
        ends_well: true,
        ..Run::default()
    };
    for h in handles {
        let run = h.await.expect("a load task panicked");
        total.ok += run.ok;
        total.errors.extend(run.errors);
        total.slowest = total.slowest.max(run.slowest);
        total.ends_well &= run.ends_well;
    }
    total
}

fn backend(server: &RedisServer, on_failure: OnFailure) -> RedisBackend {
    RedisBackend::from_url(server.url())
        .timeout(Duration::from_millis(50))
        .circuit_breaker(CircuitBreaker {
            failures: 3,
            open_for: Duration::from_millis(200),
        })
        .on_failure(on_failure)
        .build()
        .unwrap()
}

/// Generous: the claim is "bounded by the timeout", not a speed; this
/// leaves room for a loaded two-core machine's scheduling.
const BOUND: Duration = Duration::from_millis(50 + 450);

/// Kills Redis 400 ms into a load, restarts it 1 s later, and lets the load
/// run 1.2 s more.
async fn kill_and_restart(server: &mut RedisServer, limiter: Limiter<RedisBackend>) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let run = tokio::spawn(load(limiter, 8, stop.clone()));
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.restart();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    stop.store(true, Ordering::Relaxed);
    run.await.expect("the load panicked")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_then_restarted_with_errors_returned() {
    let mut server = RedisServer::start();
    let backend = backend(&server, OnFailure::Error);
    let limiter = Limiter::new(backend.clone(), set(quota()));
    let run = kill_and_restart(&mut server, limiter.clone()).await;
    let stats = backend.stats();
    eprintln!(
        "ok {}, errors {}, slowest {:?}, {stats:?}",
        run.ok,
        run.errors.len(),
        run.slowest
    );

    assert!(run.ok > 0 && !run.errors.is_empty(), "{run:?}");
    assert!(
        run.errors
            .iter()
            .all(|k| matches!(k, BackendErrorKind::Timeout | BackendErrorKind::Unavailable)),
        "{run:?}"
    );
    assert!(run.slowest <= BOUND, "a check took {:?}", run.slowest);
    // The breaker spared Redis most of the outage's calls.
    assert!(stats.short_circuits > 0, "{stats:?}");
    assert!(stats.short_circuits > stats.failures, "{stats:?}");
    // Back to Redis: the breaker closed and the state is in the new Redis.
    assert!(run.ends_well, "{run:?}");
    assert!(!stats.circuit_open, "{stats:?}");
    assert!(limiter.check("after", 1).await.unwrap().allowed());
    let key = &backend.redis_keys("after", limiter.quotas())[0];
    assert_eq!(server.cli(&["EXISTS", key]), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_then_restarted_with_a_local_fallback() {
    let mut server = RedisServer::start();
    let backend = backend(&server, OnFailure::Fallback(MemoryBackend::new()));
    let limiter = Limiter::new(backend.clone(), set(quota()));
    let run = kill_and_restart(&mut server, limiter.clone()).await;
    let stats = backend.stats();
    eprintln!("ok {}, slowest {:?}, {stats:?}", run.ok, run.slowest);

    assert!(run.errors.is_empty(), "the fallback decides: {run:?}");
    assert!(run.slowest <= BOUND, "a check took {:?}", run.slowest);
    assert!(stats.fallbacks > 0 && stats.short_circuits > 0, "{stats:?}");
    assert!(!stats.circuit_open, "{stats:?}");
    let calls = stats.calls;
    assert!(limiter.check("after", 1).await.unwrap().allowed());
    assert_eq!(backend.stats().calls, calls + 1, "decided by Redis again");
    let key = &backend.redis_keys("after", limiter.quotas())[0];
    assert_eq!(server.cli(&["EXISTS", key]), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_costs_each_check_at_most_the_timeout() {
    let server = RedisServer::start();
    let backend = backend(&server, OnFailure::Error);
    let limiter = Limiter::new(backend.clone(), set(quota()));
    assert!(limiter.check("k", 1).await.unwrap().allowed());

    server.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let paused = Instant::now();
    let mut kinds = Vec::new();
    while paused.elapsed() < Duration::from_millis(1000) {
        let started = Instant::now();
        let result = limiter.check("k", 1).await;
        let took = started.elapsed();
        assert!(took <= BOUND, "a check took {took:?}");
        kinds.push(result.map(|_| ()).map_err(|e| match e {
            Error::Backend(e) => e.kind(),
            e => panic!("unexpected error: {e}"),
        }));
    }
    assert!(kinds.contains(&Err(BackendErrorKind::Timeout)), "{kinds:?}");
    assert!(
        kinds.contains(&Err(BackendErrorKind::Unavailable)),
        "{kinds:?}"
    );

    // Once the pause is over, a probe gets through and the breaker closes.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while limiter.check("k", 1).await.is_err() {
        assert!(Instant::now() < deadline, "{:?}", backend.stats());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!backend.stats().circuit_open);
}

/// The harness itself: a server whose port another process took between
/// the port's choice and the bind starts on another port, and the harness
/// talks to it, not to whoever holds the first port.
#[test]
fn a_test_server_whose_port_was_taken_starts_on_another() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let first = AtomicBool::new(true);
    let server = RedisServer::start_with(Vec::new(), || {
        if first.swap(false, Ordering::Relaxed) {
            port
        } else {
            redis_support::free_port(None)
        }
    });
    assert_ne!(server.port(), port);
    assert_eq!(server.cli(&["PING"]), "PONG");
}

/// Log lines written by the test's thread, kept for reading.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A Redis whose ACL refuses `EVALSHA`: every check fails with kind
/// `Misconfigured`, counted in the stats and under its own metric label,
/// and one ERROR line says so however many checks fail (the next only
/// after the log interval), with the password nowhere in it.
#[tokio::test]
async fn a_redis_refusing_the_scripts_is_logged_once_as_an_error_and_counted_apart() {
    let server = RedisServer::start();
    let password = "s3cret-passw0rd";
    let set = ["ACL", "SETUSER", "limited", "on", &format!(">{password}")];
    assert_eq!(
        server.cli(&[&set[..], &["~*", "+@all", "-evalsha"]].concat()),
        "OK"
    );
    let url = format!("redis://limited:{password}@127.0.0.1:{}", server.port());
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let backend = metrics::with_local_recorder(&recorder, || {
        RedisBackend::from_url(&url)
            .timeout(Duration::from_secs(2))
            // Closed throughout: every check reaches Redis.
            .circuit_breaker(CircuitBreaker {
                failures: 100,
                open_for: Duration::from_secs(1),
            })
            .build()
            .unwrap()
    });
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);

    let limiter = Limiter::new(
        backend.clone(),
        QuotaSet::new("refused", [quota()]).unwrap(),
    );
    for i in 0..5 {
        match limiter.check(&format!("k{i}"), 1).await {
            Err(Error::Backend(e)) => assert_eq!(e.kind(), BackendErrorKind::Misconfigured),
            other => panic!("expected a misconfiguration, got {other:?}"),
        }
    }
    let stats = backend.stats();
    assert_eq!((stats.failures, stats.misconfigured), (5, 5), "{stats:?}");
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "{text}");
    assert!(
        errors[0].contains("Redis refuses the rate-limit scripts"),
        "{text}"
    );
    assert!(errors[0].contains("+evalsha"), "says what to grant: {text}");
    assert!(!text.contains(password), "{text}");
    let rendered = recorder.handle().render();
    for (kind, n) in [("misconfigured", 5), ("unavailable", 0), ("protocol", 0)] {
        let series = format!("tollgate_redis_failures_total{{kind=\"{kind}\"}} {n}");
        assert!(rendered.contains(&series), "{series} in {rendered}");
    }
}

/// The concurrency slots and the outbound pacer share one way of calling
/// Redis: on every server, a paused Redis answers each of them with a
/// timeout within it, and once the pause is over the same store serves
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_times_out_the_slots_and_the_pacer_and_they_recover() {
    use tollgate::backend::{Acquired, RedisSlots, SlotStore};
    use tollgate::outbound::{Pacer, RedisPace, WaitError};
    for kind in Server::ALL {
        kind.check_version();
        let server =
            RedisServer::start_on(kind, Vec::new(), None, || redis_support::free_port(None));
        let timeout = Duration::from_millis(150);
        let slots = RedisSlots::from_url(&server.url(), "tollgate:slots:")
            .unwrap()
            .timeout(timeout);
        let quota = Quota::gcra(1_000, Duration::from_secs(1)).build().unwrap();
        let pacer = Pacer::new(
            RedisPace::from_url(&server.url(), "tollgate:pace:")
                .unwrap()
                .timeout(timeout),
            &quota,
        );
        let granted = |a: Acquired| matches!(a, Acquired::Granted { .. });
        assert!(granted(slots.acquire("k", 10).await.unwrap()), "{kind:?}");
        pacer.acquire("k", 1).await.unwrap();

        server.cli(&["CLIENT", "PAUSE", "1000", "ALL"]);
        let started = Instant::now();
        let e = slots.acquire("k", 10).await.map(drop).unwrap_err();
        assert_eq!(e.kind(), BackendErrorKind::Timeout, "{kind:?}: {e}");
        match pacer.acquire("k", 1).await {
            Err(WaitError::Store(e)) => {
                assert_eq!(e.kind(), BackendErrorKind::Timeout, "{kind:?}: {e}")
            }
            other => panic!(
                "{kind:?}: the pacer must time out, got {:?}",
                other.map(drop)
            ),
        }
        assert!(
            started.elapsed() < 4 * timeout,
            "{kind:?}: {:?}",
            started.elapsed()
        );

        let deadline = Instant::now() + Duration::from_secs(5);
        while !slots.acquire("k", 10).await.is_ok_and(granted) {
            assert!(
                Instant::now() < deadline,
                "{kind:?}: the slots never came back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while pacer.acquire("k", 1).await.is_err() {
            assert!(
                Instant::now() < deadline,
                "{kind:?}: the pacer never came back"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Slots made on a backend share its connection: one connection serves
/// both; a paused Redis times out the slots and the checks within their
/// timeouts, and once it is over both serve again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_on_a_backend_share_its_connection_time_out_and_recover() {
    use tollgate::backend::{Acquired, RedisSlots, SlotStore};
    let server = RedisServer::start();
    // Connections Redis took so far (this `redis-cli` call's included).
    let connections = || {
        let stats = server.cli(&["INFO", "stats"]);
        (stats.lines())
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap()
    };
    let timeout = Duration::from_millis(150);
    let backend = RedisBackend::from_url(server.url())
        .timeout(timeout)
        .build()
        .unwrap();
    let limiter = Limiter::new(backend.clone(), set(quota()));
    let slots = RedisSlots::on(&backend, "tollgate:slots:").timeout(timeout);
    let granted = |a: Acquired| matches!(a, Acquired::Granted { .. });
    let before = connections();
    assert!(granted(slots.acquire("k", 10).await.unwrap()));
    assert!(limiter.check("k", 1).await.unwrap().allowed());
    assert!(granted(slots.acquire("k", 10).await.unwrap()));
    // One for both, and the count's own `redis-cli`.
    assert_eq!(connections() - before, 2);

    server.cli(&["CLIENT", "PAUSE", "1000", "ALL"]);
    let started = Instant::now();
    let e = slots.acquire("k", 10).await.map(drop).unwrap_err();
    assert_eq!(e.kind(), BackendErrorKind::Timeout, "{e}");
    match limiter.check("k", 1).await {
        Err(Error::Backend(e)) => assert_eq!(e.kind(), BackendErrorKind::Timeout, "{e}"),
        other => panic!("the check must time out, got {other:?}"),
    }
    assert!(started.elapsed() < 4 * timeout, "{:?}", started.elapsed());

    let deadline = Instant::now() + Duration::from_secs(5);
    while !slots.acquire("k", 10).await.is_ok_and(granted) {
        assert!(Instant::now() < deadline, "the slots never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while !limiter.check("k", 1).await.is_ok_and(|d| d.allowed()) {
        assert!(Instant::now() < deadline, "the checks never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
