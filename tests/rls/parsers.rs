//! Envoy rate limit configuration files as an operator may damage them:
//! any text, and a full example cut, spliced and repeated, is refused with
//! an error, never a panic. Named `parse_*`, so `scripts/fuzz-parsers.sh`
//! runs them on far more input.

use proptest::prelude::*;
use tollgate::rls::{LoadOptions, RlsConfig};

/// Every field the files take, nested.
const EXAMPLE: &str = r#"domain: edge
descriptors:
  - key: user
    rate_limit: { name: per-user, unit: hour, requests_per_unit: 3 }
  - key: tenant
    value: acme
    descriptors:
      - key: plan
        rate_limit: { unit: minute, requests_per_unit: 5 }
      - key: plan
        value: gold
        rate_limit: { unit: minute, requests_per_unit: 10, cost: 4 }
  - key: client
    value: internal
  - key: path
    value: /api/*
    share_threshold: true
    detailed_metric: true
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: blocked
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: health
    rate_limit: { unlimited: true }
  - key: modern
    shadow_mode: true
    quota_mode: true
    rate_limit:
      unit: day
      requests_per_unit: 50
      replaces: [{ name: per-user }]
"#;

fn parse(text: &str) -> Result<RlsConfig, tollgate::rls::RlsConfigError> {
    RlsConfig::parse_files(
        [("f.yaml".to_owned(), text.to_owned())],
        LoadOptions::default(),
    )
}

#[test]
fn the_example_is_a_valid_file() {
    let config = parse(EXAMPLE).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.domains(), ["edge"]);
}

proptest! {
    #[test]
    fn parse_any_text_as_an_rls_file_without_panicking(text in any::<String>()) {
        let _ = parse(&text);
    }

    /// The example, damaged: a range cut out, text inserted, a line
    /// repeated. Errors are fine; panics are not.
    #[test]
    fn parse_damaged_rls_files_without_panicking(
        cut in (0usize..1200, 0usize..120),
        insert in (0usize..1200, "[ -~\n\t{}\\[\\]:,'\"&*!|>#-]{0,40}"),
        repeat in 0usize..40,
    ) {
        let text = crate::support::damaged(EXAMPLE, cut, (insert.0, &insert.1), repeat);
        let _ = parse(&text);
    }
}
