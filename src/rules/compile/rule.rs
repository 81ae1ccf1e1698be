//! One rule of the file compiled: its limiters and its overrides' (each
//! cost checked against them), its key's extractors, its match, its
//! concurrency quota, and the checks a rule must pass alone.

use std::collections::HashMap;
use std::sync::Arc;

use http::header::HOST;

use crate::key::{ClientIp, ExtensionKey, GlobalKey, HeaderKey, KeyExtractor, PeerIp, UserId};
use crate::layer::limit::Limit;
use crate::layer::protect::Protection;
use crate::layer::{ConcurrencyQuota, CostFromResponse};
use crate::limiter::Limiter;
use crate::quota::Quota;
use crate::quota_set::QuotaSet;

use super::{Compiled, Rule, RuleKey};
use crate::rules::backend::{AnyBackend, with_slots};
use crate::rules::host::normalize_host;
use crate::rules::key_part::KeyPart;
use crate::rules::model::{BackendConfig, MatchConfig, MethodName, RuleConfig};

/// The extractors the key parts are made from.
pub(super) struct KeyParts<'a> {
    pub(super) peer_ip: PeerIp,
    pub(super) client_ip: Option<&'a ClientIp>,
}

impl KeyParts<'_> {
    fn extractor(&self, part: &KeyPart, route: &str) -> RuleKey {
        let extractor: Box<dyn KeyExtractor> = match part {
            KeyPart::PeerIp => Box::new(self.peer_ip),
            KeyPart::ClientIp => match self.client_ip {
                Some(c) => Box::new(c.clone()),
                None => Box::new(self.peer_ip),
            },
            KeyPart::Header(h) => Box::new(HeaderKey::new(h.clone())),
            KeyPart::User => Box::new(ExtensionKey::<UserId>::new()),
            KeyPart::Global => Box::new(GlobalKey),
            KeyPart::Route => return RuleKey::Route(route.to_owned()),
        };
        RuleKey::Extract(extractor)
    }
}

/// One rule: its limiter, its overrides' limiters, and its key.
pub(super) fn rule(
    rc: &RuleConfig,
    backend: &AnyBackend,
    parts: &KeyParts<'_>,
    near_limit: f64,
) -> Result<Rule, String> {
    let name = &rc.name.value.0;
    let set = |suffix: &str, quotas: Vec<Quota>| {
        let set = QuotaSet::new(format!("{name}{suffix}"), quotas)
            .map_err(|e| format!("rule {name}: {e}"))?;
        match backend.refuses(&set) {
            Some(e) => Err(format!("rule {name}: {e}")),
            None => {
                let mut limit = Limit::new(Limiter::new(backend.clone(), set));
                limit.set_near_limit(near_limit);
                Ok(Arc::new(limit))
            }
        }
    };
    let quotas: Vec<Quota> = rc.quotas.0.iter().map(|q| q.quota.clone()).collect();
    let limit = if quotas.is_empty() {
        None
    } else {
        check_cost(rc, &quotas, "")?;
        Some(set("", quotas)?)
    };
    let mut overrides = HashMap::new();
    for (j, o) in rc.overrides.iter().enumerate() {
        let quotas = override_quotas(rc, j).map_err(|e| o.error(e))?;
        check_cost(rc, &quotas, &format!(" (override {})", j + 1))?;
        let limit = set(&format!("#override{}", j + 1), quotas)?;
        // As for the lists: a key no request builds would leave its tier
        // silently unused.
        let list = format!("rule {name}: overrides");
        for key in &o.value.keys {
            super::listed_key(key, &list, parts.peer_ip).map_err(|e| o.error(e))?;
            if !rc.key.could_build(key) {
                return Err(o.error(format!(
                    "{list}: keys: {:?} can never match: this rule's keys are written {}",
                    super::shortened(key),
                    rc.key.written()
                )));
            }
            overrides.insert(key.clone(), limit.clone());
        }
    }
    let route = rc
        .matches
        .path
        .as_ref()
        .map(|p| p.text.clone())
        .or_else(|| rc.matches.prefix.as_ref().map(|p| p.0.clone()))
        .unwrap_or_else(|| format!("rule {name}"));
    Ok(Rule {
        name: name.clone(),
        matches: matches(rc)?,
        key: rc
            .key
            .0
            .iter()
            .map(|p| parts.extractor(p, &route))
            .collect(),
        cost: rc.cost.value,
        count_status: rc.count_status.as_ref().map(|c| c.0.clone()),
        cost_from_response: cost_from_response(rc)?,
        limit,
        overrides,
        concurrency: None,
        priority: rc.priority.0,
        penalty: None,
        top: Arc::default(),
    })
}

/// A rule's concurrency quota, with the file's load signal for elastic
/// mode and its slots where the backend keeps state. A reload that left the
/// rule's setting and the backend alone keeps its slots, so requests under
/// way still count.
pub(super) fn concurrency(
    rc: &RuleConfig,
    old: Option<&Compiled>,
    file: &Protection,
    backend_config: &BackendConfig,
    backend: &AnyBackend,
) -> Result<Option<Protection>, String> {
    let Some(c) = &rc.concurrency else {
        return Ok(None);
    };
    let name = &rc.name.value.0;
    if c.limit.value == 0 {
        return Err(c.limit.error(format_args!(
            "rule {name}: concurrency limit must be at least 1"
        )));
    }
    let mut quota = ConcurrencyQuota::new(c.limit.value).map_err(|e| c.limit.error(e))?;
    if let Some(elastic) = &c.elastic {
        if elastic.value < c.limit.value {
            return Err(elastic.error(format_args!(
                "rule {name}: elastic is {}, below the concurrency limit {}; write the ceiling, at least the limit",
                elastic.value, c.limit.value
            )));
        }
        if file.signal.is_none() {
            return Err(elastic.error(format_args!(
                "rule {name}: elastic needs a top-level shedding section, whose measured load says when there is room"
            )));
        }
        quota = quota.elastic(elastic.value).map_err(|e| elastic.error(e))?;
    }
    let kept = old
        .filter(|o| o.backend_config == *backend_config)
        .and_then(|o| o.rules.iter().find(|r| r.name == *name))
        .filter(|r| {
            let before = r.concurrency.as_ref().and_then(|p| p.concurrency.as_ref());
            before.is_some_and(|q| (q.limit(), q.ceiling()) == (quota.limit(), quota.ceiling()))
        })
        .and_then(|r| r.concurrency.as_ref()?.concurrency.clone());
    let quota = match kept {
        Some(kept) => kept,
        None => with_slots(backend, name, quota),
    };
    Ok(Some(Protection {
        concurrency: Some(quota),
        signal: file.signal.clone(),
        ..Protection::default()
    }))
}

/// A rule's `cost_from_response`, refused beside another way of costing a
/// request or without rate quotas to count against.
fn cost_from_response(rc: &RuleConfig) -> Result<Option<Arc<CostFromResponse>>, String> {
    let Some(from) = &rc.cost_from_response else {
        return Ok(None);
    };
    let name = &rc.name.value.0;
    let clash = if rc.count_status.is_some() {
        Some("count_status")
    } else if rc.cost.value != 1 {
        Some("cost")
    } else if rc.quotas.0.is_empty() {
        Some("no rate quotas")
    } else {
        None
    };
    if let Some(clash) = clash {
        return Err(from.error(format_args!(
            "rule {name}: cost_from_response takes each request's cost from its response, which leaves no place for {clash}; a second rule on the same requests can count them"
        )));
    }
    let c = &from.value;
    let mut made = CostFromResponse::header(c.header.0.clone(), c.reserve);
    if let Some(h) = &c.reserve_header {
        made = made.reserve_header(h.0.clone());
    }
    Ok(Some(Arc::new(made)))
}

/// Refuses a rule that limits nothing, and what needs rate quotas on a
/// rule without any (overrides scale them, `count_status` counts them).
pub(super) fn check_limited(rc: &RuleConfig) -> Result<(), String> {
    let name = &rc.name.value.0;
    if !rc.quotas.0.is_empty() {
        return Ok(());
    }
    if rc.concurrency.is_none() {
        return Err(rc.name.error(format_args!(
            "rule {name} limits nothing: give it quotas, a concurrency limit, or both"
        )));
    }
    if let Some(o) = rc.overrides.first() {
        return Err(o.error(format_args!(
            "rule {name}: overrides change rate quotas, and this rule has none"
        )));
    }
    if rc.count_status.is_some() {
        return Err(rc.name.error(format_args!(
            "rule {name}: count_status counts responses against rate quotas, and this rule has none"
        )));
    }
    Ok(())
}

/// Refuses an elastic rate quota in a file with no load signal: nothing
/// would say when there is room, so it could never use its extra.
pub(super) fn check_elastic(rc: &RuleConfig, file: &Protection) -> Result<(), String> {
    if file.signal.is_some() {
        return Ok(());
    }
    let own = rc.overrides.iter().filter_map(|o| o.value.quotas.as_ref());
    let mut written = rc.quotas.0.iter().chain(own.flat_map(|qs| qs.0.iter()));
    match written.find_map(|q| Some((q.quota.name(), q.elastic_at()?))) {
        Some((quota, at)) => Err(at.error(format_args!(
            "rule {}: quota {quota:?} is elastic, which needs a top-level shedding section, whose measured load says when there is room",
            rc.name.value.0
        ))),
        None => Ok(()),
    }
}

/// The quotas of override `j` of a rule: the rule's scaled, or its own.
fn override_quotas(rc: &RuleConfig, j: usize) -> Result<Vec<Quota>, String> {
    let o = &rc.overrides[j].value;
    let at = || format!("rule {}, override {}", rc.name.value.0, j + 1);
    match (&o.multiply, &o.quotas) {
        (Some(0), _) => Err(format!("{}: multiply must be at least 1", at())),
        (Some(n), None) => rc
            .quotas
            .0
            .iter()
            .map(|q| q.scaled(*n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", at())),
        (None, Some(qs)) => Ok(qs.0.iter().map(|q| q.quota.clone()).collect()),
        _ => Err(format!("{}: give either multiply or quotas", at())),
    }
}

/// Refuses a cost of zero, and a cost that one of the quotas could never
/// admit: every request would be refused, or pass by the backend error policy.
fn check_cost(rc: &RuleConfig, quotas: &[Quota], whose: &str) -> Result<(), String> {
    let cost = &rc.cost;
    if cost.value == 0 {
        return Err(cost.error(format_args!(
            "rule {}: cost must be at least 1",
            rc.name.value.0
        )));
    }
    match quotas.iter().min_by_key(|q| q.max_cost()) {
        Some(q) if q.max_cost() < cost.value => Err(cost.error(format_args!(
            "rule {}: cost {} is more than quota {:?}{whose} can ever admit ({}); lower the cost or raise the quota",
            rc.name.value.0,
            cost.value,
            q.name(),
            q.max_cost()
        ))),
        _ => Ok(()),
    }
}

/// A rule's `match` as requests are compared with it: a GET rule covers
/// HEAD (servers answer HEAD with the GET handler), and a `host` value is
/// in its normal form.
fn matches(rc: &RuleConfig) -> Result<MatchConfig, String> {
    let mut m = rc.matches.clone();
    let has = |m: &MatchConfig, method| m.methods.iter().any(|x| x.0 == method);
    if has(&m, http::Method::GET) && !has(&m, http::Method::HEAD) {
        m.methods.push(MethodName(http::Method::HEAD));
    }
    for h in m.headers.iter_mut().filter(|h| h.name.0 == HOST) {
        if let Some(value) = &h.value {
            h.value = Some(normalize_host(value).ok_or_else(|| {
                rc.name.error(format_args!(
                    "rule {}: {value:?} is not a host name (with a port if not 80)",
                    rc.name.value.0
                ))
            })?);
        }
    }
    Ok(m)
}
