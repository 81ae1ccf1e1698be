//! A Redis that refuses the scripts, and one that lies.
//!
//! Refusals, on real servers: an ACL user without `EVALSHA`, `EVALSHA`
//! renamed away, a Redis full under `noeviction`, a Valkey without its Lua
//! engine. Each: the probe refuses and says what to fix, a check meets an
//! error of kind `Misconfigured` and counts it, and the gateway refuses to
//! start. A user with exactly the ACL the README gives works.
//!
//! Lies: a tiny server speaking RESP answers every script call with
//! numbers no quota allows (a delay of 2^62 µs, a retry-after of 2^53 µs).
//! A real Redis cannot be made to: `EVALSHA` runs the script whose SHA1 it
//! names, and the script cannot be swapped under the same SHA1. The fake
//! stands for a hostile server (or a proxy in between); it is the reply
//! that is fake, not Redis's behaviour under test.

#![cfg(feature = "redis")]

use crate::support::redis as redis_support;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis_support::{RedisServer, Server};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tollgate::backend::{Acquired, BackendErrorKind, RedisSlots, SlotStore};
use tollgate::{Error, Limiter, OnFailure, Quota, RedisBackend};

/// What the README's Redis section says to grant (keys: the prefix).
const ACL: &str = "+evalsha +eval +script|load +time +get +set +del +hmget +hset +pexpire \
                   +zadd +zcard +zcount +zrange +zrem +zremrangebyrank +zremrangebyscore";

fn backend(url: &str) -> RedisBackend {
    RedisBackend::from_url(url)
        .timeout(Duration::from_secs(2))
        .on_failure(OnFailure::Error)
        .build()
        .unwrap()
}

/// Every algorithm, so that every command of the script runs.
fn limiter(backend: &RedisBackend) -> Limiter<RedisBackend> {
    let minute = Duration::from_secs(60);
    let quotas = tollgate::QuotaSet::new(
        "all",
        [
            Quota::token_bucket(5, minute).name("tb").build().unwrap(),
            Quota::leaky_bucket(5, minute).name("lb").build().unwrap(),
            Quota::gcra(5, minute).name("gcra").build().unwrap(),
            Quota::fixed_window(5, minute).name("fw").build().unwrap(),
            Quota::sliding_window(5, minute).name("sw").build().unwrap(),
            Quota::sliding_log(5, minute).name("sl").build().unwrap(),
        ],
    )
    .unwrap();
    Limiter::new(backend.clone(), quotas)
}

/// The probe refuses with kind `Misconfigured` and a message holding
/// `says`; a check then fails with the same kind, counted in the stats.
async fn refused(url: &str, says: &str) {
    let backend = backend(url);
    let e = backend.probe().await.expect_err("the probe must refuse");
    assert_eq!(e.kind(), BackendErrorKind::Misconfigured, "{e}");
    assert!(e.to_string().contains(says), "wanted {says:?}: {e}");
    // A key of its own: an admission writes, a refusal may not.
    match limiter(&backend).check(url, 1).await {
        Err(Error::Backend(e)) => assert_eq!(e.kind(), BackendErrorKind::Misconfigured, "{e}"),
        other => panic!("expected a misconfiguration, got {other:?}"),
    }
    let stats = backend.stats();
    assert_eq!((stats.failures, stats.misconfigured), (1, 1), "{stats:?}");
}

/// `tollgate check` with the backend at `url` exits with a failure that
/// says `says`.
fn gateway_refuses(url: &str, says: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config", "examples/rules.yaml", "--redis", url])
        .output()
        .expect("run tollgate check");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(says), "wanted {says:?}: {stderr}");
}

/// `tollgate rls` on `url` exits at start, its error naming `says`: a
/// service left running would answer every call by its failure policy.
fn rls_refuses(url: &str, says: &str) {
    let dir = std::env::temp_dir().join(format!("tollgate-rls-refuses-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("d.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["rls", "--listen", "127.0.0.1:0", "--redis", url, "--config"])
        .arg(&dir)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run tollgate rls");
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("tollgate rls kept serving on a Redis that refuses the scripts");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains(says), "wanted {says:?}: {stderr}");
    assert!(!stderr.contains("pw@"), "{stderr}");
}

fn acl_user(server: &RedisServer, name: &str, rules: &str) -> String {
    let mut args = vec!["ACL", "SETUSER", name, "reset", "on", ">pw", "~tollgate:*"];
    args.extend(rules.split_whitespace());
    assert_eq!(server.cli(&args), "OK");
    format!("redis://{name}:pw@127.0.0.1:{}", server.port())
}

#[tokio::test]
async fn a_user_with_the_documented_acl_works_and_one_without_evalsha_is_refused() {
    let server = RedisServer::start();
    let url = acl_user(&server, "tollgate", ACL);
    let backend = backend(&url);
    backend.probe().await.expect("the documented ACL is enough");
    let limiter = limiter(&backend);
    for i in 0..7 {
        let d = limiter.check("k", 1).await.expect("a decision");
        assert_eq!(d.allowed(), i < 5, "check {i}");
    }
    // Concurrency slots, through their own script.
    let slots = RedisSlots::from_url(&url, "tollgate:slots:")
        .unwrap()
        .timeout(Duration::from_secs(2));
    let acquired = slots.acquire("k", 1).await.expect("a slot");
    assert!(matches!(acquired, Acquired::Granted { in_use: 1, .. }));
    assert_eq!(backend.stats().failures, 0);

    let without = acl_user(&server, "no-evalsha", &ACL.replace("+evalsha", ""));
    refused(&without, "ACL SETUSER <user> ~<prefix>* +evalsha").await;
    gateway_refuses(&without, "+evalsha");
    rls_refuses(&without, "+evalsha");
    // A command the script sends, refused inside it.
    let without_hset = acl_user(&server, "no-hset", &ACL.replace("+hset", ""));
    refused(&without_hset, "+hset").await;
    // The password stays out of what is said.
    let e = backend_error(&without).await;
    assert!(!e.contains("pw@"), "{e}");
}

/// A command the script sends, refused inside it, found by the probe on
/// every server of the matrix (each words it its own way), and named
/// where the server names it.
#[tokio::test]
async fn a_command_refused_inside_the_script_is_named_on_every_server() {
    for server in Server::ALL {
        server.check_version();
        let redis =
            RedisServer::start_on(server, Vec::new(), None, || redis_support::free_port(None));
        let url = acl_user(&redis, "no-hset", &ACL.replace("+hset", ""));
        let e = backend(&url)
            .probe()
            .await
            .expect_err("the probe must refuse");
        assert_eq!(e.kind(), BackendErrorKind::Misconfigured, "{server:?}: {e}");
        // Redis 7.0 does not say which command a script was refused.
        let says = match server {
            Server::Redis7 => "may not use a command the scripts send",
            _ => "may not use `HSET`",
        };
        assert!(e.to_string().contains(says), "{server:?}: {e}");
        let url = acl_user(&redis, "no-evalsha", &ACL.replace("+evalsha", ""));
        let e = backend(&url)
            .probe()
            .await
            .expect_err("the probe must refuse");
        assert!(
            e.to_string().contains("may not use `EVALSHA`"),
            "{server:?}: {e}"
        );
        // The slots and the pacer, whose scripts go through the backend's
        // connection code, are refused as loudly.
        slots_and_pacer_fail(&url, BackendErrorKind::Misconfigured, "EVALSHA").await;
    }
}

async fn backend_error(url: &str) -> String {
    backend(url).probe().await.unwrap_err().to_string()
}

#[tokio::test]
async fn evalsha_renamed_away_is_refused() {
    let server = RedisServer::with_config("rename-command EVALSHA \"\"\n");
    refused(&server.url(), "rename-command").await;
    gateway_refuses(&server.url(), "EVALSHA");
}

#[tokio::test]
async fn a_redis_full_under_noeviction_is_refused() {
    for kind in Server::ALL {
        kind.check_version();
        full_under_noeviction(kind).await;
    }
}

/// A server of `kind` filled to its `maxmemory` under `noeviction`: the
/// backend and the gateway refuse it, naming the setting; the slots still
/// keep their limit and the pacer fails loudly.
async fn full_under_noeviction(kind: Server) {
    let server = RedisServer::start_on(
        kind,
        ["--maxmemory", "1mb", "--maxmemory-policy", "noeviction"]
            .map(String::from)
            .to_vec(),
        None,
        || redis_support::free_port(None),
    );
    // Fill it: bounded, and the last writes must have been refused.
    let value = "x".repeat(1000);
    let mut filled = false;
    for batch in 0..50 {
        let lines: String = (0..100)
            .map(|i| format!("SET fill:{batch}:{i} {value}\n"))
            .collect();
        if server.cli_stdin(&lines).contains("OOM") {
            filled = true;
            break;
        }
    }
    assert!(filled, "{kind:?} never filled up");
    refused(&server.url(), "maxmemory-policy").await;
    gateway_refuses(&server.url(), "maxmemory");
    // A limit of one byte keeps it full: freeing the fill's connections
    // can bring it back under 1 MB for a while.
    assert_eq!(server.cli(&["CONFIG", "SET", "maxmemory", "1"]), "OK");
    // The slots' script writes first by removing expired slots, after
    // which Redis lets a script finish its writes: a slot is granted and
    // counted, so the limit still holds.
    let slots = RedisSlots::from_url(&server.url(), "tollgate:slots:").unwrap();
    let first = slots.acquire("api", 1).await;
    assert!(
        matches!(first, Ok(Acquired::Granted { in_use: 1, .. })),
        "{kind:?}: {:?}",
        first.map(drop)
    );
    let second = slots.acquire("api", 1).await;
    assert!(
        matches!(second, Ok(Acquired::Full { in_use: 1 })),
        "{kind:?}: {:?}",
        second.map(drop)
    );
    // The pacer's first write is refused: it fails loudly, naming the
    // setting, and gives no turn.
    use tollgate::outbound::{Pacer, RedisPace, WaitError};
    let quota = Quota::gcra(10, Duration::from_secs(1)).build().unwrap();
    let pace = RedisPace::from_url(&server.url(), "tollgate:pace:").unwrap();
    match Pacer::new(pace, &quota).acquire("api", 1).await {
        Err(WaitError::Store(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::Misconfigured, "{}", chain(&e));
            assert!(e.to_string().contains("maxmemory"), "{e}");
        }
        other => panic!("{kind:?}: the pacer must fail, got {:?}", other.map(drop)),
    }
}

/// `e` and its sources, joined.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// The concurrency slots and the outbound pacer at `url` each answer an
/// error of `kind` that says `says`: never a slot granted or a turn given.
async fn slots_and_pacer_fail(url: &str, kind: BackendErrorKind, says: &str) {
    use tollgate::outbound::{Pacer, RedisPace, WaitError};
    let slots = RedisSlots::from_url(url, "tollgate:slots:").unwrap();
    let e = slots.acquire("api", 1).await.map(drop).unwrap_err();
    assert_eq!(e.kind(), kind, "the slots: {}", chain(&e));
    assert!(chain(&e).contains(says), "the slots: {}", chain(&e));
    let quota = Quota::gcra(10, Duration::from_secs(1)).build().unwrap();
    let pacer = Pacer::new(RedisPace::from_url(url, "tollgate:pace:").unwrap(), &quota);
    match pacer.acquire("api", 1).await {
        Err(WaitError::Store(e)) => {
            assert_eq!(e.kind(), kind, "the pacer: {}", chain(&e));
            assert!(chain(&e).contains(says), "the pacer: {}", chain(&e));
        }
        other => panic!("{kind:?}: the pacer must fail, got {:?}", other.map(drop)),
    }
}

#[tokio::test]
async fn valkey_without_its_lua_engine_is_refused() {
    Server::Valkey9.check_version();
    let server = RedisServer::start_on(
        Server::Valkey9,
        ["--enable-module-command", "yes"]
            .map(String::from)
            .to_vec(),
        None,
        || redis_support::free_port(None),
    );
    assert_eq!(server.cli(&["MODULE", "UNLOAD", "lua"]), "OK");
    refused(&server.url(), "no Lua engine").await;
    slots_and_pacer_fail(&server.url(), BackendErrorKind::Misconfigured, "Lua").await;
}

/// A server that takes connections and then answers no script (a server
/// gone without a reset, its connection left open): the slots and the
/// pacer time out, and each call after a timeout takes a fresh connection
/// instead of waiting on the dead one for ever.
#[tokio::test]
async fn the_slots_and_the_pacer_leave_a_connection_that_never_answers() {
    use tollgate::outbound::{Pacer, RedisPace, WaitError};
    let (url, calls, accepted) = fake_redis(None).await;
    let timeout = Duration::from_millis(100);
    let slots = RedisSlots::from_url(&url, "tollgate:slots:")
        .unwrap()
        .timeout(timeout);
    for _ in 0..2 {
        let e = slots.acquire("api", 1).await.map(drop).unwrap_err();
        assert_eq!(e.kind(), BackendErrorKind::Timeout, "{e}");
    }
    assert_eq!(
        calls.load(Ordering::Relaxed),
        2,
        "the slots' calls were sent"
    );
    assert_eq!(accepted.load(Ordering::Relaxed), 2, "the slots");
    let quota = Quota::gcra(10, Duration::from_secs(1)).build().unwrap();
    let pace = RedisPace::from_url(&url, "tollgate:pace:")
        .unwrap()
        .timeout(timeout);
    let pacer = Pacer::new(pace, &quota);
    for _ in 0..2 {
        match pacer.acquire("api", 1).await {
            Err(WaitError::Store(e)) => assert_eq!(e.kind(), BackendErrorKind::Timeout, "{e}"),
            other => panic!("the pacer must time out, got {:?}", other.map(drop)),
        }
    }
    assert_eq!(
        calls.load(Ordering::Relaxed),
        4,
        "the pacer's calls were sent"
    );
    assert_eq!(accepted.load(Ordering::Relaxed), 4, "the pacer");
}

/// A server that answers `AUTH`, `CLIENT`, `PING` and the like with `+OK`,
/// and every `EVALSHA` or `EVAL` with `reply`; counts the script calls.
async fn liar(reply: Vec<i64>) -> (String, Arc<AtomicU64>) {
    let (url, calls, _) = fake_redis(Some(reply)).await;
    (url, calls)
}

/// [`liar`], whose script calls go unanswered without `reply`; counts the
/// script calls and the connections.
async fn fake_redis(reply: Option<Vec<i64>>) -> (String, Arc<AtomicU64>, Arc<AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let (calls, connections) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (counted, connected) = (calls.clone(), connections.clone());
    let answer = reply.map(|reply| {
        let mut answer = format!("*{}\r\n", reply.len());
        for n in &reply {
            answer.push_str(&format!(":{n}\r\n"));
        }
        answer
    });
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            connected.fetch_add(1, Ordering::Relaxed);
            let (answer, calls) = (answer.clone(), counted.clone());
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut read = BufReader::new(read);
                while let Some(command) = read_command(&mut read).await {
                    let out = if command.eq_ignore_ascii_case("EVALSHA")
                        || command.eq_ignore_ascii_case("EVAL")
                    {
                        calls.fetch_add(1, Ordering::Relaxed);
                        match &answer {
                            Some(answer) => answer.as_str(),
                            None => continue,
                        }
                    } else {
                        "+OK\r\n"
                    };
                    if write.write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, calls, connections)
}

/// Reads one RESP command (an array of bulk strings); returns its name.
async fn read_command<R: AsyncBufReadExt + Unpin>(read: &mut R) -> Option<String> {
    let mut line = String::new();
    read.read_line(&mut line).await.ok().filter(|&n| n > 0)?;
    let count: usize = line.trim().strip_prefix('*')?.parse().ok()?;
    let mut name = None;
    for _ in 0..count {
        line.clear();
        read.read_line(&mut line).await.ok()?;
        let len: usize = line.trim().strip_prefix('$')?.parse().ok()?;
        let mut bulk = vec![0; len + 2];
        read.read_exact(&mut bulk).await.ok()?;
        name.get_or_insert_with(|| String::from_utf8_lossy(&bulk[..len]).into_owned());
    }
    name
}

/// Redis's time in a reply: now, as TIME would say.
fn now_micros() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(now.as_micros()).unwrap()
}

#[tokio::test]
async fn a_delay_of_centuries_is_a_protocol_error_not_a_wait() {
    // Admitted, with a delay of 2^62 µs: the request would sleep 146,000
    // years before being forwarded.
    let (url, calls) = liar(vec![1, 4, 100_000, 0, 1 << 62, 0, 0, 1, now_micros(), 0]).await;
    let backend = backend(&url);
    let limiter = Limiter::new(
        backend.clone(),
        tollgate::QuotaSet::new(
            "liar",
            [Quota::leaky_bucket(10, Duration::from_secs(1))
                .build()
                .unwrap()],
        )
        .unwrap(),
    );
    let checked = tokio::time::timeout(Duration::from_secs(5), limiter.check("k", 1))
        .await
        .expect("the check answers at once");
    match checked {
        Err(Error::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::Protocol, "{e}");
            assert!(e.to_string().contains("delay"), "{e}");
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    let e = backend
        .probe()
        .await
        .expect_err("the probe reads replies alike");
    assert_eq!(e.kind(), BackendErrorKind::Protocol, "{e}");
}

#[tokio::test]
async fn a_retry_after_of_centuries_is_neither_served_nor_cached() {
    // Refused, to retry in 2^53 µs (`Retry-After: 9007199255`).
    let (url, calls) = liar(vec![0, 0, 1_000_000, 1 << 53, 0, 0, 0, 0, now_micros(), 0]).await;
    let backend = backend(&url);
    let limiter = Limiter::new(
        backend.clone(),
        tollgate::QuotaSet::new(
            "liar",
            [Quota::gcra(5, Duration::from_secs(1)).build().unwrap()],
        )
        .unwrap(),
    );
    for _ in 0..3 {
        match limiter.check("k", 1).await {
            Err(Error::Backend(e)) => assert_eq!(e.kind(), BackendErrorKind::Protocol, "{e}"),
            other => panic!("expected a protocol error, got {other:?}"),
        }
    }
    // Each check asked the server: nothing was cached from the lie.
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    assert_eq!(backend.stats().cache_hits, 0);
}

/// The outbound pacer shares the backend's reading of Redis's errors: on
/// every server it schedules for a user with every command, and a user
/// without `EVALSHA` is refused as a misconfiguration that names the
/// command, never as an unexplained failure.
#[tokio::test]
async fn the_outbound_pacer_and_the_slots_are_refused_loudly_on_every_server() {
    use tollgate::outbound::{Pacer, RedisPace, WaitError};
    let quota = Quota::gcra(10, Duration::from_secs(1)).build().unwrap();
    for server in Server::ALL {
        server.check_version();
        let redis =
            RedisServer::start_on(server, Vec::new(), None, || redis_support::free_port(None));
        let pacer = Pacer::new(
            RedisPace::from_url(&redis.url(), "tollgate:pace:").unwrap(),
            &quota,
        );
        pacer
            .acquire("api", 1)
            .await
            .unwrap_or_else(|e| panic!("{server:?}: {e}"));
        let url = acl_user(&redis, "no-evalsha", "+@all -evalsha -eval");
        let pacer = Pacer::new(RedisPace::from_url(&url, "tollgate:pace:").unwrap(), &quota);
        match pacer.acquire("api", 1).await {
            Err(WaitError::Store(e)) => {
                assert_eq!(e.kind(), BackendErrorKind::Misconfigured, "{server:?}: {e}");
                assert!(e.to_string().contains("EVAL"), "{server:?}: {e}");
                assert!(!e.to_string().contains("pw"), "{server:?}: {e}");
            }
            other => panic!(
                "{server:?}: the pacer must be refused, got {:?}",
                other.map(drop)
            ),
        }
        // The concurrency slots call Redis the same way: served by the
        // server, refused by name without the scripting commands.
        let slots = RedisSlots::from_url(&redis.url(), "tollgate:slots:").unwrap();
        let granted = slots.acquire("api", 1).await;
        assert!(
            matches!(granted, Ok(Acquired::Granted { in_use: 1, .. })),
            "{server:?}: {:?}",
            granted.map(drop)
        );
        let slots = RedisSlots::from_url(&url, "tollgate:slots:").unwrap();
        let e = slots.acquire("api", 1).await.map(drop).unwrap_err();
        assert_eq!(e.kind(), BackendErrorKind::Misconfigured, "{server:?}: {e}");
        assert!(!e.to_string().contains("pw"), "{server:?}: {e}");
    }
}
