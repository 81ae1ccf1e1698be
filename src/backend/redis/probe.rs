//! A Redis that refuses the scripts: told apart from an outage when it
//! answers, and found before serving by running the scripts once.
//!
//! An ACL user without the commands the scripts send, `EVALSHA` renamed
//! away, a Valkey without its Lua engine, a Redis full under `noeviction`:
//! each answers every call with the same error, for as long as nobody fixes
//! it, and the failure policy then decides every request (by default, lets
//! it through). Such an error is its own kind,
//! [`Misconfigured`](crate::backend::BackendErrorKind::Misconfigured), and
//! [`RedisBackend::probe`](super::RedisBackend::probe) meets it at start.

use std::time::Duration;

use deadpool_redis::redis::{RedisError, Script};

use super::backend::Inner;
use super::connection::Conn;
use super::script::{self, Ask};
use crate::backend::{BackendError, BackendErrorKind};
use crate::quota::Quota;
use crate::quota_set::QuotaSet;

/// What the Redis user must be allowed: the scripting commands (`EVAL`
/// loads the decision script, `SCRIPT LOAD` the concurrency one) and every
/// command the scripts send. Keys: `~<prefix>*`.
pub(crate) const ACL_COMMANDS: &str = "+evalsha +eval +script|load +time +get +set +del +hmget \
     +hset +pexpire +zadd +zcard +zcount +zrange +zrem +zremrangebyrank +zremrangebyscore";

/// The client key the probe decides for (under the backend's prefix): new
/// at each probe, so that state an earlier probe left (for a second) cannot
/// spare this one the writes an admission makes.
fn probe_key() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("tollgate:probe:{}:{nanos:x}", std::process::id())
}

/// The first call may have to connect: it gets at least this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What is wrong when `e` says Redis refuses the scripts (rather than being
/// down or busy): `None` for any other error.
pub(super) fn misconfiguration(e: &RedisError) -> Option<String> {
    misconfiguration_of(e.code()?, e.detail().unwrap_or_default())
}

/// [`misconfiguration`] from an error's code and text, as Redis 7.0 and
/// 8.2 and Valkey 9.1 word them.
fn misconfiguration_of(code: &str, detail: &str) -> Option<String> {
    let grant = format!("grant them: ACL SETUSER <user> ~<prefix>* {ACL_COMMANDS}");
    // Inside a script, Redis 7.0 says "The user executing the script can't
    // run this command" or "can't access at least one of the keys"; 8.2 and
    // Valkey "ACL failure in script: User u has no permissions to run the
    // 'hset' command" or "... to access a key".
    let acl = code == "NOPERM"
        || (code == "ERR"
            && ["ACL failure", "can't run this command", "can't access"]
                .iter()
                .any(|s| detail.contains(s)));
    if acl {
        let what = if detail.contains("access") {
            "the backend's keys (under its prefix)".to_owned()
        } else {
            // The name only if it looks like one: the text is the server's.
            let named = detail
                .split_once("run the '")
                .and_then(|(_, r)| r.split_once('\''));
            match named.filter(|(c, _)| {
                c.len() <= 40 && c.chars().all(|c| c.is_ascii_alphanumeric() || c == '|')
            }) {
                Some((command, _)) => format!("`{}`", command.to_ascii_uppercase()),
                None => "a command the scripts send".to_owned(),
            }
        };
        return Some(format!(
            "Redis refuses the rate-limit scripts: the user may not use {what}; {grant}"
        ));
    }
    match code {
        "ERR" if detail.starts_with("unknown command") => Some(
            "Redis refuses the rate-limit scripts: it does not know a command the backend sends \
             (renamed or disabled with rename-command?); the backend needs EVALSHA and EVAL"
                .to_owned(),
        ),
        "ERR" if detail.contains("scripting engine") => Some(
            "Redis refuses the rate-limit scripts: it has no Lua engine (Valkey without its lua \
             module?)"
                .to_owned(),
        ),
        "OOM" => Some(
            "Redis refuses the rate-limit scripts: it is full (maxmemory reached under \
             maxmemory-policy noeviction) and refuses their writes; set maxmemory-policy \
             volatile-ttl, or give it more memory"
                .to_owned(),
        ),
        _ => None,
    }
}

/// One quota of each algorithm, and a sliding log that logs refused
/// attempts (its trimming path): the decision script's every command runs
/// when this set is decided twice.
fn probe_quotas() -> QuotaSet {
    let second = Duration::from_secs(1);
    let quotas = [
        Quota::token_bucket(1, second).name("token_bucket"),
        Quota::leaky_bucket(1, second).name("leaky_bucket"),
        Quota::gcra(1, second).name("gcra"),
        Quota::fixed_window(1, second).name("fixed_window"),
        Quota::sliding_window(1, second).name("sliding_window"),
        Quota::sliding_log(1, second).name("sliding_log"),
        Quota::sliding_log(1, second)
            .name("sliding_log_counted")
            .count_rejected(true),
    ]
    .map(|q| q.build().expect("the probe's quotas are valid"));
    QuotaSet::new("tollgate-probe", quotas).expect("the probe's quota set is valid")
}

/// Runs the decision script twice (an admission, then a refusal) and the
/// concurrency script once (a slot taken and given back) on keys of the
/// probe's own under the prefix, all expiring within seconds.
pub(super) async fn run(inner: &Inner) -> Result<(), BackendError> {
    let within = inner.timeout.max(PROBE_TIMEOUT);
    let timed_out = || {
        BackendError::new(
            BackendErrorKind::Timeout,
            format!("Redis did not answer the probe within {within:?}"),
        )
    };
    let quotas = probe_quotas();
    let probe_key = probe_key();
    let keys = script::redis_keys(&inner.prefix, &probe_key, &quotas);
    let ask = Ask {
        cost: 1,
        commit: true,
        want: 1,
        give_back: None,
    };
    for _ in 0..2 {
        let call = async {
            let now = inner.clock.as_ref().map(|c| c.now().as_micros());
            let slack = if now.is_some() { 60_000 } else { 0 };
            let args = script::arguments(&quotas, now, &ask, slack, true);
            let (mut conn, _) = inner.connections.connection().await?;
            let loads = &inner.counters.script_loads;
            let reply = inner
                .connections
                .evaluate(&mut conn, &keys, &args, loads)
                .await
                .map_err(|(e, _)| e)?;
            script::reply(&reply, &quotas, 1)
                .map_err(|m| BackendError::new(BackendErrorKind::Protocol, m))
        };
        tokio::time::timeout(within, call)
            .await
            .map_err(|_| timed_out())??;
    }
    let slots = async {
        let (mut conn, _) = inner.connections.connection().await?;
        let key = format!("{}{{{probe_key}}}:slots", inner.prefix);
        for (op, limit) in [("acquire", 1), ("release", 0)] {
            slots_call(&mut conn.1, &key, op, limit).await?;
        }
        Ok::<_, BackendError>(())
    };
    tokio::time::timeout(within, slots)
        .await
        .map_err(|_| timed_out())?
}

/// One call of the concurrency script, as `RedisSlots` makes it.
async fn slots_call(conn: &mut Conn, key: &str, op: &str, limit: u64) -> Result<(), BackendError> {
    let script: &Script = &super::concurrency::SCRIPT;
    let mut invocation = script.key(key);
    invocation.arg(op).arg("probe").arg(limit).arg(1_000u64);
    let reply: Result<(u64, u64), RedisError> = match conn {
        Conn::Single(c) => invocation.invoke_async(c).await,
        Conn::Cluster(c) => invocation.invoke_async(c).await,
    };
    reply
        .map(drop)
        .map_err(|e| super::connection::redis_error(e).0)
}

#[cfg(test)]
mod tests {
    use super::misconfiguration_of as of;

    #[test]
    fn each_servers_wording_of_a_refusal_is_told_apart() {
        let cases = [
            // Redis 7.0, outside and inside a script.
            (
                "NOPERM",
                "this user has no permissions to run the 'evalsha' command",
                "`EVALSHA`",
            ),
            (
                "ERR",
                "The user executing the script can't run this command or subcommand script: 88c9, on @user_script:1.",
                "a command the scripts send",
            ),
            (
                "ERR",
                "The user executing the script can't access at least one of the keys mentioned in the command arguments script: 0df3, on @user_script:1.",
                "keys",
            ),
            (
                "NOPERM",
                "this user has no permissions to access one of the keys used as arguments",
                "keys",
            ),
            // Redis 8.2 and Valkey 9.1.
            (
                "ERR",
                "ACL failure in script: User x has no permissions to run the 'hset' command script: on @user_script:1.",
                "`HSET`",
            ),
            (
                "ERR",
                "ACL failure in script: No permissions to access a key script: on @user_script:1.",
                "keys",
            ),
            (
                "NOPERM",
                "User x has no permissions to run the 'set' command",
                "`SET`",
            ),
            (
                "ERR",
                "unknown command 'EVALSHA', with args beginning with: 'e0e1' '0'",
                "rename-command",
            ),
            (
                "ERR",
                "Could not find scripting engine 'lua'",
                "no Lua engine",
            ),
            (
                "OOM",
                "command not allowed when used memory > 'maxmemory'. script: 88c9, on @user_script:1.",
                "volatile-ttl",
            ),
        ];
        for (code, detail, says) in cases {
            let got = of(code, detail).unwrap_or_else(|| panic!("{code} {detail}"));
            assert!(got.contains(says), "{code} {detail}: {got}");
        }
        for (code, detail) in [
            ("ERR", "wrong number of arguments for 'evalsha' command"),
            ("BUSY", "Redis is busy running a script."),
            ("LOADING", "Redis is loading the dataset in memory"),
            ("READONLY", "You can't write against a read only replica."),
        ] {
            assert_eq!(of(code, detail), None, "{code} {detail}");
        }
    }
}
