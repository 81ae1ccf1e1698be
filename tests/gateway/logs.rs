//! The gateway's log, read from its stderr (a pipe, as under a service
//! manager): client keys hashed unless asked for, values quoted so that no
//! client can forge a field, no colour codes, JSON on request.
#![cfg(feature = "gateway")]

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::gateway::{Gateway, RulesFile, dead_port};
use support::{Reply, client, get};

const SECRET: &str = "sk_live_SECRET123";

/// A shadow quota on the API key: the second request of a key is one it
/// would have refused. The partition key is sent, to compare with the log.
const SHADOW: &str = r#"
partition_key: random
rules:
  - name: trial
    key: header:x-api-key
    quotas: [{ name: trial, algorithm: fixed_window, limit: 1, period: 1h, mode: shadow }]
"#;

/// Starts a gateway on `rules` with `extra` flags, sends each API key of
/// `keys` twice, waits for a log line containing `wait_for`, stops the
/// gateway and returns its log and the last reply.
async fn run(rules: &str, extra: &[&str], keys: &[&[u8]], wait_for: &str) -> (String, Reply) {
    let rules = RulesFile::new(&format!("logs-{}", unique()), rules);
    let log_path = rules.0.with_file_name("gateway.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let gw = Gateway::start_logging_to(&rules.0, None, extra, Some(log));
    let client = client();
    let mut last = None;
    for key in keys {
        for _ in 0..2 {
            let reply = get(&client, gw.addr, "/x", &[("x-api-key", key)]).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
            last = Some(reply);
        }
    }
    let log = wait_for_line(&log_path, wait_for).await;
    drop(gw);
    (log, last.unwrap())
}

fn unique() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The log once a line contains `what` (within 5 s).
async fn wait_for_line(path: &Path, what: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.lines().any(|l| l.contains(what)) {
            return log;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no {what:?} in\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn line<'a>(log: &'a str, what: &str) -> &'a str {
    log.lines().find(|l| l.contains(what)).unwrap()
}

/// The `pk` parameter of a reply's `RateLimit` field.
fn pk(reply: &Reply) -> &str {
    let field = reply.header("ratelimit").unwrap();
    let at = field.find("pk=").unwrap() + "pk=".len();
    field[at..].split([';', ',']).next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_failure_logs_a_hash_of_the_key_never_the_key_and_no_colour() {
    let dead = dead_port();
    let rules = format!(
        "backend: {{ redis: {{ url: \"redis://127.0.0.1:{}\" }} }}\non_backend_error: allow\n{SHADOW}",
        dead.addr.port()
    );
    let keys: &[&[u8]] = &[SECRET.as_bytes()];
    let (log, _) = run(&rules, &[], keys, "rate limiter could not decide").await;
    assert!(!log.contains("SECRET123"), "{log}");
    let failed = line(&log, "rate limiter could not decide");
    assert!(failed.contains(" key=\":"), "{failed}");
    assert!(failed.contains(" reason=\"fail_open\""), "{failed}");
    assert!(
        !log.contains('\x1b'),
        "colour codes in a piped log:\n{log:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_refusal_logs_the_partition_key_in_place_of_the_key() {
    let keys: &[&[u8]] = &[SECRET.as_bytes()];
    let (log, reply) = run(SHADOW, &[], keys, "shadow quota would have refused").await;
    assert!(!log.contains("SECRET123"), "{log}");
    // The hash is the `pk` the client was sent, so the two can be matched.
    let shadow = line(&log, "shadow quota would have refused");
    assert!(
        shadow.contains(&format!(" key=\"{}\"", pk(&reply))),
        "{shadow}"
    );
    assert!(shadow.contains(" reason=\"shadow\""), "{shadow}");
    assert!(!log.contains('\x1b'), "{log:?}");
}

/// An admission within a soft quota's margin says so in its log line,
/// with the key hashed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_admission_logs_its_reason() {
    const SOFT: &str = r#"
rules:
  - name: trial
    key: header:x-api-key
    quotas: [{ name: trial, algorithm: fixed_window, limit: 1, period: 1h, mode: soft, soft_percent: 100 }]
"#;
    let keys: &[&[u8]] = &[SECRET.as_bytes()];
    let wait = "admitted beyond the quota's limit";
    let (log, _) = run(SOFT, &["--log-level", "debug"], keys, wait).await;
    assert!(!log.contains("SECRET123"), "{log}");
    let soft = line(&log, wait);
    assert!(soft.contains(" reason=\"soft\""), "{soft}");
    assert!(soft.contains(" set=\"trial\""), "{soft}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_keys_are_logged_only_when_asked_and_quoted_so_no_field_is_forged() {
    let forged: &[u8] = br#"bob outcome="allowed""#;
    let keys: &[&[u8]] = &[forged, SECRET.as_bytes()];
    let wait = "shadow quota would have refused";

    let (hashed, _) = run(SHADOW, &[], keys, wait).await;
    assert!(
        !hashed.contains("bob") && !hashed.contains("SECRET123"),
        "{hashed}"
    );

    let (raw, _) = run(SHADOW, &["--log-raw-keys"], keys, wait).await;
    assert!(raw.contains(SECRET), "asked for, the key is logged:\n{raw}");
    // The value is quoted, its quotes escaped: `outcome` stays inside it.
    assert!(
        raw.contains(r#"key="key:bob outcome=\"allowed\"""#),
        "{raw}"
    );
    assert!(!raw.contains(r#"outcome="allowed""#), "{raw}");
    assert!(!raw.contains('\x1b'), "{raw:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_writes_one_object_a_line() {
    let forged: &[u8] = br#"bob" "outcome":"allowed"#;
    let keys: &[&[u8]] = &[forged];
    let wait = "shadow quota would have refused";
    let flags = ["--log-format", "json", "--log-raw-keys"];
    let (log, _) = run(SHADOW, &flags, keys, wait).await;
    let mut shadow = None;
    for line in log.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        let fields = event["fields"].as_object().expect("an object of fields");
        assert!(event["level"].is_string(), "{line}");
        if fields["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(wait))
        {
            shadow = Some(fields.clone());
        }
    }
    let shadow = shadow.unwrap_or_else(|| panic!("no shadow line in\n{log}"));
    // The key is one string, whatever it holds; nothing else is added.
    assert_eq!(shadow["key"], r#"key:bob" "outcome":"allowed"#);
    assert_eq!(shadow["set"], "trial");
    assert!(!shadow.contains_key("outcome"), "{shadow:?}");
    assert!(!log.contains('\x1b'), "{log:?}");
}

#[test]
fn log_format_refuses_what_it_does_not_know() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config", "unused.yaml", "--log-format", "xml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--log-format \"xml\": give text or json"),
        "{err}"
    );
}
