//! The script's keys, arguments and replies checked in Rust, and the Lua
//! it may call.

mod keys {
    use crate::Quota;
    use crate::backend::redis::script::*;
    use crate::quota::Algorithm;
    use std::time::Duration;

    #[test]
    fn every_key_of_a_decision_carries_the_same_non_empty_tag() {
        let set = QuotaSet::new(
            "s",
            [
                Quota::gcra(1, Duration::from_secs(1)).build().unwrap(),
                Quota::fixed_window(1, Duration::from_secs(1))
                    .name("fw")
                    .build()
                    .unwrap(),
            ],
        )
        .unwrap();
        let tag = |k: &str| {
            let open = k.find('{').unwrap();
            let close = open + k[open..].find('}').unwrap();
            k[open + 1..close].to_owned()
        };
        for client in ["user:1", "", "}", "{}", "a}b{c", "%7D", "%"] {
            let keys = redis_keys("rl:", client, &set);
            assert_eq!(keys.len(), 2);
            assert!(!tag(&keys[0]).is_empty(), "{client:?}: {keys:?}");
            assert_eq!(tag(&keys[0]), tag(&keys[1]), "{client:?}");
        }
        // Distinct client keys, distinct Redis keys.
        let all: std::collections::HashSet<_> = ["}", "%7D", "%", "", "%25"]
            .iter()
            .map(|c| redis_keys("rl:", c, &set)[0].clone())
            .collect();
        assert_eq!(all.len(), 5);
        assert_eq!(
            redis_keys("rl:", "user:1", &set)[0],
            format!("rl:{{user:1}}:{:016x}", set.state_ids()[0])
        );
    }

    #[test]
    fn the_script_is_assembled_from_every_algorithm() {
        for a in Algorithm::ALL {
            assert!(
                SOURCE.contains(&format!("algorithms.{} = function", a.name())),
                "{a}"
            );
        }
        assert_eq!(SHA1.len(), 40);
    }
}

mod bounds {
    use crate::Quota;
    use crate::backend::redis::script::*;
    use std::time::Duration;

    /// A reply for one quota: the verdict's seven numbers, then spent, time
    /// and lease end.
    fn one(numbers: [i64; 7], spent: i64) -> Vec<i64> {
        let mut r = numbers.to_vec();
        r.extend([spent, 1_700_000_000_000_000, 0]);
        r
    }

    #[test]
    fn numbers_beyond_what_the_quota_allows_are_refused() {
        let leaky = QuotaSet::new(
            "s",
            [Quota::leaky_bucket(10, Duration::from_secs(1))
                .build()
                .unwrap()],
        )
        .unwrap();
        let fine = reply(&one([1, 3, 900_000, 0, 100_000, 0, 100_000], 1), &leaky, 1).unwrap();
        assert_eq!(fine.verdicts[0].delay, 100_000);
        // Three seconds is the bound for a one-second quota.
        assert!(reply(&one([1, 3, 0, 0, 3_000_000, 0, 0], 1), &leaky, 1).is_ok());
        // A debt charged past the limit waits up to the charge's horizon.
        let debt = (1 << 40) + 3_000_000;
        assert!(reply(&one([0, 0, debt, debt, 0, 0, debt], 0), &leaky, 1).is_ok());
        assert!(reply(&one([0, 0, 0, debt + 1, 0, 0, 0], 0), &leaky, 1).is_err());
        let lies = [
            one([1, 3, 0, 0, 1 << 62, 0, 0], 1),
            one([0, 0, 0, 1 << 53, 0, 0, 0], 0),
            one([1, 3, 0, 0, 3_000_001, 0, 0], 1),
            one([1, 11, 0, 0, 0, 0, 0], 1),
            one([2, 0, 0, 0, 0, 0, 0], 1),
            one([1, 0, 0, 0, 0, 1 << 40, 0], 1),
            one([1, 0, -1, 0, 0, 0, 0], 1),
            one([1, 0, 0, 0, 0, 0, 0], 2),
        ];
        for lie in lies {
            let err = reply(&lie, &leaky, 1).unwrap_err();
            assert!(err.contains("out of bounds"), "{lie:?}: {err}");
        }
        let mut late = one([1, 0, 0, 0, 0, 0, 0], 1);
        late[8] = (1 << 53) + 1;
        assert!(reply(&late, &leaky, 1).is_err());
    }
}

mod lua_subset {
    use std::collections::BTreeSet;

    /// What the scripts may call from Lua's environment: Lua 5.1's as Redis
    /// 7.0 and 8.2 and Valkey 9.1 ship it (the conformance suite runs the
    /// scripts on all three), less what Dragonfly, on Lua 5.4, lacks
    /// (`table.maxn`, `table.getn`, `math.pow`, `math.mod`, `loadstring`,
    /// `setfenv`...), and less the optional libraries (`cjson`, `bit`,
    /// `struct`, `cmsgpack`) a build may leave out.
    const SUBSET: [&str; 25] = [
        "error",
        "ipairs",
        "pairs",
        "select",
        "tonumber",
        "tostring",
        "type",
        "unpack",
        "math.abs",
        "math.ceil",
        "math.floor",
        "math.fmod",
        "math.max",
        "math.min",
        "string.find",
        "string.format",
        "string.len",
        "string.match",
        "string.sub",
        "table.concat",
        "table.insert",
        // Only as `unpack or table.unpack`: Lua 5.4 moved it there.
        "table.unpack",
        "redis.call",
        "redis.error_reply",
        "redis.replicate_commands",
    ];

    /// The source with comments and string literals blanked out.
    fn code(source: &str) -> String {
        let mut out = String::with_capacity(source.len());
        for line in source.lines() {
            let mut quote = None;
            let mut chars = line.chars().peekable();
            while let Some(c) = chars.next() {
                match quote {
                    Some(q) if c == q => quote = None,
                    Some(_) if c == '\\' => {
                        chars.next();
                    }
                    Some(_) => {}
                    None if c == '\'' || c == '"' => {
                        quote = Some(c);
                        out.push_str("''");
                    }
                    None if c == '-' && chars.peek() == Some(&'-') => break,
                    None => out.push(c),
                }
            }
            out.push('\n');
        }
        out
    }

    /// Every name called (`a.b(`, `f (`), and every name the scripts
    /// declare (locals, functions, parameters, loop variables).
    fn calls_and_locals(code: &str) -> (BTreeSet<String>, BTreeSet<String>) {
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        let (mut calls, mut locals) = (BTreeSet::new(), BTreeSet::new());
        let bytes: Vec<char> = code.chars().collect();
        let mut i = 0;
        let mut previous = String::new();
        let mut in_params = false;
        while i < bytes.len() {
            let c = bytes[i];
            if word(c) && !c.is_ascii_digit() && (i == 0 || bytes[i - 1] != '.') {
                let start = i;
                while i < bytes.len() && (word(bytes[i]) || bytes[i] == '.') {
                    i += 1;
                }
                let name: String = bytes[start..i].iter().collect();
                let mut j = i;
                while j < bytes.len() && bytes[j] == ' ' {
                    j += 1;
                }
                let root = name.split('.').next().unwrap_or_default().to_owned();
                if KEYWORDS.contains(&name.as_str()) {
                    // Neither a call nor a name declared.
                } else if in_params || matches!(previous.as_str(), "local" | "function" | "for") {
                    locals.insert(root.clone());
                } else if j < bytes.len() && bytes[j] == '(' {
                    calls.insert(name.clone());
                }
                previous = name;
                continue;
            }
            match c {
                '(' if previous == "function" || in_params_after_name(&bytes, i) => {
                    in_params = true
                }
                ')' => in_params = false,
                _ => {}
            }
            if !c.is_whitespace() && c != ',' {
                previous.clear();
            }
            i += 1;
        }
        (calls, locals)
    }

    const KEYWORDS: [&str; 9] = [
        "and", "elseif", "function", "if", "not", "or", "return", "until", "while",
    ];

    /// Whether the `(` at `i` opens the parameters of `function name(`.
    fn in_params_after_name(bytes: &[char], i: usize) -> bool {
        let before: String = bytes[..i].iter().collect();
        let trimmed = before.trim_end();
        let name_start = trimmed
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .map_or(0, |p| p + 1);
        trimmed[..name_start].trim_end().ends_with("function")
    }

    #[test]
    fn the_scripts_call_only_the_lua_every_server_has() {
        let sources = [
            ("decision script", crate::backend::redis::script::SOURCE),
            ("concurrency.lua", include_str!("../concurrency.lua")),
        ];
        for (name, source) in sources {
            let (calls, locals) = calls_and_locals(&code(source));
            assert!(calls.contains("redis.call"), "{name}: {calls:?}");
            for call in &calls {
                let root = call.split('.').next().unwrap_or_default();
                assert!(
                    SUBSET.contains(&call.as_str()) || locals.contains(root),
                    "{name} calls {call}, outside the subset every server runs: {SUBSET:?}"
                );
            }
        }
    }

    #[test]
    fn the_subset_check_sees_what_dragonfly_lacks() {
        let (calls, locals) = calls_and_locals(&code(
            "local function f(a, b) return table.maxn(a) end\n-- math.pow(2, 3)\nlocal s = 'x.y(1)'\nf(1, 2)\n",
        ));
        assert!(calls.contains("table.maxn"), "{calls:?}");
        assert!(
            !calls.contains("math.pow") && !calls.contains("x.y"),
            "{calls:?}"
        );
        assert!(
            locals.contains("f") && locals.contains("a") && locals.contains("s"),
            "{locals:?}"
        );
        assert!(!SUBSET.contains(&"table.maxn"));
    }
}
