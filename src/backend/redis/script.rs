//! The decision script: its source, its arguments, its reply.

use std::fmt::Write as _;
use std::sync::LazyLock;

use deadpool_redis::redis::{Cmd, Script};
use smallvec::SmallVec;

use crate::algorithm::charge::DEBT_HORIZON;
use crate::decision::Decision;
use crate::quota::{Counts, EXACT_MAX, Params};
use crate::quota_set::{QuotaSet, RawQuotaDecision};

/// The whole script: the Lua files of this folder, concatenated.
pub(crate) const SOURCE: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("token_bucket.lua"),
    include_str!("gcra.lua"),
    include_str!("fixed_window.lua"),
    include_str!("sliding_window.lua"),
    include_str!("sliding_log.lua"),
    include_str!("charge.lua"),
    include_str!("decide.lua"),
);

/// The script's SHA1, the name EVALSHA calls it by.
pub(crate) static SHA1: LazyLock<String> =
    LazyLock::new(|| Script::new(SOURCE).get_hash().to_owned());

/// ARGV slots per quota (see prelude.lua).
const PER_QUOTA: usize = 13;
/// ARGV slots before the quotas' (see prelude.lua).
const HEAD: usize = 7;
/// Numbers returned per quota (see decide.lua).
const REPLY_PER_QUOTA: usize = 7;
/// Numbers returned after the quotas' (see decide.lua).
const REPLY_TAIL: usize = 3;

/// Redis keys of one client key's quotas: `<prefix>{<client key>}:<state id>`.
///
/// The braces are a hash tag, so all keys of one decision live in one
/// cluster slot. Braces in the client key would end the tag early (and `{}`
/// would void it), so `{`, `}` and `%` are percent-encoded; an empty key is
/// spelled `%`, which no encoded key is.
pub(crate) fn redis_keys(prefix: &str, key: &str, quotas: &QuotaSet) -> Vec<String> {
    let mut tag = String::with_capacity(prefix.len() + key.len() + 4);
    tag.push_str(prefix);
    tag.push('{');
    if key.is_empty() {
        tag.push('%');
    }
    for c in key.chars() {
        match c {
            '{' => tag.push_str("%7B"),
            '}' => tag.push_str("%7D"),
            '%' => tag.push_str("%25"),
            c => tag.push(c),
        }
    }
    tag.push_str("}:");
    quotas
        .state_ids()
        .iter()
        .map(|id| {
            let mut k = String::with_capacity(tag.len() + 16);
            k.push_str(&tag);
            let _ = write!(k, "{id:016x}");
            k
        })
        .collect()
}

/// What one call asks of the script.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ask {
    pub cost: u64,
    pub commit: bool,
    /// Units wanted: the cost, or more for a lease.
    pub want: u64,
    /// Units of an earlier lease given back, and the Redis time of that
    /// lease.
    pub give_back: Option<(u64, u64)>,
}

/// The script's arguments after KEYS: time ('' for Redis's TIME), cost,
/// commit flag, expiry slack, units wanted, units given back and since when,
/// then each quota's parameters. Without `room`, an elastic quota's margin
/// is sent, which the request must leave unspent; with room, 0.
pub(crate) fn arguments(
    quotas: &QuotaSet,
    now: Option<u64>,
    ask: &Ask,
    slack_ms: u64,
    room: bool,
) -> Vec<String> {
    let mut args = Vec::with_capacity(HEAD + PER_QUOTA * quotas.quotas().len());
    args.push(now.map_or_else(String::new, |n| n.to_string()));
    args.push(ask.cost.to_string());
    args.push(if ask.commit { "1" } else { "0" }.to_owned());
    args.push(slack_ms.to_string());
    args.push(ask.want.max(ask.cost).to_string());
    let (back, since) = ask.give_back.unwrap_or((0, 0));
    args.push(back.to_string());
    args.push(since.to_string());
    let requests = crate::quota_set::requests(ask.cost, ask.commit);
    push_quotas(&mut args, quotas, room, now, requests);
    args
}

/// `args` from [`arguments`] with no units given back (ARGV[6] set to 0),
/// for sending again a call that may have run: the give-back must reach
/// Redis at most once, and units lost when it did not are the strict side.
pub(crate) fn without_give_back(args: &[String]) -> Vec<String> {
    let mut args = args.to_vec();
    if let Some(back) = args.get_mut(5) {
        "0".clone_into(back);
    }
    args
}

/// Each quota's parameters, as prelude.lua reads them. A calendar quota's
/// windows are worked out here, for `now` (the script's time, else this
/// machine's clock): the Lua has no time zone rules. A quota counting
/// requests is told the `requests` it spends (the others spend the cost).
fn push_quotas(
    args: &mut Vec<String>,
    quotas: &QuotaSet,
    room: bool,
    now: Option<u64>,
    requests: u64,
) {
    for q in quotas.quotas() {
        let p = &q.params;
        args.push(q.algorithm().name().to_owned());
        for n in [p.period.get(), p.capacity, p.interval, p.unit, p.refill] {
            args.push(n.to_string());
        }
        args.push(if p.count_rejected { "1" } else { "0" }.to_owned());
        args.push(if p.shadow { "1" } else { "0" }.to_owned());
        args.push(if room { 0 } else { p.elastic_margin }.to_string());
        let [start, end, next] = match p.calendar {
            Some(c) => {
                let t = now.unwrap_or_else(|| {
                    crate::clock::Clock::now(&crate::clock::SystemClock).as_micros()
                });
                let (start, end) = c.at(t);
                [start, end, c.end_of(end)]
            }
            None => [0, 0, 0],
        };
        for n in [start, end, next] {
            args.push(n.to_string());
        }
        args.push(match q.counts() {
            Counts::Requests => requests.to_string(),
            _ => String::new(),
        });
    }
}

/// The script's arguments to give back `[cost, requests]` of a
/// reservation that `decision` admitted at `at` (Redis time): mode '2',
/// the time in ARGV[7], and after the quotas' parameters, per quota, the
/// moment the reservation left it full again ('' where it spent nothing,
/// or where nothing of its units goes back).
pub(crate) fn give_back_arguments(
    quotas: &QuotaSet,
    now: Option<u64>,
    decision: &Decision,
    [cost, requests]: [u64; 2],
    at: u64,
    slack_ms: u64,
) -> Vec<String> {
    let n = quotas.quotas().len();
    let mut args = Vec::with_capacity(HEAD + (PER_QUOTA + 1) * n);
    args.push(now.map_or_else(String::new, |n| n.to_string()));
    args.push(cost.to_string());
    args.push("2".to_owned());
    args.push(slack_ms.to_string());
    args.push(cost.to_string());
    args.push("0".to_owned());
    args.push(at.to_string());
    push_quotas(&mut args, quotas, false, now, requests);
    let answers = decision.quotas();
    for (i, quota) in quotas.quotas().iter().enumerate() {
        let back = quota.units(cost, requests);
        args.push(match answers.get(i) {
            Some(q) if decision.allowed() && q.allowed() && back > 0 => {
                at.saturating_add(q.reset_micros()).to_string()
            }
            _ => String::new(),
        });
    }
    args
}

/// The script's arguments to charge `cost` whatever is left (usage beyond
/// a reservation): mode '3'.
pub(crate) fn charge_arguments(
    quotas: &QuotaSet,
    now: Option<u64>,
    cost: u64,
    slack_ms: u64,
) -> Vec<String> {
    let mut args = Vec::with_capacity(HEAD + PER_QUOTA * quotas.quotas().len());
    args.push(now.map_or_else(String::new, |n| n.to_string()));
    args.push(cost.to_string());
    args.push("3".to_owned());
    args.push(slack_ms.to_string());
    args.push(cost.to_string());
    args.push("0".to_owned());
    args.push("0".to_owned());
    // The request was counted when reserved: no request is charged.
    push_quotas(&mut args, quotas, false, now, 0);
    args
}

/// `EVALSHA <sha> ...` or, to load the script, `EVAL <source> ...`.
pub(crate) fn command(load: bool, keys: &[String], args: &[String]) -> Cmd {
    let mut cmd = if load {
        let mut c = deadpool_redis::redis::cmd("EVAL");
        c.arg(SOURCE);
        c
    } else {
        let mut c = deadpool_redis::redis::cmd("EVALSHA");
        c.arg(SHA1.as_str());
        c
    };
    cmd.arg(keys.len()).arg(keys).arg(args);
    cmd
}

/// What the script answered.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    /// One per quota, in order.
    pub verdicts: SmallVec<[RawQuotaDecision; 2]>,
    /// Per quota: when this admission left it empty, microseconds until it
    /// admits one more unit; 0 otherwise.
    pub next_free: SmallVec<[u64; 2]>,
    /// Units spent in Redis: the cost, a whole lease, or 0 if refused.
    pub spent: u64,
    /// Redis's time of the decision (microseconds).
    pub now: u64,
    /// Microseconds a lease may last at most (a window's end); 0: no bound.
    pub lease_ends: u64,
}

/// The longest wait, in microseconds, that a quota with parameters `p` can
/// report as a reset, retry-after, delay or replenish: the longest of its
/// period, its bucket's depth (GCRA, leaky bucket) and its refill from empty
/// (token bucket), three times over: a sliding window's reset reaches twice
/// its period, and the third leaves room for a Redis clock stepped back by
/// up to one such span (a failover to a replica whose clock is behind),
/// which the algorithms add to their waits.
fn longest_wait(p: &Params) -> u64 {
    let depth = p.capacity.saturating_mul(p.interval);
    let refill = match p.refill {
        0 => 0,
        r => p.capacity.saturating_mul(p.unit).div_ceil(r),
    };
    p.period.get().max(depth).max(refill).saturating_mul(3)
}

/// The reply's numbers read, or what is wrong with them. A reply is taken
/// only if every number is within what the quotas and the request allow
/// (see `longest_wait`): a Redis that lies (a script replaced, a proxy in
/// between) could otherwise hang a request on a delay of centuries, or
/// send `Retry-After` values the denial cache would then serve.
/// `most_spent` is the most units the call may spend: its cost, or the
/// units a lease asked for.
pub(crate) fn reply(reply: &[i64], quotas: &QuotaSet, most_spent: u64) -> Result<Reply, String> {
    let count = quotas.quotas().len();
    let expected = count * REPLY_PER_QUOTA + REPLY_TAIL;
    if reply.len() != expected {
        return Err(format!(
            "the script returned {} numbers for {count} quotas; expected {expected}",
            reply.len(),
        ));
    }
    // Each number with its name and its largest allowed value.
    let get = |n: i64, what: &str, most: u64| match u64::try_from(n) {
        Ok(v) if v <= most => Ok(v),
        _ => Err(format!(
            "the script returned {what} {n}, out of bounds (0 to {most})"
        )),
    };
    let (per_quota, tail) = reply.split_at(count * REPLY_PER_QUOTA);
    let longest = quotas
        .quotas()
        .iter()
        .map(|q| longest_wait(&q.params))
        .max()
        .unwrap_or(0);
    let mut out = Reply {
        verdicts: SmallVec::new(),
        next_free: SmallVec::new(),
        spent: get(tail[0], "units spent", most_spent)?,
        now: get(tail[1], "time", EXACT_MAX)?,
        lease_ends: get(tail[2], "lease end", longest)?,
    };
    for (n, q) in per_quota.chunks_exact(REPLY_PER_QUOTA).zip(quotas.quotas()) {
        let p = &q.params;
        let wait = longest_wait(p);
        // A quota in debt (usage charged past its limit) waits the debt
        // off: up to the horizon a charge may reach, beyond its own waits.
        let owed = wait.saturating_add(DEBT_HORIZON);
        out.verdicts.push(RawQuotaDecision {
            allowed: get(n[0], "verdict", 1)? == 1,
            remaining: get(n[1], "remaining", p.capacity)?,
            reset: get(n[2], "reset", owed)?,
            retry_after: get(n[3], "retry-after", owed)?,
            delay: get(n[4], "delay", wait)?,
            replenish: get(n[6], "replenish", owed)?,
        });
        out.next_free.push(get(n[5], "next free unit", wait)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
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

#[cfg(test)]
mod bounds {
    use super::*;
    use crate::Quota;
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

#[cfg(test)]
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
            ("decision script", super::SOURCE),
            ("concurrency.lua", include_str!("concurrency.lua")),
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
