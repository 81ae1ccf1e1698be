//! The penalty box: a rule option that blocks a key for a while once it
//! has been refused repeatedly (`penalty: { refusals: 3, within: 10m,
//! block: 15m }`), as fail2ban and Cloudflare's mitigation timeout do.
//!
//! The refusals are counted by a sliding log of `refusals` per `within` on
//! the rules' backend (so on Redis, by the whole fleet), spent only when
//! the rule refuses; the refusal that fills it blocks the key. The block is
//! stored with the operators' blocks (see `runtime.rs`), so every process
//! answers it, the admin API shows it, and deleting it there lifts it.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::backend::AnyBackend;
#[cfg(feature = "redis")]
use super::operate::field;
use super::operate::millis;
use super::period::Period;
use super::runtime::{Block, MAX_ENTRIES, Runtime, now_ms};
use crate::layer::PartitionKey;
use crate::limiter::Limiter;
use crate::quota::Quota;
use crate::quota_set::QuotaSet;

/// A rule's `penalty:` as written.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct PenaltyConfig {
    /// Refusals that block the key...
    pub refusals: u64,
    /// ...when they fall within this long...
    pub within: Period,
    /// ...for this long.
    pub block: Period,
}

/// The most refusals a penalty counts: its log keeps one entry per refusal.
const MAX_REFUSALS: u64 = 1_000;

/// A rule's penalty, ready to count.
#[derive(Clone)]
pub(crate) struct Penalty {
    pub counter: Limiter<AnyBackend>,
    pub block: Duration,
    rule: Arc<str>,
    /// Where blocks go: the rules' run-time entries.
    runtime: Arc<Runtime>,
    /// How long a count may take on a shared store.
    timeout: Duration,
    /// Keys are logged as this keyed hash (never raw: a block's line is
    /// written off the request path, where the rules' setting is not).
    partition_key: Option<PartitionKey>,
}

impl Penalty {
    /// The penalty of rule `rule` on `backend`, blocking into `runtime`.
    pub(crate) fn new(
        rule: &str,
        c: &PenaltyConfig,
        backend: &AnyBackend,
        runtime: &Arc<Runtime>,
        timeout: Duration,
        partition_key: Option<PartitionKey>,
    ) -> Result<Self, String> {
        if !(1..=MAX_REFUSALS).contains(&c.refusals) {
            return Err(format!(
                "rule {rule}: penalty refusals is {}; write 1 to {MAX_REFUSALS}",
                c.refusals
            ));
        }
        if c.block.0.is_zero() {
            return Err(format!("rule {rule}: penalty block must be longer than 0"));
        }
        let quota = Quota::sliding_log(c.refusals, c.within.0)
            .name("penalty")
            .build()
            .map_err(|e| format!("rule {rule}: penalty: {e}"))?;
        let set = QuotaSet::new(format!("{rule}#penalty"), [quota])
            .map_err(|e| format!("rule {rule}: penalty: {e}"))?;
        if let Some(e) = backend.refuses(&set) {
            return Err(format!("rule {rule}: penalty: {e}"));
        }
        Ok(Penalty {
            counter: Limiter::new(backend.clone(), set),
            block: c.block.0,
            rule: rule.into(),
            runtime: Arc::clone(runtime),
            timeout,
            partition_key,
        })
    }

    /// Whether this refusal's count (`counted`, the counter's decision for
    /// it) blocks the key: the log was full before it, or it filled it.
    pub(crate) fn blocks(counted: &crate::Decision) -> bool {
        !counted.allowed() || counted.quotas().iter().any(|q| q.remaining() == 0)
    }

    /// Counts a refusal of `key`, and blocks the key when the refusals are
    /// enough. In memory at once; on a shared store by a task of its own
    /// (within the rules' timeout), so the refusal is not held for it: the
    /// block is in force here when the count comes back, and on Redis is
    /// written there for the other processes.
    pub(crate) fn refused(&self, key: &str) {
        if let Some(counted) = self.counter.check_now(key, 1) {
            if counted.is_ok_and(|c| Penalty::blocks(&c)) {
                self.block_here(key);
            }
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (penalty, key) = (self.clone(), key.to_owned());
        runtime.spawn(async move {
            let counted = tokio::time::timeout(penalty.timeout, penalty.counter.check(&key, 1)).await;
            if !matches!(&counted, Ok(Ok(c)) if Penalty::blocks(c)) {
                return;
            }
            let until_ms = penalty.block_here(&key);
            #[cfg(feature = "redis")]
            if let AnyBackend::Redis(redis) = penalty.counter.backend() {
                let value = format!("{until_ms}\n1");
                let f = field('b', &penalty.rule, &key);
                if let Err(e) = redis.store_write("set", &f, &value).await {
                    tracing::warn!(rule = &*penalty.rule, error = %e, "tollgate: a penalty block could not be stored in Redis; it holds in this process only");
                }
            }
            let _ = until_ms;
        });
    }

    /// Blocks `key` in this process for the penalty's time; returns until
    /// when.
    fn block_here(&self, key: &str) -> u64 {
        let until_ms = now_ms().saturating_add(millis(self.block));
        let stored = self.runtime.change(|e| {
            if e.count_blocks() >= MAX_ENTRIES {
                return false;
            }
            let block = Block {
                until_ms,
                penalty: true,
            };
            (e.blocks.entry(self.rule.to_string()).or_default()).insert(key.to_owned(), block);
            true
        });
        if stored {
            let logged = PartitionKey::logged(self.partition_key.as_ref(), key);
            tracing::info!(
                rule = &*self.rule,
                key = logged.as_str(),
                seconds = self.block.as_secs(),
                "penalty: key blocked"
            );
        } else {
            tracing::warn!(
                rule = &*self.rule,
                "tollgate: penalty block not stored: {MAX_ENTRIES} blocks held"
            );
        }
        until_ms
    }
}

/// Told of each of the rule's decisions as it is made: counted among the
/// top offenders, and a refusal toward the penalty box.
impl crate::layer::pipeline::Watch for super::compile::Rule {
    #[inline]
    fn decided(&self, key: &crate::key::Key, decision: &crate::Decision) {
        let refused = !decision.allowed();
        self.top.record(key.as_str(), refused);
        if refused {
            if let Some(p) = &self.penalty {
                p.refused(key.as_str());
            }
        }
    }
}
