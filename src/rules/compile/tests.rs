//! What a rules file is refused for when compiled: listed and override
//! keys no rule could build.

use crate::rules::Rules;

const RULES: &str = "rules:\n  - name: api\n    key: header:x-api-key\n    quotas: [{ name: q, algorithm: gcra, limit: 5, period: 1m }]\n";

#[test]
fn a_listed_key_no_rule_could_build_is_refused_with_its_spelling() {
    let err = Rules::parse(&format!("deny: {{ keys: [\"revoked\"] }}\n{RULES}"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("deny: keys: \"revo…\" can never match"),
        "{err}"
    );
    assert!(err.contains("\"key:revo…\""), "{err}");
    assert!(!err.contains("revoked"), "the key is shortened: {err}");
    let err = Rules::parse(&format!("allow: {{ keys: [\"vip\"] }}\n{RULES}"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("allow: keys: \"vip\" can never match"),
        "{err}"
    );
    for good in [
        "key:revoked",
        "user:7",
        "ip:192.0.2.1",
        "global",
        "key:a|ip:192.0.2.1",
    ] {
        let yaml = format!("deny: {{ keys: [\"{good}\"] }}\n{RULES}");
        assert!(Rules::parse(&yaml).is_ok(), "{good}");
    }
}

#[test]
fn a_listed_route_is_refused_unless_written_as_its_key() {
    let parsed = |key: &str| Rules::parse(&format!("deny: {{ keys: [{key:?}] }}\n{RULES}"));
    for (written, built) in [
        ("route:get /login", "route:GET /login"),
        ("route:HEAD /login", "route:GET /login"),
    ] {
        let err = parsed(written).unwrap_err().to_string();
        assert!(
            err.contains(&format!("a request's key is written {built:?}")),
            "{written}: {err}"
        );
    }
    let err = parsed("route:/login").unwrap_err().to_string();
    assert!(err.contains("write route:<METHOD> <route>"), "{err}");
    assert!(parsed("route:POST /users/{id}").is_ok());
}

#[test]
fn an_override_key_no_request_builds_is_refused() {
    let with = |key: &str| {
        Rules::parse(&format!(
            "{RULES}    overrides:\n      - {{ keys: [{key:?}], multiply: 3 }}\n"
        ))
    };
    let err = with("gold").unwrap_err().to_string();
    assert!(
        err.contains("rule api: overrides: keys: \"gold\" can never match"),
        "{err}"
    );
    assert!(with("key:gold").is_ok());
    let err = with("ip:::ffff:192.0.2.1").unwrap_err().to_string();
    assert!(err.contains("\"ip:192.0.2.1\""), "{err}");
}

#[test]
fn an_override_key_of_another_shape_than_its_rules_keys_is_refused() {
    let with = |key: &str| {
        Rules::parse(&format!(
            "rules:\n  - name: api\n    key: [header:x-api-key, route]\n    \
             quotas: [{{ name: q, algorithm: gcra, limit: 5, period: 1m }}]\n    \
             overrides:\n      - {{ keys: [{key:?}], multiply: 3 }}\n"
        ))
    };
    for wrong in [
        "key:gold",
        "route:GET /x|key:gold",
        "key:gold|route:GET /x|global",
    ] {
        let err = with(wrong).unwrap_err().to_string();
        assert!(
            err.contains("can never match: this rule's keys are written key:…|route:…"),
            "{wrong}: {err}"
        );
        assert!(!err.contains("gold"), "the key is shortened: {err}");
    }
    assert!(with("key:gold|route:GET /x").is_ok());
}

#[test]
fn a_listed_address_is_refused_unless_written_as_a_clients_key() {
    let parsed = |key: &str| Rules::parse(&format!("deny: {{ keys: [{key:?}] }}\n{RULES}"));
    for (written, built) in [
        ("ip:::ffff:192.0.2.1", "ip:192.0.2.1"),
        ("ip:2001:db8::1", "ip:2001:db8::/64"),
        ("ip:2001:DB8::/64", "ip:2001:db8::/64"),
        ("key:a|ip:::ffff:192.0.2.1", "ip:192.0.2.1"),
    ] {
        let err = parsed(written).unwrap_err().to_string();
        assert!(
            err.contains(&format!("a request's key is written {built:?}")),
            "{written}: {err}"
        );
    }
    for bad in [
        "ip:192.0.2.300",
        "ip:192.0.2.0/24",
        "ip:2001:db8::/48",
        "ip:",
    ] {
        let err = parsed(bad).unwrap_err().to_string();
        assert!(err.contains("write an address after ip:"), "{bad}: {err}");
    }
    // Written as built, and a header value holding an escaped `|ip:`.
    for good in ["ip:2001:db8::/64", "ip:192.0.2.1", "key:x\\|ip:zzz"] {
        assert!(parsed(good).is_ok(), "{good}");
    }
}
