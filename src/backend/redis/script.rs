//! The decision script: its source, its arguments, its reply.

use std::fmt::Write as _;
use std::sync::LazyLock;

use deadpool_redis::redis::{Cmd, Script};
use smallvec::SmallVec;

use crate::decision::Decision;
use crate::quota_set::{QuotaSet, RawQuotaDecision};

/// The whole script: the Lua files of this folder, concatenated.
pub(crate) const SOURCE: &str = concat!(
    include_str!("prelude.lua"),
    include_str!("token_bucket.lua"),
    include_str!("gcra.lua"),
    include_str!("fixed_window.lua"),
    include_str!("sliding_window.lua"),
    include_str!("sliding_log.lua"),
    include_str!("decide.lua"),
);

/// The script's SHA1, the name EVALSHA calls it by.
pub(crate) static SHA1: LazyLock<String> =
    LazyLock::new(|| Script::new(SOURCE).get_hash().to_owned());

/// ARGV slots per quota (see prelude.lua).
const PER_QUOTA: usize = 9;
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
    push_quotas(&mut args, quotas, room);
    args
}

/// Each quota's parameters, as prelude.lua reads them.
fn push_quotas(args: &mut Vec<String>, quotas: &QuotaSet, room: bool) {
    for q in quotas.quotas() {
        let p = &q.params;
        args.push(q.algorithm().name().to_owned());
        for n in [p.period.get(), p.capacity, p.interval, p.unit, p.refill] {
            args.push(n.to_string());
        }
        args.push(if p.count_rejected { "1" } else { "0" }.to_owned());
        args.push(if p.shadow { "1" } else { "0" }.to_owned());
        args.push(if room { 0 } else { p.elastic_margin }.to_string());
    }
}

/// The script's arguments to give back a reservation of `cost` that
/// `decision` admitted at `at` (Redis time): mode '2', the time in
/// ARGV[7], and after the quotas' parameters, per quota, the moment the
/// reservation left it full again ('' where it spent nothing).
pub(crate) fn give_back_arguments(
    quotas: &QuotaSet,
    now: Option<u64>,
    decision: &Decision,
    cost: u64,
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
    push_quotas(&mut args, quotas, false);
    let answers = decision.quotas();
    for i in 0..n {
        args.push(match answers.get(i) {
            Some(q) if decision.allowed() && q.allowed() => {
                at.saturating_add(q.reset_micros()).to_string()
            }
            _ => String::new(),
        });
    }
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

/// The reply's numbers read, or what is wrong with them.
pub(crate) fn reply(reply: &[i64], quotas: usize) -> Result<Reply, String> {
    let expected = quotas * REPLY_PER_QUOTA + REPLY_TAIL;
    if reply.len() != expected {
        return Err(format!(
            "the script returned {} numbers for {quotas} quotas; expected {expected}",
            reply.len(),
        ));
    }
    let get = |n: i64| u64::try_from(n).map_err(|_| format!("the script returned {n}"));
    let (per_quota, tail) = reply.split_at(quotas * REPLY_PER_QUOTA);
    let mut out = Reply {
        verdicts: SmallVec::new(),
        next_free: SmallVec::new(),
        spent: get(tail[0])?,
        now: get(tail[1])?,
        lease_ends: get(tail[2])?,
    };
    for n in per_quota.chunks_exact(REPLY_PER_QUOTA) {
        out.verdicts.push(RawQuotaDecision {
            allowed: get(n[0])? == 1,
            remaining: get(n[1])?,
            reset: get(n[2])?,
            retry_after: get(n[3])?,
            delay: get(n[4])?,
            replenish: get(n[6])?,
        });
        out.next_free.push(get(n[5])?);
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
