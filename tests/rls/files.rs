//! Invalid files refused with their file, line and column; a changed
//! directory reloaded, an invalid version ignored; files of one domain
//! merged or refused as `MERGE_DOMAIN_CONFIG` says.

use std::time::{Duration, Instant};

use super::support::envoy::{Rls, grpc_calls};
use super::support::process::TempDir;
use super::{DAY, HOUR, MINUTE, call, limit};

/// Runs `tollgate rls --check` on `files` in one directory; the error.
fn check_error(files: &[(&str, &str)]) -> String {
    check_error_with(files, &[], &[])
}

/// As [`check_error`], with `extra` arguments and environment `env`.
fn check_error_with(files: &[(&str, &str)], extra: &[&str], env: &[(&str, &str)]) -> String {
    let dir = TempDir::new("check");
    for (name, text) in files {
        dir.write(name, text);
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["rls", "--check", "--config"])
        .arg(&dir.0)
        .args(extra)
        .env_remove("MERGE_DOMAIN_CONFIG")
        .envs(env.iter().copied())
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

/// The reference's `merge_domain_key1.yaml` and `merge_domain_key2.yaml`:
/// one domain, a top-level descriptor in each.
const MERGE_KEY1: &str = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";
const MERGE_KEY2: &str = "domain: test-domain\ndescriptors:\n  - key: key2\n    value: value2\n    rate_limit:\n      unit: minute\n      requests_per_unit: 20\n";

/// Both merged descriptors' limits, as the service answers them.
fn merged_limits(rls: &Rls) -> Vec<Option<(u64, u64)>> {
    let answers = grpc_calls(
        rls.addr,
        &[
            call("test-domain", &[("key1", "value1")]),
            call("test-domain", &[("key2", "value2")]),
        ],
    );
    answers.iter().map(|a| limit(a, 0)).collect()
}

#[test]
fn files_of_one_domain_merge_with_merge_domain_config_or_the_flag() {
    let dir = TempDir::new("merge");
    dir.write("merge_domain_key1.yaml", MERGE_KEY1);
    dir.write("merge_domain_key2.yaml", MERGE_KEY2);
    let both = vec![Some((10, MINUTE)), Some((20, MINUTE))];
    for value in ["true", "1", "True"] {
        let rls = Rls::start_with_env(&dir.0, &[], &[("MERGE_DOMAIN_CONFIG", value)]);
        assert_eq!(merged_limits(&rls), both, "MERGE_DOMAIN_CONFIG={value}");
    }
    // The flag merges whatever the variable says, and so does the live
    // reload: a third file of the domain joins it.
    let rls = Rls::start_with_env(
        &dir.0,
        &["--merge-domains"],
        &[("MERGE_DOMAIN_CONFIG", "false")],
    );
    assert_eq!(merged_limits(&rls), both);
    dir.write(
        "merge_domain_key3.yaml",
        "domain: test-domain\ndescriptors:\n  - key: key3\n    rate_limit: { unit: hour, requests_per_unit: 3 }\n",
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = grpc_calls(rls.addr, &[call("test-domain", &[("key3", "x")])]);
        if limit(&a[0], 0) == Some((3, HOUR)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the third file never merged: {a:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(merged_limits(&rls), both, "the merged files lost a limit");
}

#[test]
fn files_of_one_domain_are_refused_without_merging() {
    let files = [
        ("merge_domain_key1.yaml", MERGE_KEY1),
        ("merge_domain_key2.yaml", MERGE_KEY2),
    ];
    for env in [&[][..], &[("MERGE_DOMAIN_CONFIG", "false")][..]] {
        let error = check_error_with(&files, &[], env);
        assert!(
            error.contains("merge_domain_key2.yaml: line 1 column 9: duplicate domain 'test-domain' in config file"),
            "{env:?}: {error}"
        );
    }
    // A running service keeps its configuration when a second file of
    // its domain appears, and answers by the first file alone.
    let dir = TempDir::new("nomerge");
    dir.write("merge_domain_key1.yaml", MERGE_KEY1);
    let rls = Rls::start(&dir.0, &[]);
    assert_eq!(merged_limits(&rls), vec![Some((10, MINUTE)), None]);
    dir.write("merge_domain_key2.yaml", MERGE_KEY2);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(merged_limits(&rls), vec![Some((10, MINUTE)), None]);
}

#[test]
fn merging_refuses_a_descriptor_two_files_write_and_a_variable_that_is_not_a_boolean() {
    // As the reference: only the top level merges, so the same key and
    // value in two files is a duplicate even when their children differ,
    // named in the second file.
    let nested = |child: &str| {
        format!(
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: {child}\n        rate_limit: {{ unit: day, requests_per_unit: 1 }}\n"
        )
    };
    let wildcard = "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value*\n";
    let cases = [
        (
            MERGE_KEY1.to_owned(),
            MERGE_KEY1.to_owned(),
            "'test-domain.key1_value1'",
        ),
        (
            nested("child"),
            nested("other"),
            "'test-domain.key1_value1'",
        ),
        (
            wildcard.to_owned(),
            wildcard.to_owned(),
            "'test-domain.key1_value*'",
        ),
    ];
    for (first, second, key) in &cases {
        let files = [("a.yaml", first.as_str()), ("b.yaml", second.as_str())];
        let expected = format!("duplicate descriptor composite key {key}");
        for (extra, env) in [
            (&["--merge-domains"][..], &[][..]),
            (&[][..], &[("MERGE_DOMAIN_CONFIG", "true")][..]),
        ] {
            let error = check_error_with(&files, extra, env);
            let place = error.find("b.yaml: line ").map(|at| &error[at..]);
            assert!(
                place.is_some_and(|p| p.contains(" column ") && p.contains(&expected)),
                "{second:?} {extra:?} {env:?}: {error}"
            );
        }
    }
    let files = [("a.yaml", MERGE_KEY1)];
    for bad in ["yes", "", "on"] {
        let error = check_error_with(
            &files,
            &["--merge-domains"],
            &[("MERGE_DOMAIN_CONFIG", bad)],
        );
        assert!(
            error.contains(&format!("MERGE_DOMAIN_CONFIG={bad:?}: give true or false")),
            "{bad:?}: {error}"
        );
    }
}
