//! Run-time entries an operator sets through the admin API: a key's own
//! quotas (an override) and blocks. Kept in the rules' run-time entries
//! (`runtime.rs`) and, when the rules are on Redis, there too, so that
//! every process of the fleet applies them within a poll.

// Read by the admin API (the `admin` feature); the request path uses a part.
#![cfg_attr(not(feature = "admin"), allow(dead_code))]

use std::sync::Arc;
use std::time::Duration;

use super::Rules;
use super::backend::AnyBackend;
use super::compile::{Compiled, Rule};
#[cfg(feature = "redis")]
use super::operate::field;
use super::operate::{OpError, OverrideView, backend_error, millis};
use super::quotas::QuotaList;
use super::runtime::{Block, MAX_ENTRIES, Override, now_ms};
use crate::layer::limit::Limit;
use crate::limiter::Limiter;
use crate::quota_set::QuotaSet;

impl Compiled {
    /// Quotas given as JSON (the rules file's list), as rule `rule`'s
    /// override: checked as the file's are.
    pub(super) fn override_limit(
        &self,
        rule: &Rule,
        quotas_json: &str,
    ) -> Result<Arc<Limit<AnyBackend>>, String> {
        // JSON is YAML: the file's own parser reads it, with its checks.
        let list: QuotaList =
            serde_saphyr::from_str(quotas_json).map_err(|e| format!("quotas: {e}"))?;
        let quotas: Vec<_> = list.0.into_iter().map(|q| q.quota).collect();
        if let Some(q) = quotas.iter().find(|q| q.max_cost() < rule.cost) {
            return Err(format!(
                "quota {:?} can never admit the rule's cost of {}",
                q.name(),
                rule.cost
            ));
        }
        let set =
            QuotaSet::new(format!("{}#admin", rule.name), quotas).map_err(|e| e.to_string())?;
        if let Some(e) = self.backend.refuses(&set) {
            return Err(e);
        }
        Ok(Arc::new(Limit::new(Limiter::new(
            self.backend.clone(),
            set,
        ))))
    }
}

impl Rules {
    /// Sets `key`'s own quotas on `rule` (JSON: the rules file's quota
    /// list), for `expires_in` if given. Its counters are its own: the
    /// key's counters under the rule are left as they are.
    pub(crate) async fn set_override(
        &self,
        rule: &str,
        key: &str,
        quotas_json: &str,
        expires_in: Option<Duration>,
    ) -> Result<String, OpError> {
        let compiled = self.compiled();
        let (i, r) = compiled.rule_named(rule)?;
        let key = compiled.built_key(i, key)?;
        if r.limit.is_none() {
            return Err(OpError::Invalid(format!(
                "rule {rule} has no rate quotas to override (only a concurrency limit)"
            )));
        }
        let limit = compiled
            .override_limit(r, quotas_json)
            .map_err(OpError::Invalid)?;
        let expires_at_ms = expires_in.map(|d| now_ms().saturating_add(millis(d)));
        let entry = Override {
            quotas_json: quotas_json.to_owned(),
            expires_at_ms,
            limit,
        };
        let full = compiled.runtime.read(|e| {
            e.count_overrides() >= MAX_ENTRIES
                && !e.overrides.get(rule).is_some_and(|m| m.contains_key(&key))
        });
        if full {
            return Err(OpError::Full);
        }
        #[cfg(feature = "redis")]
        if let AnyBackend::Redis(redis) = &compiled.backend {
            let value = format!("{}\n{quotas_json}", expires_at_ms.unwrap_or(0));
            (redis
                .store_write("set", &field('o', rule, &key), &value)
                .await)
                .map_err(backend_error)?;
        }
        compiled.runtime.change(|e| {
            let m = e.overrides.entry(rule.to_owned()).or_default();
            m.insert(key.clone(), entry);
        });
        Ok(key)
    }

    /// `key`'s run-time override on `rule`, if it has one in force.
    pub(crate) fn get_override(&self, rule: &str, key: &str) -> Result<OverrideView, OpError> {
        let compiled = self.compiled();
        let (i, _) = compiled.rule_named(rule)?;
        let key = compiled.built_key(i, key)?;
        let now = now_ms();
        compiled
            .runtime
            .read(|e| {
                let o = e.overrides.get(rule)?.get(&key)?;
                (o.expires_at_ms.is_none_or(|t| t > now)).then(|| OverrideView {
                    key: key.clone(),
                    quotas_json: o.quotas_json.clone(),
                    expires_at_ms: o.expires_at_ms,
                })
            })
            .ok_or(OpError::NotFound)
    }

    /// `rule`'s run-time overrides in force, by key.
    pub(crate) fn list_overrides(&self, rule: &str) -> Result<Vec<OverrideView>, OpError> {
        let compiled = self.compiled();
        compiled.rule_named(rule)?;
        let now = now_ms();
        let mut list = compiled.runtime.read(|e| {
            (e.overrides.get(rule).into_iter().flatten())
                .filter(|(_, o)| o.expires_at_ms.is_none_or(|t| t > now))
                .map(|(k, o)| OverrideView {
                    key: k.clone(),
                    quotas_json: o.quotas_json.clone(),
                    expires_at_ms: o.expires_at_ms,
                })
                .collect::<Vec<_>>()
        });
        list.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(list)
    }

    /// Removes `key`'s run-time override on `rule` (or its block, with
    /// `kind` 'b').
    pub(crate) async fn delete_entry(
        &self,
        kind: char,
        rule: &str,
        key: &str,
    ) -> Result<String, OpError> {
        let compiled = self.compiled();
        let (i, r) = compiled.rule_named(rule)?;
        let key = compiled.built_key(i, key)?;
        let held = compiled.runtime.read(|e| match kind {
            'o' => e.overrides.get(rule).is_some_and(|m| m.contains_key(&key)),
            _ => e.blocks.get(rule).is_some_and(|m| m.contains_key(&key)),
        });
        #[cfg(feature = "redis")]
        if let AnyBackend::Redis(redis) = &compiled.backend {
            (redis.store_write("del", &field(kind, rule, &key), "").await)
                .map_err(backend_error)?;
        }
        let removed = compiled.runtime.change(|e| {
            let map = if kind == 'o' {
                None
            } else {
                Some(&mut e.blocks)
            };
            match map {
                Some(blocks) => blocks.get_mut(rule).and_then(|m| m.remove(&key)).is_some(),
                None => (e.overrides.get_mut(rule))
                    .and_then(|m| m.remove(&key))
                    .is_some(),
            }
        });
        if !(held || removed) {
            return Err(OpError::NotFound);
        }
        // A lifted key starts its penalty count afresh: its next refusal
        // is its first, not the one that blocks it again.
        if let (Some(p), 'b') = (&r.penalty, kind) {
            p.counter.reset(&key).await.map_err(backend_error)?;
        }
        Ok(key)
    }

    /// Blocks `key` of `rule` for `span`: every request of it answered 429
    /// with a Retry-After of what is left.
    pub(crate) async fn block(
        &self,
        rule: &str,
        key: &str,
        span: Duration,
        penalty: bool,
    ) -> Result<(String, u64), OpError> {
        let compiled = self.compiled();
        let (i, _) = compiled.rule_named(rule)?;
        let key = if penalty {
            key.to_owned()
        } else {
            compiled.built_key(i, key)?
        };
        let until_ms = now_ms().saturating_add(millis(span));
        store_block(&compiled, rule, &key, until_ms, penalty).await?;
        Ok((key, until_ms))
    }
}

/// Stores a block: in Redis first when the rules are there, then here.
async fn store_block(
    compiled: &Compiled,
    rule: &str,
    key: &str,
    until_ms: u64,
    penalty: bool,
) -> Result<(), OpError> {
    let full = compiled.runtime.read(|e| {
        e.count_blocks() >= MAX_ENTRIES && !e.blocks.get(rule).is_some_and(|m| m.contains_key(key))
    });
    if full {
        return Err(OpError::Full);
    }
    #[cfg(feature = "redis")]
    if let AnyBackend::Redis(redis) = &compiled.backend {
        let value = format!("{until_ms}\n{}", u8::from(penalty));
        (redis
            .store_write("set", &field('b', rule, key), &value)
            .await)
            .map_err(backend_error)?;
    }
    compiled.runtime.change(|e| {
        let block = Block { until_ms, penalty };
        (e.blocks.entry(rule.to_owned()).or_default()).insert(key.to_owned(), block);
    });
    Ok(())
}
