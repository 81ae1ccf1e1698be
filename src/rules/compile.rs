//! A parsed rules file made ready to decide: the backend, the client-address
//! finder, and each rule's limiters and key.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::backend::AnyBackend;
use super::error::RulesError;
use super::key_part::{BUILT, key_parts, part_as_built};
use super::model::{BackendConfig, ClientIpConfig, MatchConfig, RulesFile};
use super::names::MatchMode;
use crate::key::{ClientIp, KeyExtractor, PeerIp};
use crate::layer::ReasonMetrics;
use crate::layer::limit::{DEFAULT_NEAR_LIMIT, Limit};
use crate::layer::protect::Protection;
use crate::layer::{
    CostFromResponse, CountStatus, MeasuredLoad, OnMissingKey, Priority, ResponsePolicy, Shedding,
};
use crate::quota::Quota;

mod rule;

use rule::{KeyParts, check_elastic, check_limited, concurrency, rule};

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
        let peer_ip = file.client_ip.peer_ip();
        for (list, name) in [(&file.deny, "deny"), (&file.allow, "allow")] {
            list.keys
                .iter()
                .try_for_each(|k| listed_key(k, name, peer_ip))
                .map_err(error)?;
        }
        let client_ip = client_ip(&file.client_ip).map_err(error)?;
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
                concurrency(rc, old, &protect, &backend_config, &backend).map_err(error)?;
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

/// Refuses a key of a list, or of a rule's override, that no rule could
/// ever build: keys are written as built (`key:<header value>`,
/// `user:<id>`, `ip:<address>`, `route:<METHOD> <route>`, `global`, parts
/// joined by `|`), and a bare `revoked` would pass a check of the file yet
/// never deny anything. So would an address written otherwise than a
/// client's key writes it (`ip:::ffff:192.0.2.1` for `ip:192.0.2.1`, an
/// IPv6 address where the file groups by /64), or a route written
/// otherwise than its key (`route:get /x`, `route:/x` for `route:GET /x`):
/// the spelling to use is given.
pub(super) fn listed_key(key: &str, list: &str, peer_ip: PeerIp) -> Result<(), String> {
    for part in key_parts(key) {
        match part_as_built(part, peer_ip) {
            None => {}
            Some(Ok(built)) if built.as_str() == part => {}
            Some(Ok(built)) => {
                return Err(format!(
                    "{list}: keys: {part:?} can never match: a request's key is written {:?}",
                    built.as_str()
                ));
            }
            Some(Err(how)) => return Err(format!("{list}: keys: {part:?} can never match: {how}")),
        }
    }
    let first = key_parts(key).next().unwrap_or_default();
    if first == "global" || BUILT.iter().any(|p| first.starts_with(p)) {
        return Ok(());
    }
    let shown = shortened(key);
    Err(format!(
        "{list}: keys: {shown:?} can never match: keys are written as they are built, \
         such as \"key:{shown}\" (an API key header's value), \"user:{shown}\" or \"ip:{shown}\" \
         (shortened here)"
    ))
}

/// `key` cut to its first four characters for an error: a listed key may
/// be a live API key, and the message may be logged (a reload's error).
pub(super) fn shortened(key: &str) -> String {
    let mut shown: String = key.chars().take(4).collect();
    if shown.len() < key.len() {
        shown.push('…');
    }
    shown
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
mod tests;
