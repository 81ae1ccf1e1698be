//! A parsed rules file made ready to decide: the backend, the client-address
//! finder, and each rule's limiters and key.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use http::header::HOST;

use super::backend::{AnyBackend, with_slots};
use super::error::RulesError;
use super::host::normalize_host;
use super::key_part::KeyPart;
use super::model::{BackendConfig, ClientIpConfig, MatchConfig, MethodName, RuleConfig, RulesFile};
use super::names::MatchMode;
use crate::key::{ClientIp, ExtensionKey, GlobalKey, HeaderKey, KeyExtractor, PeerIp, UserId};
use crate::layer::limit::{DEFAULT_NEAR_LIMIT, Limit};
use crate::layer::{
    ConcurrencyQuota, CostFromResponse, CountStatus, MeasuredLoad, OnMissingKey, Priority,
    ResponsePolicy, Shedding,
};
use crate::limiter::Limiter;
use crate::metrics::ReasonMetrics;
use crate::protect::Protection;
use crate::quota::Quota;
use crate::quota_set::QuotaSet;

/// The rules ready to decide.
pub(super) struct Compiled {
    pub file: RulesFile,
    pub backend: AnyBackend,
    pub backend_config: BackendConfig,
    pub respond: ResponsePolicy,
    pub on_missing_key: OnMissingKey,
    pub timeout: Duration,
    pub matching: MatchMode,
    /// Where client addresses come from: behind proxies when configured.
    pub client_ip: Option<ClientIp>,
    /// Load shedding and the measured load, from the `shedding:` section.
    pub protect: Protection,
    pub rules: Vec<Rule>,
    /// The request headers some rule reads one value of (`Host`, match and
    /// key headers): a request sending one of them twice is refused.
    pub single_headers: Vec<HeaderName>,
    /// Whether some rule matches the host: then a request naming a host
    /// with no normal form is refused.
    pub host_rules: bool,
    /// The file's decisions by reason.
    pub reasons: ReasonMetrics,
    /// Whether the backend said it never decides now.
    pub waits: crate::layer::pipeline::Waits,
    /// Overrides, blocks and resets made at run time: one for every
    /// version of the rules.
    pub runtime: Arc<super::runtime::Runtime>,
}

/// One rule, ready to decide.
pub(super) struct Rule {
    pub name: String,
    pub matches: MatchConfig,
    pub key: Vec<RuleKey>,
    pub cost: u64,
    /// Response-aware: count only responses with these statuses.
    pub count_status: Option<CountStatus>,
    /// The cost known from the response: reserve an estimate, settle
    /// with the real cost.
    pub cost_from_response: Option<Arc<CostFromResponse>>,
    /// The rate quotas' limiter; `None` for a rule with only a concurrency
    /// limit.
    pub limit: Option<Arc<Limit<AnyBackend>>>,
    pub overrides: HashMap<String, Arc<Limit<AnyBackend>>>,
    /// The rule's concurrency quota (with the file's load signal, for
    /// elastic mode).
    pub concurrency: Option<Protection>,
    pub priority: Priority,
    /// The penalty box, if the rule has one.
    pub penalty: Option<super::penalty::Penalty>,
    /// Its top offenders, kept across reloads while the rule keeps its name.
    pub top: Arc<super::top::TopKeys>,
}

/// One part of a rule's key.
pub(super) enum RuleKey {
    Extract(Box<dyn KeyExtractor>),
    Route(String),
}

impl Compiled {
    /// Compiles `file`, keeping `old`'s backend (and so its counters) when
    /// the backend settings did not change. `backend_override` replaces the
    /// file's backend.
    pub(super) fn new(
        file: RulesFile,
        old: Option<&Compiled>,
        backend_override: Option<&BackendConfig>,
        path: Option<&Path>,
    ) -> Result<Self, RulesError> {
        let error = |m: String| RulesError::new(path, m);
        let backend_config = backend_override.unwrap_or(&file.backend).clone();
        let backend = match old {
            Some(old) if old.backend_config == backend_config => old.backend.clone(),
            _ => AnyBackend::from_config(&backend_config, path).map_err(error)?,
        };
        for (list, name) in [(&file.deny, "deny"), (&file.allow, "allow")] {
            list.keys
                .iter()
                .try_for_each(|k| listed_key(k, name))
                .map_err(error)?;
        }
        let client_ip = client_ip(&file.client_ip).map_err(error)?;
        let peer_ip = PeerIp::new().ipv6_prefix(file.client_ip.ipv6_prefix);
        let protect = protection(&file, old).map_err(error)?;
        let near_limit = match &file.near_limit {
            None => DEFAULT_NEAR_LIMIT,
            Some(share) if (0.0..=1.0).contains(&share.value) => share.value,
            Some(share) => {
                return Err(error(share.error(format_args!(
                    "near_limit is {}; write a share of a quota from 0 to 1 (0.8: above 80%)",
                    share.value
                ))));
            }
        };
        let runtime = old.map_or_else(Default::default, |o| Arc::clone(&o.runtime));
        let mut rules = Vec::with_capacity(file.rules.len());
        for (i, rc) in file.rules.iter().enumerate() {
            if file.rules[..i].iter().any(|o| o.name == rc.name) {
                return Err(error(rc.name.error(format_args!(
                    "two rules are named {:?}; rule names name their counters, so they must differ",
                    rc.name.value.0
                ))));
            }
            let parts = KeyParts {
                peer_ip,
                client_ip: client_ip.as_ref(),
            };
            check_limited(rc).map_err(error)?;
            let mut rule = rule(rc, &backend, &parts, near_limit).map_err(error)?;
            rule.concurrency =
                concurrency(rc, old, &protect, &backend_config, path).map_err(error)?;
            check_elastic(rc, &protect).map_err(error)?;
            if let Some(p) = &rc.penalty {
                let pk = file.partition_key.as_ref().map(|pk| pk.0.clone());
                let penalty = super::penalty::Penalty::new(
                    &rule.name,
                    p,
                    &backend,
                    &runtime,
                    file.timeout.0,
                    pk,
                );
                rule.penalty = Some(penalty.map_err(error)?);
            }
            if let Some(kept) = old.and_then(|o| o.rules.iter().find(|r| r.name == rule.name)) {
                rule.top = Arc::clone(&kept.top);
            }
            rules.push(rule);
        }
        let (single_headers, host_rules) = super::host::single_headers(&file);
        Ok(Compiled {
            single_headers,
            host_rules,
            respond: ResponsePolicy {
                header_style: file.headers.0,
                on_backend_error: file.on_backend_error.0,
                partition_key: file.partition_key.as_ref().map(|pk| pk.0.clone()),
                ..ResponsePolicy::default()
            },
            on_missing_key: file.on_missing_key.0,
            timeout: file.timeout.0,
            matching: file.matching.0,
            backend,
            backend_config,
            client_ip,
            protect,
            rules,
            file,
            reasons: ReasonMetrics::new(),
            waits: Default::default(),
            runtime,
        })
    }
}

/// Refuses a listed key that no rule could ever build: keys are written as
/// built (`key:<header value>`, `user:<id>`, `ip:<address>`, `route:...`,
/// `global`, parts joined by `|`), and a bare `revoked` would pass a check
/// of the file yet never deny anything.
fn listed_key(key: &str, list: &str) -> Result<(), String> {
    const BUILT: [&str; 4] = ["key:", "user:", "ip:", "route:"];
    let first = key.split('|').next().unwrap_or_default();
    if first == "global" || BUILT.iter().any(|p| first.starts_with(p)) {
        return Ok(());
    }
    // Shortened: a listed key may be a live API key, and this message may
    // be logged (a reload's error).
    let mut shown: String = key.chars().take(4).collect();
    if shown.len() < key.len() {
        shown.push('…');
    }
    Err(format!(
        "{list}: keys: {shown:?} can never match: keys are written as they are built, \
         such as \"key:{shown}\" (an API key header's value), \"user:{shown}\" or \"ip:{shown}\" \
         (shortened here)"
    ))
}

/// The most proxies a forwarding header is read through: longer chains are
/// refused when read, so more hops could never find a client.
const MAX_HOPS: usize = 64;

/// How the client address is found: behind trusted proxies, behind a
/// number of hops, or (`None`) the connection's peer.
fn client_ip(ip: &ClientIpConfig) -> Result<Option<ClientIp>, String> {
    let nets = ip.trusted_proxies.iter().map(|c| c.0.into());
    let client_ip = match (&ip.hops, ip.trusted_proxies.is_empty()) {
        (Some(hops), false) => {
            return Err(hops.error("client_ip: give trusted_proxies or hops, not both"));
        }
        (Some(hops), true) if !(1..=MAX_HOPS).contains(&hops.value) => {
            return Err(hops.error(format_args!(
                "client_ip: hops is {}; write 1 to {MAX_HOPS}, the proxies in front of this server (none: remove client_ip)",
                hops.value
            )));
        }
        (Some(hops), true) => Some(ClientIp::hops(hops.value)),
        (None, false) => Some(ClientIp::trusted_proxies(nets)),
        (None, true) => None,
    };
    Ok(client_ip.map(|c| c.header(ip.header.0).ipv6_prefix(ip.ipv6_prefix)))
}

/// The extractors the key parts are made from.
struct KeyParts<'a> {
    peer_ip: PeerIp,
    client_ip: Option<&'a ClientIp>,
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
fn rule(
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
        for key in &o.value.keys {
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

/// The file's load shedding and measured load. A reload whose `shedding:`
/// section did not change keeps measuring on the same gauge.
fn protection(file: &RulesFile, old: Option<&Compiled>) -> Result<Protection, String> {
    let Some(sc) = &file.shedding else {
        return Ok(Protection::default());
    };
    let c = &sc.value;
    if c.max_in_flight.value == 0 {
        return Err(c
            .max_in_flight
            .error("shedding: max_in_flight must be at least 1"));
    }
    let shedding = Shedding::new()
        .reserved(c.reserved.value)
        .map_err(|e| c.reserved.error(format_args!("shedding: {e}")))?
        .retry_after(c.retry_after.0);
    let measured = old
        .filter(|o| o.file.shedding == file.shedding)
        .and_then(|o| o.protect.measured.clone())
        .unwrap_or_else(|| MeasuredLoad::new(c.max_in_flight.value, c.target_latency.value.0));
    Ok(Protection {
        concurrency: None,
        shedding: Some(shedding),
        signal: Some(Arc::new(measured.clone())),
        measured: Some(measured),
    })
}

/// A rule's concurrency quota, with the file's load signal for elastic
/// mode and its slots where the backend keeps state. A reload that left the
/// rule's setting and the backend alone keeps its slots, so requests under
/// way still count.
fn concurrency(
    rc: &RuleConfig,
    old: Option<&Compiled>,
    file: &Protection,
    backend: &BackendConfig,
    path: Option<&Path>,
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
        .filter(|o| o.backend_config == *backend)
        .and_then(|o| o.rules.iter().find(|r| r.name == *name))
        .filter(|r| {
            let before = r.concurrency.as_ref().and_then(|p| p.concurrency.as_ref());
            before.is_some_and(|q| (q.limit(), q.ceiling()) == (quota.limit(), quota.ceiling()))
        })
        .and_then(|r| r.concurrency.as_ref()?.concurrency.clone());
    let quota = match kept {
        Some(kept) => kept,
        None => with_slots(backend, path, name, quota)?,
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
fn check_limited(rc: &RuleConfig) -> Result<(), String> {
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
fn check_elastic(rc: &RuleConfig, file: &Protection) -> Result<(), String> {
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

impl super::Rules {
    /// Whether `ip` is in the file's `client_ip.trusted_proxies` (as now in
    /// force): a proxy whose connections carry many clients, which the
    /// `tollgate` gateway does not cap per address.
    pub fn is_trusted_proxy(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        let compiled = self.inner.current.load();
        (compiled.file.client_ip.trusted_proxies.iter()).any(|net| net.0.contains(&ip))
    }

    /// For each rule whose leaky-bucket quota can delay a request, in file
    /// order, the name and the longest it may hold one before passing it on
    /// (its queue full ahead of it): what the `tollgate` gateway compares
    /// with its idle timeout, since a client or proxy may give up first.
    pub fn longest_delays(&self) -> Vec<(String, Duration)> {
        let compiled = self.inner.current.load();
        (compiled.rules.iter())
            .filter_map(|rule| {
                let limits = rule.limit.iter().chain(rule.overrides.values());
                let longest = limits
                    .flat_map(|l| l.limiter.quotas().quotas())
                    .filter_map(|q| longest_delay(q, rule.cost))
                    .max()?;
                Some((rule.name.clone(), longest))
            })
            .collect()
    }
}

/// The delay a leaky bucket gives a request of `cost` that finds its queue
/// full but for it: one interval (`period / limit`) per unit ahead.
fn longest_delay(q: &Quota, cost: u64) -> Option<Duration> {
    if q.algorithm() != crate::Algorithm::LeakyBucket {
        return None;
    }
    let ahead = q.max_cost().saturating_sub(cost);
    if ahead == 0 {
        return None;
    }
    let micros = q.period().as_micros() * u128::from(ahead) / u128::from(q.limit().max(1));
    Some(Duration::from_micros(
        u64::try_from(micros).unwrap_or(u64::MAX),
    ))
}

#[cfg(test)]
mod tests {
    use crate::rules::Rules;

    const RULES: &str = "rules:\n  - name: api\n    key: header:x-api-key\n    quotas: [{ name: q, algorithm: gcra, limit: 5, period: 1m }]\n";

    #[test]
    fn a_listed_key_no_rule_could_build_is_refused_with_its_spelling() {
        let err = Rules::parse(&format!("deny: {{ keys: [\"revoked\"] }}\n{RULES}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("deny: keys: \"revo…\" can never match"),
            "{err}"
        );
        assert!(err.contains("\"key:revo…\""), "{err}");
        assert!(!err.contains("revoked"), "the key is shortened: {err}");
        let err = Rules::parse(&format!("allow: {{ keys: [\"vip\"] }}\n{RULES}"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("allow: keys: \"vip\" can never match"),
            "{err}"
        );
        for good in [
            "key:revoked",
            "user:7",
            "ip:192.0.2.1",
            "global",
            "key:a|ip:192.0.2.1",
        ] {
            let yaml = format!("deny: {{ keys: [\"{good}\"] }}\n{RULES}");
            assert!(Rules::parse(&yaml).is_ok(), "{good}");
        }
    }
}
