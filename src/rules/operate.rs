//! What an operator does to running rules (the admin API's calls): list
//! the rules, inspect and reset a key, read the top offenders; and what
//! those calls share (errors, keys as given). Overrides and blocks are in
//! `overrides.rs`.

// Read by the admin API (the `admin` feature); the request path uses a part.
#![cfg_attr(not(feature = "admin"), allow(dead_code))]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Rules;
use super::backend::AnyBackend;
use super::compile::{Compiled, Rule};
use super::key_part::KeyPart;
use super::runtime::{Block, MAX_ENTRIES, now_ms};
use crate::decision::Decision;
use crate::layer::limit::Limit;

/// Why an operator's call failed.
#[derive(Debug)]
pub(crate) enum OpError {
    /// No rule of that name.
    NoRule(String),
    /// The key or the body cannot be used; says why.
    Invalid(String),
    /// No such override or block.
    NotFound,
    /// Too many entries held already.
    Full,
    /// The backend failed (its message, which holds no key).
    Backend(String),
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::NoRule(r) => write!(f, "there is no rule named {r:?}"),
            OpError::Invalid(m) => f.write_str(m),
            OpError::NotFound => f.write_str("there is no such entry"),
            OpError::Full => write!(
                f,
                "{MAX_ENTRIES} entries of this kind are held already; delete some first"
            ),
            OpError::Backend(m) => write!(f, "the backend failed: {m}"),
        }
    }
}

pub(super) fn backend_error(e: impl std::fmt::Display) -> OpError {
    OpError::Backend(e.to_string())
}

/// A rule as the admin API lists it.
pub(crate) struct RuleSummary {
    pub name: String,
    pub key: String,
    pub cost: u64,
    /// (name, algorithm, limit, period)
    pub quotas: Vec<(String, &'static str, u64, Duration)>,
    /// (refusals, within, block)
    pub penalty: Option<(u64, Duration, Duration)>,
}

/// A key as inspected.
pub(crate) struct Inspection {
    /// The key as the rule builds it.
    pub key: String,
    /// What is left now (a peek at cost 0), and whether a request of the
    /// rule's cost would pass (a peek at that cost), against the quotas in
    /// force for the key.
    pub decision: Option<(Decision, Decision)>,
    /// The names of the quotas the decision reports, in its order.
    pub names: Vec<String>,
    /// Whether those are a run-time override's.
    pub overridden: bool,
    /// The block in force, if any.
    pub block: Option<Block>,
}

/// A run-time override as read back.
pub(crate) struct OverrideView {
    pub key: String,
    pub quotas_json: String,
    pub expires_at_ms: Option<u64>,
}

/// A run-time entry's field in the shared store: kind, rule, key.
#[cfg(feature = "redis")]
pub(super) fn field(kind: char, rule: &str, key: &str) -> String {
    format!("{kind}\n{rule}\n{key}")
}

impl Compiled {
    pub(super) fn rule_named(&self, rule: &str) -> Result<(usize, &Rule), OpError> {
        (self.rules.iter().enumerate())
            .find(|(_, r)| r.name == rule)
            .ok_or_else(|| OpError::NoRule(rule.to_owned()))
    }

    /// `given` as rule `i` builds its keys: as given when it is built
    /// already (`key:…`, parts joined by `|`), else, for a rule whose key
    /// is one part, with that part's prefix (the API key, the address or
    /// the user id as the client sent it). An address or a route is
    /// written as its key is, however it is given.
    pub(super) fn built_key(&self, i: usize, given: &str) -> Result<String, OpError> {
        if given.is_empty() || given.len() > crate::layer::pipeline::DEFAULT_MAX_KEY_LEN {
            return Err(OpError::Invalid(format!(
                "a key is 1 to {} bytes",
                crate::layer::pipeline::DEFAULT_MAX_KEY_LEN
            )));
        }
        if given.chars().any(char::is_control) {
            return Err(OpError::Invalid("a key holds no control characters".into()));
        }
        let prefix = match self.file.rules[i].key.0.as_slice() {
            [part] if *part != KeyPart::Global => part.prefix(),
            _ => return Ok(given.to_owned()),
        };
        let given = if given.starts_with(prefix) {
            given.to_owned()
        } else {
            format!("{prefix}{given}")
        };
        // An address or a route as a request's key writes it, however it
        // is given: another spelling would name a key no request has.
        match super::key_part::part_as_built(&given, self.file.client_ip.peer_ip()) {
            None => Ok(given),
            Some(Ok(key)) => Ok(key.as_str().to_owned()),
            Some(Err(how)) => Err(OpError::Invalid(format!(
                "this rule's key {given:?} is no address or route: {how}"
            ))),
        }
    }

    /// The rule's limits that count for `key`: the rule's own, the file's
    /// override of the key, and a run-time override's.
    pub(super) fn limits_of(&self, rule: &Rule, key: &str) -> Vec<Arc<Limit<AnyBackend>>> {
        let mut limits: Vec<Arc<Limit<AnyBackend>>> = Vec::new();
        limits.extend(rule.limit.iter().cloned());
        limits.extend(rule.overrides.get(key).cloned());
        if let Some(super::runtime::Found::Override(l)) = self.runtime.find(&rule.name, key) {
            limits.push(l);
        }
        limits
    }
}

impl Rules {
    pub(super) fn compiled(&self) -> Arc<Compiled> {
        self.inner.current.load_full()
    }

    /// The rules in force, as listed.
    pub(crate) fn summaries(&self) -> Vec<RuleSummary> {
        let compiled = self.compiled();
        (compiled.rules.iter().zip(&compiled.file.rules))
            .map(|(r, rc)| RuleSummary {
                name: r.name.clone(),
                key: (rc.key.0.iter())
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" + "),
                cost: r.cost,
                quotas: (r.limit.iter())
                    .flat_map(|l| l.limiter.quotas().quotas())
                    .map(|q| {
                        (
                            q.name().to_owned(),
                            q.algorithm().name(),
                            q.limit(),
                            q.period(),
                        )
                    })
                    .collect(),
                penalty: rc
                    .penalty
                    .as_ref()
                    .map(|p| (p.refusals, p.within.0, p.block.0)),
            })
            .collect()
    }

    /// What `key` (as given) of `rule` has left, spending nothing.
    pub(crate) async fn inspect(&self, rule: &str, key: &str) -> Result<Inspection, OpError> {
        let compiled = self.compiled();
        let (i, r) = compiled.rule_named(rule)?;
        let key = compiled.built_key(i, key)?;
        let runtime_override = match compiled.runtime.find(rule, &key) {
            Some(super::runtime::Found::Override(l)) => Some(l),
            _ => None,
        };
        let overridden = runtime_override.is_some();
        let limit =
            runtime_override.or_else(|| (r.overrides.get(&key).or(r.limit.as_ref())).cloned());
        let (decision, names) = match limit {
            Some(l) => {
                let names = (l.limiter.quotas().quotas().iter())
                    .map(|q| q.name().to_owned())
                    .collect();
                let left = l.limiter.inspect(&key).await.map_err(backend_error)?;
                let next = l.limiter.peek(&key, r.cost).await.map_err(backend_error)?;
                (Some((left, next)), names)
            }
            None => (None, Vec::new()),
        };
        let block = compiled.runtime.read(|e| {
            (e.blocks.get(rule).and_then(|m| m.get(&key)).copied())
                .filter(|b| b.until_ms > now_ms())
        });
        Ok(Inspection {
            key,
            decision,
            names,
            overridden,
            block,
        })
    }

    /// Resets `key` of `rule`: every quota counting for it is full again,
    /// on every process (on Redis, the others forget what they cached of
    /// it within a poll). Overrides and blocks stay.
    pub(crate) async fn reset(&self, rule: &str, key: &str) -> Result<String, OpError> {
        let compiled = self.compiled();
        let (i, r) = compiled.rule_named(rule)?;
        let key = compiled.built_key(i, key)?;
        for limit in compiled.limits_of(r, &key) {
            limit.limiter.reset(&key).await.map_err(backend_error)?;
        }
        if let Some(p) = &r.penalty {
            p.counter.reset(&key).await.map_err(backend_error)?;
        }
        #[cfg(feature = "redis")]
        if let AnyBackend::Redis(redis) = &compiled.backend {
            let f = field('r', rule, &key);
            let f = f.split_once('\n').map_or(f.as_str(), |(_, rest)| rest);
            redis
                .store_write("reset", f, "")
                .await
                .map_err(backend_error)?;
        }
        Ok(key)
    }

    /// `rule`'s top `n` keys: refused ones (`refused`) or admitted ones,
    /// with the decisions counted. Keys as the logs show them unless raw
    /// keys are logged.
    pub(crate) fn top(
        &self,
        rule: &str,
        n: usize,
        refused: bool,
    ) -> Result<(Vec<super::top::Heavy>, u64), OpError> {
        let compiled = self.compiled();
        let (_, r) = compiled.rule_named(rule)?;
        let (mut top, total) = r.top.top(n, refused);
        for h in &mut top {
            h.key = compiled
                .respond
                .logged_key(&crate::key::Key::from(std::mem::take(&mut h.key)));
        }
        Ok((top, total))
    }

    /// Whether keys are shown as they are (see [`Rules::log_raw_keys`]).
    pub(crate) fn raw_keys_shown(&self) -> bool {
        self.inner.raw_keys_logged.load(Ordering::Relaxed)
    }
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
