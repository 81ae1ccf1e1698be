//! Invalid files refused with their file, line and column; a changed
//! directory reloaded, an invalid version ignored.

use std::time::{Duration, Instant};

use super::support::envoy::{Rls, grpc_calls};
use super::support::process::TempDir;
use super::{DAY, HOUR, call, limit};

/// Runs `tollgate rls --check` on `files` in one directory; the error.
fn check_error(files: &[(&str, &str)]) -> String {
    let dir = TempDir::new("check");
    for (name, text) in files {
        dir.write(name, text);
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["rls", "--check", "--config"])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{files:?} was accepted");
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn invalid_files_are_refused_with_file_line_and_column() {
    let cases: &[(&str, &str)] = &[
        (
            "domain: d\ndescriptors:\n  - key: k\n    ratelimit: { unit: day }\n",
            "unknown field `ratelimit`",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
            "duplicate descriptor composite key 'd.k_v'",
        ),
        (
            "domain: d\ndescriptors:\n  - value: v\n",
            "descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
            "invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { name: me, unit: day, requests_per_unit: 1, replaces: [{ name: me }] }\n",
            "replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 1, replaces: [{ name: \"\" }] }\n",
            "should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: day }\n",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: \"\"\ndescriptors: []\n",
            "config file cannot have empty domain",
        ),
        ("domain: d\ndescriptors:\n  - a\n  - b\n", "line 3"),
        ("domain: d\ndomain: e\n", "duplicate"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n",
            "share_threshold can only be used with wildcard values",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 1, algorithm: magic }\n",
            "unknown algorithm 'magic'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 5, cost: 0 }\n",
            "cost must be at least 1",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 5, cost: 6 }\n",
            "cost 6 is more than requests_per_unit 5 can ever admit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, cost: 2 }\n",
            "should not specify cost when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 5, cost: -1 }\n",
            "line 4",
        ),
    ];
    for (text, expected) in cases {
        let error = check_error(&[("bad.yaml", text)]);
        let place = error.find("bad.yaml: ").map(|at| &error[at..]);
        assert!(
            place.is_some_and(|p| p.contains("line ") && p.contains(" column ")),
            "no place in {error:?} for {text:?}"
        );
        assert!(error.contains(expected), "{error:?} lacks {expected:?}");
    }
    let error = check_error(&[("a.yaml", "domain: d\n"), ("b.yaml", "domain: d\n")]);
    assert!(
        error.contains("b.yaml: line 1 column 9: duplicate domain 'd'"),
        "{error}"
    );
}

#[test]
fn a_changed_directory_is_reloaded_and_an_invalid_one_ignored() {
    let dir = TempDir::new("reload");
    dir.write("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: day, requests_per_unit: 1 }\n");
    let rls = Rls::start(&dir.0, &[]);
    let first = grpc_calls(rls.addr, &[call("d", &[("k", "v")])]);
    assert_eq!(limit(&first[0], 0), Some((1, DAY)));
    dir.write("a.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 9 }\n");
    dir.write("b.yaml", "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 4 }\n");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = grpc_calls(
            rls.addr,
            &[call("d", &[("k", "v")]), call("e", &[("k", "v")])],
        );
        if limit(&a[0], 0) == Some((9, HOUR)) && limit(&a[1], 0) == Some((4, HOUR)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new files never took effect: {a:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // An invalid version leaves the one in force.
    dir.write(
        "b.yaml",
        "domain: e\ndescriptors:\n  - key: k\n    rate_limit: { unit: aeon }\n",
    );
    std::thread::sleep(Duration::from_secs(2));
    let a = grpc_calls(rls.addr, &[call("e", &[("k", "v")])]);
    assert_eq!(limit(&a[0], 0), Some((4, HOUR)), "{a:?}");
}
