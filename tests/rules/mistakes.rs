//! Rules files refused: each mistake reported where it is written, and
//! the settings that would disable or dodge a limit.
#![cfg(feature = "rules")]

use tollgate::rules::Rules;

#[test]
fn the_commented_example_parses() {
    let rules = Rules::load("examples/rules.yaml").unwrap();
    let text = rules.describe();
    for rule in ["login", "api", "exports", "search-trial", "default"] {
        assert!(text.contains(&format!("rule {rule}:")), "{text}");
    }
}

/// Parses `yaml`, expecting an error that names `place` and says `says`.
fn error_where(yaml: &str, place: &str, says: &str) {
    let err = Rules::parse(yaml).expect_err(yaml).to_string();
    assert!(err.contains(place), "wanted {place}: {err}");
    assert!(err.contains(says), "wanted {says:?}: {err}");
}

/// Parses `yaml`, expecting an error at `line` that says `says`.
fn error(yaml: &str, line: usize, says: &str) {
    error_where(yaml, &format!("line {line} "), says);
}

/// Parses `yaml`, expecting an error at `line` and `column` that says `says`.
fn error_at(yaml: &str, line: usize, column: usize, says: &str) {
    error_where(yaml, &format!("line {line} column {column}:"), says);
}

const HEAD: &str = "rules:\n  - name: a\n    key: client_ip\n    quotas:\n";

#[test]
fn each_mistake_is_reported_where_it_is_written() {
    error(
        &format!("{HEAD}      - {{ algorithm: token-bucket, limit: 5, period: 1m }}\n"),
        5,
        "valid algorithms are token_bucket, leaky_bucket, fixed_window, sliding_log, sliding_window, gcra",
    );
    error(
        &format!("{HEAD}      - algorithm: gcra\n        limit: 5\n        period: 0s\n"),
        7,
        "zero",
    );
    error(
        &format!("{HEAD}      - algorithm: gcra\n        limit: 5\n        period: 5 minutes\n"),
        7,
        "write a number and a unit",
    );
    error(
        &format!("{HEAD}      - algorithm: gcra\n        limit: 0\n        period: 1s\n"),
        5,
        "the limit must be at least 1",
    );
    error(
        &format!("{HEAD}      - {{ algorithm: fixed_window, limit: 5, period: 1s, burst: 9 }}\n"),
        5,
        "fixed_window has no burst",
    );
    error(
        &format!("{HEAD}      - {{ algorithm: gcra, limit: 5, period: 1s, mode: soft }}\n"),
        5,
        "needs soft_percent",
    );
    error(
        &format!("{HEAD}      - {{ algorithm: gcra, limit: 5, period: 1s, limt: 3 }}\n"),
        5,
        "unknown field `limt`",
    );
    error(
        "rules:\n  - name: a\n    key: client_id\n    quotas: []\n",
        3,
        "valid keys are peer_ip, client_ip, header:<name>, user, global, route",
    );
    error(
        "rules:\n  - name: a\n    key: global\n    quotas: []\n",
        4,
        "at least one quota",
    );
    error(
        "allow:\n  ips: [10.0.0.300/8]\nrules: []\n",
        2,
        "not an IP address or network",
    );
    error(
        "headers: x-ratelimit\nrules: []\n",
        1,
        "valid values are ietf, draft6, legacy, none",
    );
    error(
        "rules:\n  - name: a\n    match: { path: \"users/{id}\" }\n    key: global\n    quotas: []\n",
        3,
        "must start with /",
    );
    error("rules:\n  - name: a\n    key: [global\n", 3, "");
}

#[test]
fn mistakes_across_rules_are_named() {
    let two = "rules:\n  - name: a\n    key: global\n    quotas: [{ algorithm: gcra, limit: 1, period: 1s }]\n";
    let err = Rules::parse(&format!("{two}{}", &two["rules:\n".len()..])).unwrap_err();
    assert!(
        err.to_string().contains("two rules are named \"a\""),
        "{err}"
    );
    let zero = format!(
        "{}    overrides:\n      - {{ keys: [\"key:x\"], multiply: 0 }}\n",
        two
    );
    let err = Rules::parse(&zero).unwrap_err();
    assert!(
        err.to_string()
            .contains("rule a, override 1: multiply must be at least 1"),
        "{err}"
    );
    let both = format!("{}    overrides:\n      - {{ keys: [\"key:x\"] }}\n", two);
    assert!(
        Rules::parse(&both)
            .unwrap_err()
            .to_string()
            .contains("either multiply or quotas")
    );
}

const ONE: &str = "{ name: q, algorithm: gcra, limit: 5, period: 1s }";

#[test]
fn settings_that_disable_or_dodge_a_limit_are_refused_with_their_place() {
    let rule =
        |extra: &str| format!("rules:\n  - name: a\n    key: global\n{extra}    quotas: [{ONE}]\n");
    error_at(
        &rule("    cost: 6\n"),
        4,
        11,
        "cost 6 is more than quota \"q\" can ever admit (5)",
    );
    error_at(&rule("    cost: 0\n"), 4, 11, "cost must be at least 1");
    assert!(
        Rules::parse(&rule("    cost: 5\n")).is_ok(),
        "a cost the quota admits"
    );
    error_at(
        &rule(
            "    cost: 3\n    overrides:\n      - keys: [x]\n        quotas: [{ algorithm: gcra, limit: 2, period: 1s }]\n",
        ),
        4,
        11,
        "(override 1) can ever admit (2)",
    );
    error_at(
        &rule("    match: { prefix: api/ }\n"),
        4,
        22,
        "must start with /",
    );
    error_at(
        &rule("    match: { prefix: /api//v1 }\n"),
        4,
        22,
        "write \"/api/v1\"",
    );
    error_at(
        &rule("    match: { path: \"/a/../{id}\" }\n"),
        4,
        20,
        "write \"/{id}\"",
    );
    error_at(
        &format!(
            "{HEAD}      - {{ algorithm: gcra, limit: 5, period: 1s, mode: soft, soft_percent: 1001 }}\n"
        ),
        5,
        9,
        "write at most 1000",
    );
    error_at(
        "client_ip:\n  hops: 1000\nrules: []\n",
        2,
        9,
        "write 1 to 64",
    );
    error_at("client_ip:\n  hops: 0\nrules: []\n", 2, 9, "write 1 to 64");
    error_at(
        "client_ip:\n  ipv6_prefix: 0\nrules: []\n",
        2,
        16,
        "write 1 to 128",
    );
    error_at(
        "backend:\n  memory:\n    max_keys: 0\nrules: []\n",
        3,
        15,
        "at least 1",
    );
}

#[test]
fn mistakes_found_after_parsing_still_say_where_they_are() {
    let two = format!("rules:\n  - name: a\n    key: global\n    quotas: [{ONE}]\n");
    let twice = format!("{two}{}", &two["rules:\n".len()..]);
    error_at(&twice, 5, 11, "two rules are named \"a\"");
    error_at(
        "client_ip:\n  trusted_proxies: [10.0.0.0/8]\n  hops: 1\nrules: []\n",
        3,
        9,
        "give trusted_proxies or hops, not both",
    );
    error_at(
        &format!("{two}    overrides:\n      - {{ keys: [x], multiply: 0 }}\n"),
        6,
        9,
        "rule a, override 1: multiply must be at least 1",
    );
    error_at(
        &format!(
            "{two}    overrides:\n      - {{ keys: [x] }}\n      - {{ keys: [y], multiply: 2, quotas: [{ONE}] }}\n"
        ),
        6,
        9,
        "rule a, override 1: give either multiply or quotas",
    );
    // Without the redis feature, the error says the feature is missing; with
    // it, that the URL is not one. Either way it points at the URL.
    error_at(
        "backend:\n  redis:\n    url: \"not a url\"\nrules: []\n",
        3,
        10,
        "backend: redis",
    );
}

#[test]
fn quota_names_clients_could_not_be_sent_are_refused_where_written() {
    for name in ["\"tab\\there\"", "\"caf\u{e9}\"", "\"\"", &"x".repeat(65)] {
        error_at(
            &format!("{HEAD}      - {{ name: {name}, algorithm: gcra, limit: 5, period: 1s }}\n"),
            5,
            9,
            "must be 1 to 64 printable ASCII characters",
        );
    }
    assert!(
        Rules::parse(&format!("{HEAD}      - {{ name: \"per minute (\\\"burst\\\")\", algorithm: gcra, limit: 5, period: 1s }}\n")).is_ok(),
        "spaces, quotes and backslashes are escaped in headers, so they are fine"
    );
}

#[test]
fn concurrency_priority_and_shedding_settings_are_checked_where_written() {
    let rule =
        |extra: &str| format!("rules:\n  - name: a\n    key: global\n    quotas: [{ONE}]\n{extra}");
    let shed = "shedding: { max_in_flight: 8, target_latency: 250ms }\n";
    assert!(
        Rules::parse(&rule(
            "    concurrency: { limit: 4 }\n    priority: critical\n"
        ))
        .is_ok()
    );
    assert!(
        Rules::parse(&format!(
            "{shed}{}",
            rule("    concurrency: { limit: 4, elastic: 8 }\n")
        ))
        .is_ok()
    );
    error_at(
        &rule("    concurrency: { limit: 0 }\n"),
        5,
        27,
        "rule a: concurrency limit must be at least 1",
    );
    error_at(
        &format!(
            "{shed}{}",
            rule("    concurrency: { limit: 4, elastic: 3 }\n")
        ),
        6,
        39,
        "rule a: elastic is 3, below the concurrency limit 4",
    );
    error_at(
        &rule("    concurrency: { limit: 4, elastic: 8 }\n"),
        5,
        39,
        "elastic needs a top-level shedding section",
    );
    error(
        &rule("    concurrency: { limit: 4, ceiling: 8 }\n"),
        5,
        "ceiling",
    );
    error(
        &rule("    priority: urgent\n"),
        5,
        "valid values are background, normal, critical",
    );
    error_at(
        &format!(
            "shedding: {{ max_in_flight: 0, target_latency: 250ms }}\n{}",
            rule("")
        ),
        1,
        28,
        "shedding: max_in_flight must be at least 1",
    );
    error_at(
        &format!(
            "shedding: {{ max_in_flight: 8, target_latency: 0s }}\n{}",
            rule("")
        ),
        1,
        47,
        "the period \"0s\" is zero",
    );
    error_at(
        &format!(
            "shedding:\n  max_in_flight: 8\n  target_latency: 250ms\n  reserved: 0.7\n{}",
            rule("")
        ),
        4,
        13,
        "shedding: the reserved share must be between 0 and 0.5, not 0.7",
    );
    error(
        &format!("shedding: {{ max_in_flight: 8 }}\n{}", rule("")),
        1,
        "target_latency",
    );
}

#[test]
fn elastic_rate_quotas_are_checked_where_written() {
    let shed = "shedding: { max_in_flight: 8, target_latency: 250ms }\n";
    let quota =
        |q: &str| format!("{HEAD}      - {{ algorithm: gcra, limit: 5, period: 1s, {q} }}\n");
    let elastic = quota("mode: elastic, elastic_percent: 100");
    let rules = Rules::parse(&format!("{shed}{elastic}")).unwrap();
    assert!(rules.describe().contains("elastic (+100% with room)"));
    error_at(
        &elastic,
        5,
        56,
        "rule a: quota \"5-per-1s\" is elastic, which needs a top-level shedding section",
    );
    error(
        &format!("{shed}{}", quota("mode: elastic")),
        6,
        "mode elastic needs elastic_percent",
    );
    error(
        &format!("{shed}{}", quota("elastic_percent: 50")),
        6,
        "elastic_percent goes with mode: elastic",
    );
    error(
        &format!("{shed}{}", quota("mode: elastic, elastic_percent: 1001")),
        6,
        "write at most 1000",
    );
    // Overrides with their own quotas are checked too.
    let own = format!(
        "{HEAD}      - {ONE}\n    overrides:\n      - keys: [\"ip:192.0.2.1\"]\n        quotas: [{{ algorithm: gcra, limit: 9, period: 1s, mode: elastic, elastic_percent: 10 }}]\n"
    );
    error(
        &own,
        8,
        "is elastic, which needs a top-level shedding section",
    );
}

#[test]
fn a_rule_may_have_only_a_concurrency_limit() {
    let only = "rules:\n  - name: a\n    key: global\n    concurrency: { limit: 2 }\n";
    let rules = Rules::parse(only).unwrap();
    assert!(rules.describe().contains("at most 2 at once per key"));
    error_at(
        "rules:\n  - name: a\n    key: global\n",
        2,
        11,
        "rule a limits nothing: give it quotas, a concurrency limit, or both",
    );
    error(
        &format!("{only}    overrides:\n      - {{ keys: [gold], multiply: 2 }}\n"),
        6,
        "overrides change rate quotas, and this rule has none",
    );
    error(
        &format!("{only}    count_status: [200]\n"),
        2,
        "count_status counts responses against rate quotas, and this rule has none",
    );
    error(
        "rules:\n  - name: a\n    key: global\n    quotas: [{ algorithm: concurrency, limit: 2 }]\n",
        4,
        "write `concurrency: { limit: N }` on the rule",
    );
    error(
        "rules:\n  - name: a\n    key: global\n    quotas: []\n",
        4,
        "a rule needs at least one quota",
    );
}
