//! Outbound limits against real servers: a provider on a TCP port that
//! enforces its rate (429 with `Retry-After` beyond it) and records every
//! arrival; consumer processes sharing one real Redis; the order and cost
//! of waiting in one process.
//!
//! The bound proven for a fleet: slots come from one schedule on Redis's
//! clock, `1/r` apart with a burst of 1, and each process sleeps until the
//! slot on its own clock at the smallest offset it has seen between Redis's
//! time and a reply's arrival (the clocks' offset plus the quickest reply),
//! so a clock skew between processes is measured away, not added. What
//! reaches the provider in any window of one second is then at most
//! `ceil((1 s + J) * r)`, where `J` is the spread of the delay between a
//! slot and its arrival: the quickest replies' difference between
//! processes, a timer's wake, the request's trip, and the drift of the
//! clocks over the 10 s a smallest offset is kept (microseconds). The tests
//! pace at `r = 0.94 R`, which stays within `R` for any `J` under 63 ms;
//! a caller woken more than 20 ms after its slot takes a new turn
//! ([`Pacer::late_after`]), which bounds what a busy machine adds to `J`.

#![cfg(feature = "redis")]

use crate::support::redis as redis_support;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redis_support::RedisServer;
use tollgate::Quota;
use tollgate::outbound::{
    Adapt, DestinationHost, MemoryPace, OutboundLayer, Pacer, RedisPace, Signal, WaitError,
};
use tower::{ServiceBuilder, ServiceExt};

/// The provider: admits `limit` requests in any one second (a sliding
/// log), answers 429 with `Retry-After: 1` beyond, and records every
/// arrival with whether it was admitted.
#[derive(Default)]
struct Provider {
    limit: AtomicU64,
    state: Mutex<(VecDeque<Instant>, Vec<Arrival>)>,
}

/// When a request arrived, and whether it was admitted.
type Arrival = (Instant, bool);

impl Provider {
    fn answer(&self) -> Response<Full<Bytes>> {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap();
        let (log, arrivals) = &mut *state;
        while log
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            log.pop_front();
        }
        let admitted = (log.len() as u64) < self.limit.load(Ordering::SeqCst);
        arrivals.push((now, admitted));
        if admitted {
            log.push_back(now);
            return Response::new(Full::new(Bytes::from_static(b"ok")));
        }
        Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("retry-after", "1")
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    fn arrivals(&self) -> Vec<Arrival> {
        self.state.lock().unwrap().1.clone()
    }
}

async fn start_provider(limit: u64) -> (Arc<Provider>, SocketAddr) {
    let provider = Arc::new(Provider::default());
    provider.limit.store(limit, Ordering::SeqCst);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let p = Arc::clone(&provider);
    // `/warmup` is neither limited nor recorded: the consumers open their
    // connections there first (see `consumer_process`).
    let app = axum::Router::new()
        .route("/warmup", axum::routing::get(|| async { "" }))
        .fallback(move || {
            let p = Arc::clone(&p);
            async move { p.answer() }
        });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (provider, addr)
}

/// The most arrivals in any window of one second, among `times`, and
/// when that window began (from the first arrival).
fn most_in_a_second(times: &[Instant]) -> (usize, Duration) {
    let (mut most, mut at) = (0, Duration::ZERO);
    let mut start = 0;
    for (end, t) in times.iter().enumerate() {
        while t.duration_since(times[start]) >= Duration::from_secs(1) {
            start += 1;
        }
        if end + 1 - start > most {
            most = end + 1 - start;
            at = times[start].duration_since(times[0]);
        }
    }
    (most, at)
}

const WORKERS: usize = 16;

/// The two fleet tests run one at a time: six consumer processes at once
/// on a small machine would measure its load, not the schedule.
static FLEETS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const PROCESSES: usize = 3;

/// The child side of the fleet tests: one consumer process, run as this
/// test binary with `OUTBOUND_CHILD` set (a no-op otherwise). Its
/// `WORKERS` workers call the provider through the outbound layer on a
/// shared Redis schedule for `OUTBOUND_SECONDS`, then it prints how many
/// requests it sent.
#[test]
fn consumer_process() {
    let Ok(spec) = std::env::var("OUTBOUND_CHILD") else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let [url, redis, prefix, rate, seconds] = parts[..] else {
        panic!("OUTBOUND_CHILD: url redis prefix rate seconds");
    };
    let rate: u64 = rate.parse().unwrap();
    let seconds: u64 = seconds.parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sent = runtime.block_on(async {
        // Generous: two cores shared by many test processes.
        let store = RedisPace::from_url(redis, prefix)
            .unwrap()
            .timeout(Duration::from_secs(2));
        let quota = Quota::gcra(rate, Duration::from_secs(1))
            .burst(1)
            .build()
            .unwrap();
        let pacer = Pacer::new(store, &quota)
            .max_wait(Duration::from_secs(5))
            .adapt(Adapt::aimd(1, Duration::from_secs(1)).decrease(0.5));
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        // Connections opened before the run, one a worker, and the script
        // loaded: a TCP handshake under load delays a request by more than
        // the pacing can know of, and the first second would measure that
        // rather than the schedule.
        let warmups: Vec<_> = (0..WORKERS)
            .map(|_| {
                let request = Request::get(format!("{url}warmup"))
                    .body(Empty::new())
                    .unwrap();
                let client = client.clone();
                tokio::spawn(async move {
                    let response = client.request(request).await.unwrap();
                    let _ = response.into_body().collect().await;
                })
            })
            .collect();
        for w in warmups {
            w.await.unwrap();
        }
        pacer.acquire("warmup", 1).await.unwrap();
        let client = ServiceBuilder::new()
            .layer(OutboundLayer::new(pacer, DestinationHost))
            .service(client);
        let until = tokio::time::Instant::now() + Duration::from_secs(seconds);
        let mut workers = Vec::new();
        for _ in 0..WORKERS {
            let client = client.clone();
            let url = url.to_owned();
            workers.push(tokio::spawn(async move {
                let mut sent = 0u64;
                while tokio::time::Instant::now() < until {
                    let request = Request::get(&url).body(Empty::new()).unwrap();
                    match client.clone().oneshot(request).await {
                        Ok(response) => {
                            let _ = response.into_body().collect().await;
                            sent += 1;
                        }
                        Err(e) => {
                            eprintln!("not sent: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
                sent
            }));
        }
        let mut sent = 0;
        for w in workers {
            sent += w.await.unwrap();
        }
        sent
    });
    println!("OUTBOUND_SENT {sent}");
}

/// Runs `PROCESSES` consumers at `rate` for `seconds` on one Redis
/// schedule, all calling `addr`.
fn consumers(
    addr: SocketAddr,
    redis: &RedisServer,
    prefix: &str,
    rate: u64,
    seconds: u64,
) -> Vec<std::process::Child> {
    let exe = std::env::current_exe().unwrap();
    (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "outbound::consumer_process",
                    "--exact",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env(
                    "OUTBOUND_CHILD",
                    format!("http://{addr}/ {} {prefix} {rate} {seconds}", redis.url()),
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

fn wait_all(children: Vec<std::process::Child>) -> u64 {
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "a consumer failed: {text}");
            text.lines()
                .find_map(|l| l.split("OUTBOUND_SENT ").nth(1))
                .and_then(|n| n.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no count from a consumer: {text}"))
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_three_stays_under_the_providers_rate_and_uses_it() {
    const R: u64 = 50;
    const SECONDS: u64 = 6;
    let _alone = FLEETS.lock().await;
    let redis = RedisServer::start();
    let (provider, addr) = start_provider(R).await;
    let rate = R * 94 / 100;
    let children = consumers(addr, &redis, "fleet:", rate, SECONDS);
    let sent = tokio::task::spawn_blocking(move || wait_all(children))
        .await
        .unwrap();
    let arrivals = provider.arrivals();
    let times: Vec<Instant> = arrivals.iter().map(|a| a.0).collect();
    let refused = arrivals.iter().filter(|a| !a.1).count();
    let (most, at) = most_in_a_second(&times);
    let span = times.last().unwrap().duration_since(times[0]).as_secs_f64();
    let average = times.len() as f64 / span;
    println!(
        "fleet: {} arrivals ({sent} sent) over {span:.2} s: {average:.1}/s, at most {most} in a second (from {at:?}), {refused} refused (R = {R})",
        times.len()
    );
    assert_eq!(refused, 0, "the provider answered 429");
    assert!(most as u64 <= R, "{most} arrivals in one second, over {R}");
    assert!(average >= 0.9 * R as f64, "{average:.1}/s is under 0.9 R");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_provider_halves_its_rate_the_fleet_follows_within_one_retry_after() {
    const R: u64 = 60;
    const SECONDS: u64 = 8;
    let _alone = FLEETS.lock().await;
    let redis = RedisServer::start();
    let (provider, addr) = start_provider(R).await;
    let children = consumers(addr, &redis, "halve:", R * 92 / 100, SECONDS);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Said only through 429 + Retry-After.
    provider.limit.store(R / 2, Ordering::SeqCst);
    let halved = Instant::now();
    tokio::task::spawn_blocking(move || wait_all(children))
        .await
        .unwrap();
    let arrivals = provider.arrivals();
    let first_refusal = arrivals
        .iter()
        .find(|a| !a.1)
        .map(|a| a.0)
        .expect("the provider refused something once it halved");
    let retry_after = Duration::from_secs(1);
    let converged = first_refusal + retry_after;
    let late_refusals = arrivals.iter().filter(|a| !a.1 && a.0 > converged).count();
    let after: Vec<Instant> = arrivals
        .iter()
        .map(|a| a.0)
        .filter(|t| *t > converged)
        .collect();
    let (most, _) = most_in_a_second(&after);
    let refused = arrivals.iter().filter(|a| !a.1).count();
    println!(
        "halved: first 429 {:?} after the cut, {refused} refused in all, {late_refusals} after one Retry-After, then at most {most} in a second (R/2 = {})",
        first_refusal.duration_since(halved),
        R / 2
    );
    assert_eq!(late_refusals, 0, "429s after one Retry-After");
    assert!(
        most as u64 <= R / 2,
        "{most} in one second after converging"
    );
    assert!(after.len() as u64 >= R / 4, "the fleet stopped sending");
}

/// 1 000 waiters on one key, in one process, go in the order they asked;
/// one whose longest wait is too short is refused at once. Tokio's clock
/// is paused, so each waiter's timer fires at its own millisecond.
#[tokio::test(start_paused = true)]
async fn a_thousand_waiters_go_in_arrival_order() {
    let quota = Quota::gcra(1000, Duration::from_secs(1))
        .burst(1)
        .build()
        .unwrap();
    let pacer = Pacer::new(MemoryPace::new(), &quota).max_wait(Duration::from_secs(5));
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..1000 {
        let (pacer, order) = (pacer.clone(), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            pacer.acquire("k", 1).await.unwrap();
            order.lock().unwrap().push(i);
        }));
        // Each asks before the next is made: arrival order is i's order.
        tokio::task::yield_now().await;
    }
    let asked = tokio::time::Instant::now();
    let refused = pacer
        .acquire_within("k", 1, Duration::from_millis(100))
        .await;
    assert_eq!(asked.elapsed(), Duration::ZERO, "refused after waiting");
    match refused {
        Err(WaitError::TooLong { would_wait }) => {
            assert!(would_wait >= Duration::from_millis(990), "{would_wait:?}")
        }
        other => panic!("not refused: {other:?}"),
    }
    for w in waiters {
        w.await.unwrap();
    }
    let order = order.lock().unwrap();
    assert_eq!(*order, (0..1000).collect::<Vec<_>>());
}

/// A waiter dropped before its turn gives its slot back, in memory and on
/// Redis: the next caller gets it.
#[tokio::test]
async fn a_dropped_waiter_gives_its_slot_back() {
    let redis = RedisServer::start();
    let quota = Quota::gcra(2, Duration::from_secs(1))
        .burst(1)
        .build()
        .unwrap();
    let memory = Pacer::new(MemoryPace::new(), &quota);
    let shared = Pacer::new(RedisPace::from_url(&redis.url(), "drop:").unwrap(), &quota);
    async fn check<S: tollgate::outbound::PaceStore>(pacer: Pacer<S>) {
        pacer.acquire("k", 1).await.unwrap(); // now
        // The next slot is 500 ms away: give up after 50 ms.
        let gave_up = tokio::time::timeout(Duration::from_millis(50), pacer.acquire("k", 1)).await;
        assert!(gave_up.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await; // the give-back runs
        let next = pacer.acquire("k", 1).await.unwrap();
        // Its slot was the one given up (500 ms after the first), not the
        // one after it (1 s).
        assert!(
            next.waited() < Duration::from_millis(600),
            "{:?}",
            next.waited()
        );
    }
    check(memory).await;
    check(shared).await;
}

/// A 429's pause reaches every process of a fleet through Redis: another
/// pacer on the same schedule waits it out.
#[tokio::test]
async fn a_pause_is_shared_by_the_fleet() {
    let redis = RedisServer::start();
    let quota = Quota::gcra(100, Duration::from_secs(1)).build().unwrap();
    let a = Pacer::new(RedisPace::from_url(&redis.url(), "pause:").unwrap(), &quota);
    let b = Pacer::new(RedisPace::from_url(&redis.url(), "pause:").unwrap(), &quota);
    let turn = a.acquire("api", 1).await.unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("retry-after", "1".parse().unwrap());
    let signal = Signal::from_http(
        StatusCode::TOO_MANY_REQUESTS,
        &headers,
        std::time::SystemTime::now(),
    );
    a.obey("api", &turn, &signal).await.unwrap();
    let started = Instant::now();
    b.acquire("api", 1).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "{:?}",
        started.elapsed()
    );
}

/// CPU time of the calling thread, from /proc (user + system, in ticks).
fn thread_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // The fields after the command's closing parenthesis; utime and stime
    // are the 12th and 13th of them.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// 1 000 waiters asleep for most of a second cost their thread almost no
/// CPU: each sleeps on one timer, nothing polls. The runtime has one
/// thread, measured alone (other tests run on other threads).
#[test]
fn waiting_costs_no_cpu_while_asleep() {
    let ticks_per_second = 100; // USER_HZ on Linux
    let measured = std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let quota = Quota::gcra(1000, Duration::from_secs(1))
                .burst(1)
                .build()
                .unwrap();
            let pacer = Pacer::new(MemoryPace::new(), &quota);
            let turn = pacer.acquire("k", 1).await.unwrap();
            let mut headers = http::HeaderMap::new();
            headers.insert("retry-after", "1".parse().unwrap());
            let signal = Signal::from_http(
                StatusCode::TOO_MANY_REQUESTS,
                &headers,
                std::time::SystemTime::now(),
            );
            pacer.obey("k", &turn, &signal).await.unwrap();
            let mut waiters = Vec::new();
            for _ in 0..1000 {
                let pacer = pacer.clone();
                waiters.push(tokio::spawn(
                    async move { pacer.acquire("k", 1).await.unwrap() },
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let before = thread_cpu_ticks();
            tokio::time::sleep(Duration::from_millis(800)).await;
            let spent = thread_cpu_ticks() - before;
            for w in waiters {
                w.await.unwrap();
            }
            spent
        })
    })
    .join()
    .unwrap();
    let ms = measured * 1000 / ticks_per_second;
    println!("1 000 waiters asleep for 800 ms cost their thread {ms} ms of CPU");
    // A polling loop would spend the whole 800 ms; a tick is 10 ms.
    assert!(ms <= 100, "{ms} ms of CPU while asleep");
}

/// Memory and Redis schedule alike: the same burst, the same refusal with
/// the same time to wait, the same pause.
#[tokio::test]
async fn memory_and_redis_schedule_alike() {
    let redis = RedisServer::start();
    let quota = Quota::gcra(10, Duration::from_secs(1))
        .burst(2)
        .build()
        .unwrap();
    async fn steps<S: tollgate::outbound::PaceStore>(pacer: Pacer<S>) -> [Duration; 2] {
        let now = Duration::ZERO;
        let first = pacer.acquire_within("k", 1, now).await.unwrap();
        pacer.acquire_within("k", 1, now).await.unwrap();
        let Err(WaitError::TooLong { would_wait: third }) = pacer.acquire_within("k", 1, now).await
        else {
            panic!("the third went within the burst of 2");
        };
        let mut headers = http::HeaderMap::new();
        headers.insert("ratelimit", "\"p\";r=0;t=1".parse().unwrap());
        let signal = Signal::from_http(StatusCode::OK, &headers, std::time::SystemTime::now());
        pacer.obey("k", &first, &signal).await.unwrap();
        let Err(WaitError::TooLong { would_wait: paused }) =
            pacer.acquire_within("k", 1, now).await
        else {
            panic!("went during the pause");
        };
        [third, paused]
    }
    let memory = steps(Pacer::new(MemoryPace::new(), &quota)).await;
    let shared = steps(Pacer::new(
        RedisPace::from_url(&redis.url(), "alike:").unwrap(),
        &quota,
    ))
    .await;
    for [third, paused] in [memory, shared] {
        // 100 ms to the next unit, less the time the calls took.
        assert!(
            third > Duration::from_millis(50) && third <= Duration::from_millis(100),
            "{third:?}"
        );
        // The pause of 1 s, then one interval.
        assert!(
            paused > Duration::from_millis(1050) && paused <= Duration::from_millis(1100),
            "{paused:?}"
        );
    }
}
