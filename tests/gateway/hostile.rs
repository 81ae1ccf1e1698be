//! The gateway against hostile clients and silent upstreams: a
//! real `tollgate serve` process on a loopback port, raw sockets for what a
//! well-behaved client would never send.
#![cfg(feature = "gateway")]

use crate::support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use support::gateway::{Gateway, RulesFile, dead_port, upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `request` on a new connection and reads until the gateway closes
/// it (at most 10 s): the whole answer, as text.
async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the gateway answers and closes within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A GET with one extra header line, on a connection closed after it.
fn get(header: &str, value: &[u8]) -> Vec<u8> {
    let mut request = b"GET /x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n".to_vec();
    if !header.is_empty() {
        request.extend_from_slice(format!("{header}: ").as_bytes());
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"\r\n");
    request
}

fn status(answer: &str) -> u16 {
    answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"))
}

/// Whether the peer closed the connection (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut sink = Vec::new();
    // A read error (reset) counts as closed too: only the timeout does not.
    tokio::time::timeout(within, stream.read_to_end(&mut sink))
        .await
        .is_ok()
}

/// Sockets the process holds open (its listener included).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// Resident memory of the process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

const BEHIND_A_PROXY: &str = r#"
on_missing_key: allow
client_ip: { trusted_proxies: ["127.0.0.1"], header: HEADER }
deny: { ips: ["203.0.113.66"] }
rules:
  - name: per-client
    key: client_ip
    quotas: [{ algorithm: fixed_window, limit: 1, period: 1h }]
"#;

/// The test plays the trusted proxy: what a client wrote is on the left,
/// the address the proxy saw on the right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_client_writes_left_of_its_address_escapes_neither_the_deny_list_nor_its_limit() {
    let many = "6.6.6.6, ".repeat(65);
    let xff_tricks: [&[u8]; 3] = [many.as_bytes(), b"caf\xc3\xa9, ", b"\xff\xfe, "];
    let many = "for=6.6.6.6, ".repeat(65);
    let forwarded_tricks: [&[u8]; 3] = [many.as_bytes(), b"for=\"6.6.6.6, ", b"for=\xff, "];
    for (header, tricks, node) in [
        ("x-forwarded-for", xff_tricks, ""),
        ("forwarded", forwarded_tricks, "for="),
    ] {
        let rules = RulesFile::new(header, &BEHIND_A_PROXY.replace("HEADER", header));
        let gw = Gateway::start(&rules.0, None, &[]);
        let with = |trick: &[u8], client: &str| {
            let mut value = trick.to_vec();
            value.extend_from_slice(format!("{node}{client}").as_bytes());
            get(header, &value)
        };
        for trick in tricks {
            let answer = raw(gw.addr, &with(trick, "203.0.113.66")).await;
            assert_eq!(
                status(&answer),
                403,
                "{header}: {}",
                String::from_utf8_lossy(trick)
            );
        }
        let first = raw(gw.addr, &with(b"", "203.0.113.7")).await;
        assert_eq!(status(&first), 200, "{header}: the first request");
        for trick in tricks {
            let answer = raw(gw.addr, &with(trick, "203.0.113.7")).await;
            assert_eq!(
                status(&answer),
                429,
                "{header}: {}",
                String::from_utf8_lossy(trick)
            );
        }
    }
}

const OPEN: &str = "rules:\n  - name: all\n    key: global\n    quotas: [{ algorithm: gcra, limit: 100000, period: 1s }]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_capped_and_cut_off_by_the_header_timeout() {
    let rules = RulesFile::new("slow", OPEN);
    let flags = ["--header-timeout", "1s", "--max-connections", "20"];
    let gw = Gateway::start(&rules.0, None, &flags);
    let pid = gw.child.id();
    let idle = sockets(pid);
    let started = Instant::now();
    let mut slow = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\nX-Slow: ")
            .await
            .unwrap();
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = sockets(pid) - idle;
    assert!(held <= 20, "{held} connections held, over the cap of 20");
    assert!(
        held >= 10,
        "only {held} connections held: the cap was not reached"
    );
    // A well-behaved client still gets in once the slow ones are cut off.
    let answer = raw(gw.addr, &get("", b"")).await;
    assert_eq!(status(&answer), 200);
    for s in &mut slow {
        assert!(
            closed_within(s, Duration::from_secs(8)).await,
            "a slow connection still open after {:?}",
            started.elapsed()
        );
    }
    // Keep-alive: after an answer, an idle connection is closed too.
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(2);
    while sockets(pid) > idle {
        assert!(Instant::now() < deadline, "sockets not released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_are_refused_and_hold_bounded_memory() {
    let rules = RulesFile::new("big", OPEN);
    let flags = ["--header-timeout", "30s", "--max-header-bytes", "8192"];
    let gw = Gateway::start(&rules.0, None, &flags);
    let pid = gw.child.id();
    // Warm up: the first requests allocate what any request needs.
    for _ in 0..3 {
        assert_eq!(status(&raw(gw.addr, &get("", b"")).await), 200);
    }
    let before = rss_kib(pid);
    let head = [
        b"GET / HTTP/1.1\r\nHost: gw\r\nX-Big: ".as_slice(),
        &vec![b'a'; 300_000],
    ]
    .concat();
    let mut peak = before;
    let mut clients = Vec::new();
    for _ in 0..100 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        let head = head.clone();
        clients.push(tokio::spawn(async move {
            // The gateway stops reading at its cap: the write may fail.
            let _ = tokio::time::timeout(Duration::from_secs(5), s.write_all(&head)).await;
            closed_within(&mut s, Duration::from_secs(5)).await
        }));
        peak = peak.max(rss_kib(pid));
    }
    for c in clients {
        assert!(
            c.await.unwrap(),
            "an oversized head was not refused within 5 s"
        );
    }
    let grown = peak.saturating_sub(before);
    assert!(
        grown < 10 * 1024,
        "100 heads of 300 KB grew the gateway by {grown} KiB"
    );
    let answer = raw(gw.addr, &get("x-big", &[b'a'; 9000])).await;
    assert_eq!(status(&answer), 431, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_is_cut_off_by_the_idle_timeout() {
    let up = upstream().await;
    let rules = RulesFile::new("stalled", OPEN);
    let gw = Gateway::start(&rules.0, Some(up.addr), &["--idle-timeout", "1s"]);
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\nten bytes.")
        .await
        .unwrap();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_stops_mid_body_is_cut_off_by_the_idle_timeout() {
    // Answers with a head and 10 of its 100 bytes, then holds the connection.
    let stalling = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalling_addr = stalling.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = stalling.accept().await {
            let mut request = [0u8; 1024];
            let _ = s.read(&mut request).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nten bytes.")
                .await;
            held.push(s);
        }
    });
    let rules = RulesFile::new("stalling", OPEN);
    let gw = Gateway::start(&rules.0, Some(stalling_addr), &["--idle-timeout", "1s"]);
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_or_unconnectable_upstream_is_a_504_and_an_unreachable_one_a_502() {
    // Accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let rules = RulesFile::new("silent", OPEN);
    let gw = Gateway::start(
        &rules.0,
        Some(silent_addr),
        &["--upstream-timeout", "500ms"],
    );
    let started = Instant::now();
    let answer = raw(gw.addr, &get("", b"")).await;
    assert_eq!(status(&answer), 504, "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("\"status\":504"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // A listener that never accepts, its accept queue full: connecting hangs.
    let full = tokio::net::TcpSocket::new_v4().unwrap();
    full.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = full.listen(1).unwrap();
    let full_addr = full.local_addr().unwrap();
    let mut queued = Vec::new();
    for _ in 0..16 {
        match std::net::TcpStream::connect_timeout(&full_addr, Duration::from_millis(200)) {
            Ok(s) => queued.push(s),
            Err(_) => break,
        }
    }
    assert!(queued.len() < 16, "the accept queue never filled");
    let flags = ["--connect-timeout", "300ms"];
    let gw = Gateway::start(&rules.0, Some(full_addr), &flags);
    let started = Instant::now();
    let answer = raw(gw.addr, &get("", b"")).await;
    assert_eq!(status(&answer), 504, "{answer}");
    assert!(answer.contains("did not accept a connection"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let dead = dead_port();
    let gw = Gateway::start(&rules.0, Some(dead.addr), &[]);
    let answer = raw(gw.addr, &get("", b"")).await;
    assert_eq!(status(&answer), 502, "{answer}");
    assert!(answer.contains("\"status\":502"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forwarded_for_line_reaches_the_upstream_with_the_peer_appended() {
    let up = upstream().await;
    let rules = RulesFile::new("xff", OPEN);
    let gw = Gateway::start(&rules.0, Some(up.addr), &[]);
    let mut request = b"GET /x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n".to_vec();
    request.extend_from_slice(b"X-Forwarded-For: caf\xc3\xa9, 198.51.100.1\r\n");
    request.extend_from_slice(b"X-Forwarded-For: 203.0.113.9\r\n\r\n");
    assert_eq!(status(&raw(gw.addr, &request).await), 201);
    // Naming the forwarding fields hop-by-hop does not strip the chain
    // before the peer is appended.
    let mut request = b"GET /x HTTP/1.1\r\nHost: gw\r\n".to_vec();
    request.extend_from_slice(b"Connection: close, X-Forwarded-For, forwarded, x-real-ip\r\n");
    request.extend_from_slice(b"X-Forwarded-For: 198.51.100.1\r\nForwarded: for=198.51.100.1\r\n");
    request.extend_from_slice(b"X-Real-IP: 198.51.100.1\r\n\r\n");
    assert_eq!(status(&raw(gw.addr, &request).await), 201);
    let seen = up.seen.lock().unwrap();
    let lines: Vec<&[u8]> = seen[0]
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    assert_eq!(
        lines,
        [b"caf\xc3\xa9, 198.51.100.1, 203.0.113.9, 127.0.0.1".as_slice()]
    );
    let named = &seen[1].headers;
    assert_eq!(named["x-forwarded-for"], "198.51.100.1, 127.0.0.1");
    assert_eq!(named["forwarded"], "for=198.51.100.1");
    assert_eq!(named["x-real-ip"], "198.51.100.1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_a_client_repeats_are_logged_once_with_a_count_to_follow() {
    let dead = dead_port();
    let dead_redis = dead.addr.port();
    let rules = RulesFile::new(
        "logs",
        &format!(
            "backend: {{ redis: {{ url: \"redis://127.0.0.1:{dead_redis}\" }} }}\non_backend_error: allow\n{OPEN}"
        ),
    );
    let log_path = rules.0.with_file_name("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let gw = Gateway::start_logging_to(&rules.0, None, &[], Some(log));
    for _ in 0..100 {
        assert_eq!(status(&raw(gw.addr, &get("", b"")).await), 200);
    }
    std::fs::write(&rules.0, "rules: [ this is not yaml").unwrap();
    // Six reload ticks of 250 ms see the broken file.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(gw);
    let log = std::fs::read_to_string(&log_path).unwrap();
    let count = |what: &str| log.lines().filter(|l| l.contains(what)).count();
    assert_eq!(count("could not decide"), 1, "{log}");
    assert!(count("Redis rate-limit call failed") <= 1, "{log}");
    assert_eq!(count("rules file invalid"), 1, "{log}");
    assert!(log.lines().count() < 10, "{log}");
}

#[test]
fn the_gateway_feature_brings_redis() {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gateway = &meta["packages"][0]["features"]["gateway"];
    assert!(
        gateway.as_array().unwrap().iter().any(|f| f == "redis"),
        "{gateway}"
    );
}

#[test]
fn limit_flags_refuse_values_that_would_disable_them() {
    for (flag, value, says) in [
        ("--max-connections", "0", "from 1 to"),
        ("--max-header-bytes", "100", "from 1024 to"),
        ("--header-timeout", "0s", "above zero"),
        ("--upstream-timeout", "soon", "is not a period"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--config", "unused.yaml", flag, value])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains(says), "{err}");
    }
}

/// A queue of three drained one a second: the third request waits 2 s, far
/// past the idle timeout given below.
const QUEUE: &str = "rules:\n  - name: queue\n    key: global\n    quotas: [{ algorithm: leaky_bucket, limit: 1, period: 1s, burst: 3 }]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_held_in_a_leaky_bucket_past_the_idle_timeout_is_answered() {
    let up = upstream().await;
    let rules = RulesFile::new("queue", QUEUE);
    let log_path = rules.0.with_file_name("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let flags = ["--idle-timeout", "300ms"];
    let gw = Gateway::start_logging_to(&rules.0, Some(up.addr), &flags, Some(log));
    let post =
        b"POST /x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbody";
    let requests = [get("", b""), get("", b""), post.to_vec()];
    let addr = gw.addr;
    let waiting: Vec<_> = (requests.into_iter())
        .map(|request| tokio::spawn(async move { raw(addr, &request).await }))
        .collect();
    for answer in waiting {
        let answer = answer.await.unwrap();
        assert_eq!(status(&answer), 201, "{answer}");
    }
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().any(|s| s.body == b"body"),
        "the held body arrived whole"
    );
    drop(gw);
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("rule queue may hold a request for up to 2s"),
        "serve warns at start: {log}"
    );
}

#[test]
fn check_warns_when_a_leaky_bucket_may_hold_a_request_past_the_idle_timeout() {
    let rules = RulesFile::new("queue-check", QUEUE);
    let check = |flags: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("check")
            .arg("--config")
            .arg(&rules.0)
            .args(flags)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let warned = check(&["--idle-timeout", "1500ms"]);
    assert!(
        warned.contains("warning: rule queue may hold a request for up to 2s")
            && warned.contains("idle timeout of 1.5s"),
        "{warned}"
    );
    assert_eq!(check(&[]), "", "2 s is within the default 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holding_idle_connections_leaves_room_for_another() {
    let rules = RulesFile::new("per-ip", OPEN);
    // The default cap per address (64) under a total of 80: without it, 100
    // idle connections from one address would take all 80 and queue
    // everyone else for the header timeout (30 s here).
    let flags = ["--max-connections", "80", "--header-timeout", "30s"];
    let gw = Gateway::start(&rules.0, None, &flags);
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(TcpStream::connect(gw.addr).await.unwrap());
    }
    // Each connection over the cap is answered 429 and closed at once; the
    // others stay open.
    let probes: Vec<_> = (idle.into_iter())
        .map(|mut s| {
            tokio::spawn(async move {
                let mut answer = Vec::new();
                let read = s.read_to_end(&mut answer);
                let closed = tokio::time::timeout(Duration::from_secs(3), read).await;
                (s, closed.is_ok(), answer)
            })
        })
        .collect();
    let mut held = Vec::new();
    let mut refused = 0;
    for probe in probes {
        let (s, closed, answer) = probe.await.unwrap();
        if closed {
            refused += 1;
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.starts_with("HTTP/1.1 429 "), "{answer}");
        } else {
            held.push(s);
        }
    }
    assert_eq!((held.len(), refused), (64, 36));

    // Another address is served while they are held.
    let other = tokio::net::TcpSocket::new_v4().unwrap();
    other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = other.connect(gw.addr).await.unwrap();
    other.write_all(&get("", b"")).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), other.read_to_end(&mut answer))
        .await
        .expect("another address is served while one holds its cap")
        .unwrap();
    assert_eq!(status(&String::from_utf8_lossy(&answer)), 200);

    // The address gets its room back as its connections close.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answer = raw(gw.addr, &get("", b"")).await;
        if status(&answer) == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "no room came back: {answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_connections_are_not_capped_per_address() {
    let rules = RulesFile::new(
        "per-ip-proxy",
        &format!("client_ip: {{ trusted_proxies: [\"127.0.0.1\"] }}\n{OPEN}"),
    );
    let flags = ["--max-connections-per-ip", "2"];
    let gw = Gateway::start(&rules.0, None, &flags);
    let connect_from = |ip: &'static str| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
        socket.connect(gw.addr).await.unwrap()
    };
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(connect_from("127.0.0.1").await);
    }
    for _ in 0..2 {
        held.push(connect_from("127.0.0.2").await);
    }
    let mut over = connect_from("127.0.0.2").await;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), over.read_to_end(&mut answer))
        .await
        .expect("the third connection of an untrusted address is closed")
        .unwrap();
    assert!(answer.starts_with(b"HTTP/1.1 429 "));
    // The proxy's connections, over the cap of 2, are all served.
    for s in &mut held[..5] {
        s.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut head))
            .await
            .expect("a trusted proxy's connection is served")
            .unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
    }
}
