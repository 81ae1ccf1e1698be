//! The rules' parsers on random input: path and host normalisation and the
//! rules file. Every test here is named `parse_*` so that
//! `scripts/fuzz-parsers.sh` can run them for longer (PROPTEST_CASES).
#![cfg(feature = "rules")]

use proptest::prelude::*;
use tollgate::rules::{Rules, normalize_host, normalize_path};

/// Paths made of the characters that matter to normalisation: slashes,
/// dots, escapes (valid, broken, of unreserved and reserved characters),
/// letters of both cases, path parameters, multi-byte characters raw and
/// encoded, and the bytes a lenient parser lets through raw.
fn paths() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "/",
        "/",
        "//",
        ".",
        "..",
        "%",
        "%2",
        "%2e",
        "%2E",
        "%2f",
        "%5C",
        "%75",
        "%7e",
        "%41",
        "%20",
        "%zz",
        "a",
        "B",
        "~",
        "-",
        "_",
        "é",
        "\\",
        "{id}",
        "?",
        ";",
        ";jsessionid=1",
        "..;",
        "%3B",
        "%C3%A9",
        "%c3%a9",
        "ü",
        "\"",
        "|",
        "^",
        "[",
        " ",
    ]);
    (any::<bool>(), prop::collection::vec(piece, 0..24)).prop_map(|(rooted, pieces)| {
        let body: String = pieces.concat();
        if rooted { format!("/{body}") } else { body }
    })
}

/// Hosts made of what matters to their normal form: labels of both cases,
/// dots, ports (the default one, others, broken), brackets and characters
/// no host holds.
fn hosts() -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        "admin",
        "EXAMPLE",
        "a",
        ".",
        ".",
        ":",
        ":80",
        ":080",
        ":8080",
        ":99999",
        "[",
        "]",
        "::1",
        "2001:DB8::",
        "%41",
        "@",
        " ",
        "é",
        "-",
        "_",
        "1",
    ]);
    prop::collection::vec(piece, 0..10).prop_map(|pieces| pieces.concat())
}

proptest! {
    #[test]
    fn parse_normalised_paths_are_normal_and_stable(path in paths()) {
        let Ok(normal) = normalize_path(&path) else { return Ok(()) };
        prop_assert!(normal.starts_with('/'), "{path:?} -> {normal:?}");
        for bad in ["//", "/./", "/../"] {
            prop_assert!(!normal.contains(bad), "{path:?} -> {normal:?}");
        }
        prop_assert!(!normal.ends_with("/.") && !normal.ends_with("/.."), "{path:?} -> {normal:?}");
        let again = normalize_path(&normal);
        prop_assert_eq!(again.as_deref(), Ok(&*normal), "not idempotent for {:?}", path);
        // An escape left in the normal form is never of an unreserved
        // character, and always upper-case.
        for (i, _) in normal.match_indices('%') {
            let hex = &normal[i + 1..i + 3];
            prop_assert_eq!(hex, hex.to_ascii_uppercase());
            let byte = u8::from_str_radix(hex, 16).unwrap();
            prop_assert!(!(byte.is_ascii_alphanumeric() || b"-._~".contains(&byte)));
        }
    }

    #[test]
    fn parse_normal_paths_hold_no_parameter_and_only_ascii(path in paths()) {
        let Ok(normal) = normalize_path(&path) else { return Ok(()) };
        prop_assert!(!normal.contains(';'), "{path:?} -> {normal:?}");
        prop_assert!(
            normal.bytes().all(|b| b.is_ascii_graphic() && !b"\"<>[\\]^`{|}".contains(&b)),
            "{path:?} -> {normal:?}"
        );
    }

    #[test]
    fn parse_raw_and_encoded_spellings_of_a_path_are_one_path(path in paths()) {
        let mut encoded = String::new();
        for c in path.chars() {
            if c.is_ascii() {
                encoded.push(c);
            } else {
                let mut utf8 = [0u8; 4];
                for b in c.encode_utf8(&mut utf8).bytes() {
                    encoded.push_str(&format!("%{b:02x}"));
                }
            }
        }
        prop_assert_eq!(normalize_path(&path), normalize_path(&encoded));
    }

    #[test]
    fn parse_any_text_as_a_path_without_panicking(path in any::<String>()) {
        let _ = normalize_path(&path);
    }

    #[test]
    fn parse_normal_hosts_are_normal_and_stable(host in hosts()) {
        let Some(normal) = normalize_host(&host) else { return Ok(()) };
        prop_assert_eq!(normalize_host(&normal), Some(normal.clone()), "{:?}", host);
        prop_assert!(!normal.bytes().any(|b| b.is_ascii_uppercase()), "{host:?} -> {normal:?}");
        prop_assert!(!normal.ends_with(":80") && !normal.ends_with(':'), "{host:?} -> {normal:?}");
        let name = normal.rsplit_once("]:").map_or(&*normal, |(n, _)| n);
        prop_assert!(!name.ends_with('.') && !name.contains(".."), "{host:?} -> {normal:?}");
        // Case, one trailing dot and the default port are all it forgives.
        let upper = host.to_ascii_uppercase();
        prop_assert_eq!(normalize_host(&upper), Some(normal));
    }

    #[test]
    fn parse_any_text_as_a_host_without_panicking(host in any::<String>()) {
        let _ = normalize_host(&host);
    }

    #[test]
    fn parse_any_text_as_a_rules_file_without_panicking(text in any::<String>()) {
        let _ = Rules::parse(&text);
    }

    /// The commented example, damaged: a range cut out, text inserted, a
    /// line repeated. Errors are fine; panics are not.
    #[test]
    fn parse_damaged_rules_files_without_panicking(
        cut in (0usize..4000, 0usize..200),
        insert in (0usize..4000, "[ -~\n\t{}\\[\\]:,'\"&*!|>#-]{0,40}"),
        repeat in 0usize..130,
    ) {
        let text = crate::support::damaged(EXAMPLE, cut, (insert.0, &insert.1), repeat);
        let _ = Rules::parse(&text);
    }
}

const EXAMPLE: &str = include_str!("../../examples/rules.yaml");
