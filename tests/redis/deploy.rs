//! Redis as production runs it: TLS with a private CA and client
//! certificates, AUTH, a Cluster named by a rules file or gateway flag, and
//! Sentinel through a real failover. Real servers on loopback throughout.
#![cfg(all(feature = "gateway", feature = "redis"))]

use crate::support;

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::gateway::{Gateway, RulesFile};
use support::process::wait_until;
use support::redis::deploy::{Certs, Cluster, Sentinel, Server};
use tollgate::rules::Rules;
use tollgate::{Limiter, Quota, QuotaSet, RedisBackend};

const HOUR: Duration = Duration::from_secs(3600);
const PASSWORD: &str = "S3cretPw";

fn quotas(limit: u64) -> QuotaSet {
    QuotaSet::new(
        "deploy",
        [Quota::fixed_window(limit, HOUR).name("w").build().unwrap()],
    )
    .unwrap()
}

/// An error and every source under it, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(" / ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// How many of `n` checks of `key` were admitted (every check decided).
async fn admitted(limiter: &Limiter<impl tollgate::backend::Backend>, key: &str, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        let d = limiter.check(key, 1).await.expect("a decision");
        admitted += u64::from(d.allowed());
    }
    admitted
}

fn tls_backend(port: u16) -> tollgate::backend::RedisBackendBuilder {
    RedisBackend::from_url(format!("rediss://127.0.0.1:{port}")).timeout(Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_decides_and_an_untrusted_ca_is_refused() {
    let certs = Certs::make();
    let (server, tls_port) = certs.server(false);
    let backend = tls_backend(tls_port)
        .tls_ca(certs.pem("ca.pem"))
        .build()
        .unwrap();
    let limiter = Limiter::new(backend, quotas(3));
    assert_eq!(admitted(&limiter, "k", 5).await, 3, "3 of 5 through TLS");
    // The count is in that server, reached through its TLS port.
    assert_eq!(server.cli(&["DBSIZE"]), "1");

    let untrusted = tls_backend(tls_port)
        .tls_ca(certs.pem("other-ca.pem"))
        .build()
        .unwrap();
    let e = Limiter::new(untrusted, quotas(3))
        .check("k", 1)
        .await
        .expect_err("a server signed by another CA is not trusted");
    let text = chain(&e);
    assert!(text.contains("certificate"), "{text}");

    // Without rediss:// the certificates would be ignored: refused.
    let plain = RedisBackend::from_url(server.url())
        .tls_ca(certs.pem("ca.pem"))
        .build()
        .expect_err("a CA for a redis:// URL");
    assert!(plain.to_string().contains("rediss://"), "{plain}");
    // A CA file with no certificate is refused when built.
    let empty = tls_backend(tls_port).tls_ca("not a PEM").build();
    assert!(empty.is_err(), "{empty:?}");
}

/// The statuses of four requests in turn to an app behind `rules`.
async fn four_through(rules: Rules) -> Vec<StatusCode> {
    let app = axum::Router::new()
        .fallback(|| async { "ok" })
        .layer(tollgate::RateLimitLayer::from_policy(rules));
    let addr = support::serve(app).await;
    let client = support::client();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(support::get(&client, addr, "/", &[]).await.status);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_from_a_rules_file_with_files_beside_it() {
    let certs = Certs::make();
    let (server, tls_port) = certs.server(true);
    // Without a client certificate the server refuses the handshake.
    let anonymous = tls_backend(tls_port)
        .tls_ca(certs.pem("ca.pem"))
        .build()
        .unwrap();
    let refused = Limiter::new(anonymous, quotas(3)).check("k", 1).await;
    assert!(refused.is_err(), "{refused:?}");

    // The rules file names the files relative to itself; its concurrency
    // slots go through the same TLS, and a failure would answer 503.
    let rules_path = certs.path("rules.yaml");
    std::fs::write(
        &rules_path,
        format!(
            "backend:\n  redis:\n    url: rediss://127.0.0.1:{tls_port}\n    timeout: 5s\n    tls: {{ ca_file: ca.pem, cert_file: client.pem, key_file: client.key }}\non_backend_error: reject\ntimeout: 5s\nrules:\n  - {{ name: r, key: peer_ip, concurrency: {{ limit: 2 }}, quotas: [{{ algorithm: fixed_window, limit: 3, period: 1h }}] }}\n"
        ),
    )
    .unwrap();
    let rules = Rules::load(&rules_path).unwrap();
    assert!(
        rules.describe().contains("client certificate: client.pem"),
        "{}",
        rules.describe()
    );
    let ok = StatusCode::OK;
    assert_eq!(
        four_through(rules).await,
        [ok, ok, ok, StatusCode::TOO_MANY_REQUESTS],
        "through mTLS"
    );
    // The slots' script ran there (the fixed window's uses no ZADD).
    let stats = server.cli(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_zadd"), "{stats}");

    let missing = std::fs::write(
        &rules_path,
        format!(
            "backend:\n  redis:\n    url: rediss://127.0.0.1:{tls_port}\n    tls: {{ cert_file: client.pem }}\nrules: []\n"
        ),
    );
    missing.unwrap();
    let e = Rules::load(&rules_path).expect_err("a certificate without its key");
    assert!(e.to_string().contains("key_file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_decides_and_a_wrong_password_is_a_clear_error_without_it() {
    let acl = "tg on >S3cretPw ~* &* +@all".split(' ').map(String::from);
    let mut args: Vec<String> = vec!["--user".into()];
    args.extend(acl);
    args.extend(["--requirepass".into(), PASSWORD.into()]);
    let server = Server::start("redis-server", &args, Some(PASSWORD), false);
    let url = |auth: &str| format!("redis://{auth}@127.0.0.1:{}", server.port);
    for auth in [format!("tg:{PASSWORD}"), format!(":{PASSWORD}")] {
        let backend = RedisBackend::from_url(url(&auth))
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let limiter = Limiter::new(backend, quotas(2));
        assert_eq!(admitted(&limiter, &auth, 3).await, 2, "{auth}");
    }
    let wrong = "WrongPw-77";
    let backend = RedisBackend::from_url(url(&format!("tg:{wrong}")))
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let e = Limiter::new(backend, quotas(2))
        .check("k", 1)
        .await
        .expect_err("a wrong password");
    let text = format!("{} {e:?}", chain(&e));
    assert!(
        text.contains("WRONGPASS") || text.to_lowercase().contains("auth"),
        "{text}"
    );
    assert!(!text.contains(wrong), "the password shows: {text}");
}

#[test]
fn a_rules_file_names_exactly_one_redis() {
    let rules = "rules: []\n";
    let error = |backend: &str| {
        Rules::parse(&format!("backend:\n  redis: {backend}\n{rules}"))
            .expect_err(backend)
            .to_string()
    };
    let both = error("{ url: redis://a:1, cluster: [redis://b:1] }");
    assert!(
        both.contains("only one of url, cluster and sentinel"),
        "{both}"
    );
    let none = error("{ prefix: x }");
    assert!(none.contains("needs where Redis is"), "{none}");
    let empty = error("{ cluster: [] }");
    assert!(empty.contains("at least one node"), "{empty}");
    let user = error("{ sentinel: { master: m, urls: [redis://s:1], username: u } }");
    assert!(user.contains("a username needs a password"), "{user}");
    let typo = error("{ url: redis://a:1, tls: { ca: x.pem } }");
    assert!(typo.contains("ca"), "{typo}");
    let no_master = error("{ sentinel: { master: \"\", urls: [redis://s:1] } }");
    assert!(no_master.contains("master's name"), "{no_master}");
    // A sentinel's password in the file never shows in check's output.
    let ok = Rules::parse(&format!(
        "backend:\n  redis: {{ sentinel: {{ master: m, urls: [\"redis://:{PASSWORD}@s:26379\"], password: {PASSWORD} }} }}\n{rules}"
    ))
    .unwrap();
    let described = ok.describe();
    assert!(
        described.contains("sentinel master \"m\" via redis://:***@s:26379"),
        "{described}"
    );
    assert!(!described.contains(PASSWORD), "{described}");
}

fn tollgate(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run tollgate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn check_and_errors_never_print_the_password() {
    const RULES: &str = "rules:\n  - { name: r, key: peer_ip, quotas: [{ algorithm: gcra, limit: 5, period: 1m }] }\n";
    let url = format!("redis://tg:{PASSWORD}@127.0.0.1:6379/0");
    let file = RulesFile::new(
        "deploy-secret",
        &format!("backend:\n  redis:\n    url: {url}\n{RULES}"),
    );
    let config = file.0.to_string_lossy().into_owned();
    let (ok, out) = tollgate(&["check", "--config", &config]);
    assert!(ok, "{out}");
    assert!(
        out.contains("redis at redis://tg:***@127.0.0.1:6379/0"),
        "{out}"
    );
    assert!(!out.contains(PASSWORD), "{out}");

    let nodes = format!("redis://:{PASSWORD}@127.0.0.1:7001");
    let (ok, out) = tollgate(&["check", "--config", &config, "--redis-cluster", &nodes]);
    assert!(ok, "{out}");
    assert!(
        out.contains("redis cluster at redis://:***@127.0.0.1:7001"),
        "{out}"
    );
    assert!(!out.contains(PASSWORD), "{out}");

    // A URL that cannot be used: the error names it, password hidden.
    let bad = format!("redis://tg:{PASSWORD}@127.0.0.1:notaport");
    let (ok, out) = tollgate(&["check", "--config", &config, "--redis", &bad]);
    assert!(!ok, "{out}");
    assert!(out.contains("redis://tg:***@127.0.0.1:notaport"), "{out}");
    assert!(!out.contains(PASSWORD), "{out}");
    let file = RulesFile::new(
        "deploy-secret-bad",
        &format!("backend:\n  redis:\n    url: \"{bad}\"\n{RULES}"),
    );
    let config = file.0.to_string_lossy().into_owned();
    let (ok, out) = tollgate(&["check", "--config", &config]);
    assert!(!ok && out.contains("tg:***@"), "{out}");
    assert!(!out.contains(PASSWORD), "{out}");
    // And in Debug output of a rules target.
    let target = tollgate::rules::RedisTarget::url(url);
    let debug = format!("{target:?}");
    assert!(!debug.contains(PASSWORD), "{debug}");
    // And in the slots' and the pacer's errors for such a URL.
    let slots = tollgate::backend::RedisSlots::from_url(&bad, "s:").unwrap_err();
    let pace = tollgate::outbound::RedisPace::from_url(&bad, "p:").unwrap_err();
    for e in [slots, pace] {
        let text = chain(&e);
        assert!(
            text.contains("tg:***@") && !text.contains(PASSWORD),
            "{text}"
        );
    }
}

#[test]
fn gateway_flags_name_a_sentinel_and_tls_files() {
    let file = RulesFile::new("deploy-flags", "rules: []\n");
    let config = file.0.to_string_lossy().into_owned();
    let sentinel = format!("redis://:{PASSWORD}@127.0.0.1:26379");
    let (ok, out) = tollgate(&[
        "check",
        "--config",
        &config,
        "--redis-sentinel",
        &sentinel,
        "--redis-sentinel-master",
        "mymaster",
    ]);
    assert!(ok, "{out}");
    assert!(
        out.contains("redis sentinel master \"mymaster\" via redis://:***@127.0.0.1:26379"),
        "{out}"
    );
    assert!(!out.contains(PASSWORD), "{out}");
    let (ok, out) = tollgate(&["check", "--config", &config, "--redis-sentinel", &sentinel]);
    assert!(!ok && out.contains("--redis-sentinel-master"), "{out}");
    let (ok, out) = tollgate(&[
        "check",
        "--config",
        &config,
        "--redis",
        "redis://h:1",
        "--redis-cluster",
        "redis://h:2",
    ]);
    assert!(!ok && out.contains("only one of"), "{out}");
    // A CA file that is not there is named in the error.
    let (ok, out) = tollgate(&[
        "check",
        "--config",
        &config,
        "--redis",
        "rediss://h:1",
        "--redis-ca",
        "no-such-ca.pem",
    ]);
    assert!(!ok && out.contains("no-such-ca.pem"), "{out}");
    let (ok, out) = tollgate(&["check", "--config", &config, "--redis-ca", "ca.pem"]);
    assert!(!ok && out.contains("need --redis"), "{out}");
}

async fn status(gw: &Gateway, key: &str) -> StatusCode {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = Request::get(format!("http://{}/api", gw.addr))
        .header("x-api-key", key)
        .body(Empty::new())
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    resp.into_body().collect().await.unwrap();
    status
}

const GATEWAY_RULES: &str = "on_backend_error: reject
rules:
  - name: api
    key: header:x-api-key
    quotas: [{ name: api, algorithm: fixed_window, limit: 2, period: 1h }]
";

/// The keys the gateway's requests made on `node`: not those of the probe
/// the gateway runs at start (which expire within seconds).
fn limited_keys(node: &Server) -> usize {
    (node.cli(&["KEYS", "*"]).lines())
        .filter(|k| !k.is_empty() && !k.contains("probe"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_from_a_rules_file_limits_every_key_through_the_gateway() {
    let cluster = Cluster::start(PASSWORD);
    let url = |n: usize| format!("redis://:{PASSWORD}@127.0.0.1:{}", cluster.nodes[n].port);
    // One node named: the others are found from it, and AUTH goes to each.
    let file = RulesFile::new(
        "deploy-cluster",
        &format!(
            "backend:\n  redis:\n    cluster: [\"{}\"]\n    timeout: 2s\ntimeout: 3s\n{GATEWAY_RULES}",
            url(0)
        ),
    );
    let gw = Gateway::start(&file.0, None, &[]);
    for i in 0..12 {
        let key = format!("key-{i}");
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(status(&gw, &key).await);
        }
        assert_eq!(
            seen,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ],
            "{key}"
        );
    }
    let sizes: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| limited_keys(n) as u64)
        .collect();
    assert_eq!(sizes.iter().sum::<u64>(), 12, "{sizes:?}");
    assert!(
        sizes.iter().all(|&n| n > 0),
        "keys on every node: {sizes:?}"
    );

    // A gateway given another node by flag shares the same counts.
    let flagged = Gateway::start(&file.0, None, &["--redis-cluster", &url(2)]);
    // Its first connection (the slots map, then each node) may take longer
    // than the default 50 ms timeout of a flag-made backend: until it is
    // made, the answer is 503 (on_backend_error: reject).
    let start = std::time::Instant::now();
    while status(&flagged, "key-0").await == StatusCode::SERVICE_UNAVAILABLE {
        assert!(start.elapsed() < Duration::from_secs(20), "never connected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..12 {
        assert_eq!(
            status(&flagged, &format!("key-{i}")).await,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_resumes_through_the_new_master() {
    let mut deploy = Sentinel::start(PASSWORD);
    // The sentinel has no password; the master's is given in the file.
    let file = RulesFile::new(
        "deploy-sentinel",
        &format!(
            "backend:\n  redis:\n    sentinel: {{ master: {}, urls: [{}], password: {PASSWORD} }}\n    timeout: 2s\ntimeout: 3s\n{GATEWAY_RULES}",
            Sentinel::NAME,
            deploy.sentinel.url()
        ),
    );
    let gw = Gateway::start(&file.0, None, &[]);
    let limited = [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(status(&gw, "before").await);
    }
    assert_eq!(seen, limited);
    assert_eq!(limited_keys(&deploy.master), 1, "counted in the master");
    wait_until(
        Duration::from_secs(10),
        "the count to reach the replica",
        || limited_keys(&deploy.replica) == 1,
    );

    let old = deploy.master.pid();
    deploy.master.kill();
    assert!(old.is_some());
    // The sentinel promotes the replica; decisions come back through it.
    let start = std::time::Instant::now();
    let mut answer = StatusCode::SERVICE_UNAVAILABLE;
    while start.elapsed() < Duration::from_secs(60) {
        answer = status(&gw, "after").await;
        if answer != StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        answer,
        StatusCode::OK,
        "no decision {:?} after the kill",
        start.elapsed()
    );
    assert_eq!(status(&gw, "after").await, StatusCode::OK);
    assert_eq!(status(&gw, "after").await, StatusCode::TOO_MANY_REQUESTS);
    let role = deploy.replica.cli(&["ROLE"]);
    assert!(role.starts_with("master"), "{role}");
    // The count made before the failover was replicated and still holds.
    assert_eq!(status(&gw, "before").await, StatusCode::TOO_MANY_REQUESTS);
    wait_until(Duration::from_secs(5), "keys in the new master", || {
        limited_keys(&deploy.replica) == 2
    });
}

/// Slots and a pacer made on `backend` keep their limits there: 12 keys
/// (spread over a cluster's nodes), each with a limit of 2 slots and a
/// pacer's burst of 2 turns. The slots granted are held by the caller, so
/// that their sets stay in Redis.
async fn slots_and_a_pacer_on(backend: &RedisBackend) -> Vec<tollgate::backend::Acquired> {
    use tollgate::backend::{Acquired, RedisSlots, SlotStore};
    use tollgate::outbound::{Pacer, RedisPace, WaitError};
    let slots = RedisSlots::on(backend, "deploy:slots:").timeout(Duration::from_secs(5));
    let quota = Quota::gcra(2, HOUR).build().unwrap();
    let mut held = Vec::new();
    let pacer = Pacer::new(
        RedisPace::on(backend, "deploy:pace:").timeout(Duration::from_secs(5)),
        &quota,
    );
    for i in 0..12 {
        let key = format!("key-{i}");
        let first = slots.acquire(&key, 2).await.unwrap();
        let second = slots.acquire(&key, 2).await.unwrap();
        let third = slots.acquire(&key, 2).await.unwrap();
        assert!(
            matches!(first, Acquired::Granted { in_use: 1, .. }),
            "{key}"
        );
        assert!(
            matches!(second, Acquired::Granted { in_use: 2, .. }),
            "{key}"
        );
        assert!(matches!(third, Acquired::Full { in_use: 2 }), "{key}");
        held.extend([first, second]);
        // Turns at once while the burst lasts, then one a half hour on:
        // the schedule is kept.
        let mut at_once = 0;
        let would_wait = loop {
            match pacer.acquire_within(&key, 1, Duration::ZERO).await {
                Ok(_) => at_once += 1,
                Err(WaitError::TooLong { would_wait }) => break would_wait,
                Err(e) => panic!("{key}: {e}"),
            }
            assert!(at_once <= 2, "{key}: more than the burst");
        };
        assert_eq!(at_once, 2, "{key}");
        assert!(
            would_wait > Duration::from_secs(1700),
            "{key}: {would_wait:?}"
        );
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_and_a_pacer_on_a_backend_reach_a_cluster_and_a_sentinel_master() {
    let cluster = Cluster::start(PASSWORD);
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", cluster.nodes[0].port);
    let on_cluster = RedisBackend::from_cluster_urls([url.clone()])
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let _held = slots_and_a_pacer_on(&on_cluster).await;
    let sizes: Vec<usize> = cluster.nodes.iter().map(limited_keys).collect();
    assert_eq!(
        sizes.iter().sum::<usize>(),
        24,
        "a slot set and a schedule a key: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&n| n > 0),
        "keys on every node: {sizes:?}"
    );
    // A rules file's concurrency quota on the cluster: loaded, and its
    // slots taken there for each request (counted from here).
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["CONFIG", "RESETSTAT"]), "OK");
    }
    let rules = Rules::parse(&format!(
        "backend:\n  redis:\n    cluster: [\"{url}\"]\n    timeout: 5s\non_backend_error: reject\ntimeout: 5s\nrules:\n  - {{ name: r, key: global, concurrency: {{ limit: 2 }}, quotas: [{{ algorithm: fixed_window, limit: 3, period: 1h }}] }}\n"
    ))
    .unwrap();
    let ok = StatusCode::OK;
    assert_eq!(
        four_through(rules).await,
        [ok, ok, ok, StatusCode::TOO_MANY_REQUESTS]
    );
    let zadds = (cluster.nodes.iter())
        .filter(|n| n.cli(&["INFO", "commandstats"]).contains("cmdstat_zadd"))
        .count();
    assert!(zadds > 0, "no node took a slot");

    let deploy = Sentinel::start(PASSWORD);
    let on_sentinel = RedisBackend::from_sentinel(Sentinel::NAME, [deploy.sentinel.url()])
        .sentinel_master_auth("", PASSWORD)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let _held = slots_and_a_pacer_on(&on_sentinel).await;
    assert_eq!(limited_keys(&deploy.master), 24, "kept in the master");
}
