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
mod tests;
