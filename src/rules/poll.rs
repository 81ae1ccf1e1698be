//! The poll that brings other processes' changes in: on Redis, the shared
//! store of overrides, blocks and resets (see `runtime.rs`).

#[cfg(feature = "redis")]
use std::sync::Arc;
#[cfg(feature = "redis")]
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Rules;
#[cfg(feature = "redis")]
use super::backend::AnyBackend;
#[cfg(feature = "redis")]
use super::operate::{OpError, backend_error};
#[cfg(feature = "redis")]
use super::runtime::{Block, Entries, Override};

impl Rules {
    /// Brings in the changes other processes made to the shared store: on
    /// Redis, asks its version every `every` ([`POLL_EVERY`](super::runtime::POLL_EVERY)
    /// in the gateway) and, when it moved, reads the store and puts its
    /// overrides and blocks in force, and forgets what this process cached
    /// of keys reset elsewhere. In memory there is nothing to bring in, and
    /// the task ends at once. It ends when every handle to these rules is
    /// gone.
    pub fn watch_overrides(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        #[cfg(not(feature = "redis"))]
        {
            let _ = every;
            tokio::spawn(async {})
        }
        #[cfg(feature = "redis")]
        {
            let weak = Arc::downgrade(&self.inner);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                // Whether the last poll failed: a store down is logged once
                // when it goes and once when it comes back, not every poll.
                let mut failing = false;
                loop {
                    tick.tick().await;
                    let Some(inner) = weak.upgrade() else { return };
                    let rules = Rules { inner };
                    match rules.poll().await {
                        Err(e) if !failing => {
                            failing = true;
                            tracing::warn!(error = %e, "tollgate: the shared overrides store could not be read; overrides and blocks stay as last read");
                        }
                        Ok(()) if failing => {
                            failing = false;
                            tracing::info!("tollgate: the shared overrides store is read again");
                        }
                        _ => {}
                    }
                    if !matches!(rules.compiled().backend, AnyBackend::Redis(_)) {
                        return;
                    }
                }
            })
        }
    }

    /// One poll of the shared store (see [`watch_overrides`](Rules::watch_overrides)).
    #[cfg(feature = "redis")]
    pub(crate) async fn poll(&self) -> Result<(), OpError> {
        let compiled = self.compiled();
        let AnyBackend::Redis(redis) = &compiled.backend else {
            return Ok(());
        };
        // One more than the version last read; 0 before the first read.
        let seen = compiled.runtime.version.load(Ordering::Relaxed);
        let version = redis.store_version().await.map_err(backend_error)?;
        if seen != 0 && version.saturating_add(1) == seen {
            return Ok(());
        }
        let snapshot = redis.store_read().await.map_err(backend_error)?;
        let old = compiled.runtime.read(Entries::clone);
        let mut entries = Entries::default();
        for (f, value) in &snapshot.entries {
            let mut parts = f.splitn(3, '\n');
            let (Some(kind), Some(rule), Some(key)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let Some((head, rest)) = value.split_once('\n') else {
                continue;
            };
            let Ok(at) = head.parse::<u64>() else {
                continue;
            };
            match kind {
                "b" => {
                    let block = Block {
                        until_ms: at,
                        penalty: rest == "1",
                    };
                    (entries.blocks.entry(rule.to_owned()).or_default())
                        .insert(key.to_owned(), block);
                }
                "o" => {
                    let Ok((_, r)) = compiled.rule_named(rule) else {
                        continue;
                    };
                    let expires_at_ms = (at != 0).then_some(at);
                    let kept = old.overrides.get(rule).and_then(|m| m.get(key));
                    let kept =
                        kept.filter(|o| o.quotas_json == rest && o.expires_at_ms == expires_at_ms);
                    let limit = match kept {
                        Some(o) => Arc::clone(&o.limit),
                        None => match compiled.override_limit(r, rest) {
                            Ok(limit) => limit,
                            Err(e) => {
                                tracing::warn!(rule, error = %e, "tollgate: a shared override cannot be applied");
                                continue;
                            }
                        },
                    };
                    let o = Override {
                        quotas_json: rest.to_owned(),
                        expires_at_ms,
                        limit,
                    };
                    (entries.overrides.entry(rule.to_owned()).or_default())
                        .insert(key.to_owned(), o);
                }
                _ => {}
            }
        }
        // Resets made since the last poll: what this process cached of
        // those keys (denials, leases) means nothing now.
        if seen != 0 {
            for line in &snapshot.resets {
                let mut parts = line.splitn(3, '\n');
                let (Some(v), Some(rule), Some(key)) = (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                if v.parse::<u64>().is_ok_and(|v| v >= seen) {
                    if let Ok((_, r)) = compiled.rule_named(rule) {
                        for limit in compiled.limits_of(r, key) {
                            redis.forget(key, limit.limiter.quotas());
                        }
                    }
                }
            }
        }
        compiled.runtime.change(|e| *e = entries);
        (compiled.runtime.version).store(snapshot.version.saturating_add(1), Ordering::Relaxed);
        Ok(())
    }
}
