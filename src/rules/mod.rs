//! Rate-limit rules kept in a YAML file, reloaded while the service runs.
//!
//! ```
//! use tollgate::RateLimitLayer;
//! use tollgate::rules::Rules;
//!
//! let rules = Rules::parse(r#"
//! rules:
//!   - name: login
//!     match: { path: /login, methods: [POST] }
//!     key: client_ip
//!     quotas:
//!       - { algorithm: sliding_log, limit: 5, period: 1m }
//!   - name: everything-else
//!     key: peer_ip
//!     quotas:
//!       - { algorithm: gcra, limit: 100, period: 1m, burst: 20 }
//! "#)?;
//! let layer = RateLimitLayer::from_policy(rules);
//! # let _ = layer;
//! # Ok::<(), tollgate::rules::RulesError>(())
//! ```
//!
//! See `examples/rules.yaml` for every setting. Requests are matched against
//! the rules in file order: the first that matches applies (`matching:
//! first`, the default), or every one that matches (`matching: all`), in
//! which case a request refused by a later rule has still spent from the
//! earlier ones. A request no rule matches is not limited.

mod backend;
mod file;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use http::StatusCode;
use http::request::Parts;
use smallvec::SmallVec;

pub use backend::AnyBackend;

use crate::backend::Backend;
use crate::decision::Decision;
use crate::key::{
    ClientIp, ExtensionKey, GlobalKey, HeaderKey, Key, KeyError, KeyExtractor, PeerIp, UserId,
    peer_addr,
};
use crate::layer::{
    CountStatus, DEFAULT_MAX_KEY_LEN, Headers, KeyOutcome, Limit, OnMissingKey, Policy,
    ResponsePolicy, Sealed, Verdict, admit_key, check_within, look_within, problem,
};
use crate::limiter::{Error, Limiter};
use crate::quota_set::QuotaSet;
use file::{BackendConfig, KeyPart, MatchConfig, MatchMode, RulesFile};

/// Why rules could not be loaded: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesError {
    path: Option<PathBuf>,
    message: String,
}

impl RulesError {
    fn new(path: Option<&Path>, message: impl Into<String>) -> Self {
        RulesError {
            path: path.map(Path::to_path_buf),
            message: message.into(),
        }
    }

    /// What is wrong, with the line and column when the file says it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}: {}", p.display(), self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RulesError {}

/// Rules from a file, as a [`Policy`] for [`RateLimitLayer`](crate::RateLimitLayer).
///
/// Clones share the rules in force, so a handle kept aside can
/// [`reload`](Rules::reload) them, or [`watch`](Rules::watch) the file.
#[derive(Clone)]
pub struct Rules {
    inner: Arc<Inner>,
}

struct Inner {
    current: ArcSwap<Compiled>,
    path: Option<PathBuf>,
    backend_override: Option<BackendOverride>,
    last_text: Mutex<String>,
}

/// A backend chosen outside the file (`tollgate serve --redis URL`).
#[derive(Debug, Clone, PartialEq)]
struct BackendOverride(BackendConfig);

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rules")
            .field("path", &self.inner.path)
            .field("rules", &self.inner.current.load().rules.len())
            .finish_non_exhaustive()
    }
}

impl Rules {
    /// Rules from YAML text.
    pub fn parse(yaml: &str) -> Result<Self, RulesError> {
        Rules::build(yaml, None, None)
    }

    /// Rules from a file.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, RulesError> {
        let path = path.as_ref();
        let text = read(path)?;
        Rules::build(&text, Some(path), None)
    }

    /// Rules from a file, with the backend replaced by Redis at `url`
    /// whatever the file says.
    pub fn load_with_redis(path: impl AsRef<Path>, url: &str) -> Result<Self, RulesError> {
        let path = path.as_ref();
        let text = read(path)?;
        let config = BackendConfig::Redis {
            url: url.to_owned(),
            prefix: "tollgate:".into(),
            timeout: file::default_redis_timeout(),
            on_failure: Default::default(),
        };
        Rules::build(&text, Some(path), Some(BackendOverride(config)))
    }

    fn build(
        text: &str,
        path: Option<&Path>,
        backend_override: Option<BackendOverride>,
    ) -> Result<Self, RulesError> {
        let file = parse(text, path)?;
        let compiled = Compiled::new(file, None, backend_override.as_ref(), path)?;
        Ok(Rules {
            inner: Arc::new(Inner {
                current: ArcSwap::from_pointee(compiled),
                path: path.map(Path::to_path_buf),
                backend_override,
                last_text: Mutex::new(text.to_owned()),
            }),
        })
    }

    /// The rules in force, described in words (what `tollgate check` prints).
    pub fn describe(&self) -> String {
        self.inner.current.load().file.to_string()
    }

    /// The backend in force.
    pub fn backend(&self) -> AnyBackend {
        self.inner.current.load().backend.clone()
    }

    /// Reads the file again. A valid new version takes effect at once;
    /// quotas that did not change keep their counters (the backend is kept
    /// when its settings did not change). An invalid version changes nothing
    /// and is returned as the error. Returns whether anything changed.
    pub fn reload(&self) -> Result<bool, RulesError> {
        let Some(path) = &self.inner.path else {
            return Ok(false);
        };
        let text = read(path)?;
        let mut last = self
            .inner
            .last_text
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *last == text {
            return Ok(false);
        }
        let file = parse(&text, Some(path))?;
        let old = self.inner.current.load_full();
        let compiled = Compiled::new(
            file,
            Some(&old),
            self.inner.backend_override.as_ref(),
            Some(path),
        )?;
        self.inner.current.store(Arc::new(compiled));
        *last = text;
        Ok(true)
    }

    /// Checks the file for changes every `every` (from a tokio task) and
    /// reloads it, logging what happened; an invalid version leaves the old
    /// rules in force. The task ends when every handle to these rules is
    /// gone.
    pub fn watch(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                match (Rules { inner }).reload() {
                    Ok(true) => tracing::info!("rules reloaded"),
                    Ok(false) => {}
                    Err(error) => {
                        tracing::error!(%error, "rules file invalid; keeping the rules in force")
                    }
                }
            }
        })
    }
}

fn read(path: &Path) -> Result<String, RulesError> {
    std::fs::read_to_string(path)
        .map_err(|e| RulesError::new(Some(path), format!("cannot read the rules file: {e}")))
}

fn parse(text: &str, path: Option<&Path>) -> Result<RulesFile, RulesError> {
    serde_saphyr::from_str::<RulesFile>(text).map_err(|e| RulesError::new(path, e.to_string()))
}

/// The rules ready to decide.
struct Compiled {
    file: RulesFile,
    backend: AnyBackend,
    backend_config: BackendConfig,
    respond: ResponsePolicy,
    on_missing_key: OnMissingKey,
    timeout: Duration,
    matching: MatchMode,
    /// Where client addresses come from: behind proxies when configured.
    client_ip: Option<ClientIp>,
    rules: Vec<Rule>,
}

struct Rule {
    name: String,
    matches: MatchConfig,
    key: Vec<RuleKey>,
    cost: u64,
    count_status: Option<CountStatus>,
    limit: Limit<AnyBackend>,
    overrides: HashMap<String, Limit<AnyBackend>>,
}

enum RuleKey {
    Extract(Box<dyn KeyExtractor>),
    Route(String),
}

impl Compiled {
    fn new(
        file: RulesFile,
        old: Option<&Compiled>,
        backend_override: Option<&BackendOverride>,
        path: Option<&Path>,
    ) -> Result<Self, RulesError> {
        let error = |m: String| RulesError::new(path, m);
        let backend_config = backend_override.map_or_else(|| file.backend.clone(), |o| o.0.clone());
        let backend = match old {
            Some(old) if old.backend_config == backend_config => old.backend.clone(),
            _ => AnyBackend::from_config(&backend_config).map_err(error)?,
        };
        let ip = &file.client_ip;
        let nets = ip.trusted_proxies.iter().map(|c| c.0);
        let client_ip = match (ip.hops, ip.trusted_proxies.is_empty()) {
            (Some(_), false) => {
                return Err(error(
                    "client_ip: give trusted_proxies or hops, not both".into(),
                ));
            }
            (Some(hops), true) => Some(ClientIp::hops(hops)),
            (None, false) => Some(ClientIp::trusted_proxies(nets)),
            (None, true) => None,
        }
        .map(|c| c.header(ip.header.0).ipv6_prefix(ip.ipv6_prefix));
        let peer_ip = PeerIp::new().ipv6_prefix(ip.ipv6_prefix);
        let mut rules = Vec::with_capacity(file.rules.len());
        for (i, rc) in file.rules.iter().enumerate() {
            let name = rc.name.0.clone();
            if file.rules[..i].iter().any(|o| o.name.0 == name) {
                return Err(error(format!(
                    "two rules are named {name:?}; rule names name their counters, so they must differ"
                )));
            }
            let set = |suffix: &str, quotas: Vec<crate::quota::Quota>| {
                QuotaSet::new(format!("{name}{suffix}"), quotas)
                    .map(|s| Limiter::new(backend.clone(), s))
                    .map_err(|e| error(format!("rule {name}: {e}")))
            };
            let limiter = set("", rc.quotas.0.iter().map(|q| q.quota.clone()).collect())?;
            let mut overrides = HashMap::new();
            for (j, o) in rc.overrides.iter().enumerate() {
                let quotas = match (&o.multiply, &o.quotas) {
                    (Some(0), _) => {
                        return Err(error(format!(
                            "rule {name}, override {}: multiply must be at least 1",
                            j + 1
                        )));
                    }
                    (Some(n), None) => rc
                        .quotas
                        .0
                        .iter()
                        .map(|q| q.scaled(*n))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| error(format!("rule {name}, override {}: {e}", j + 1)))?,
                    (None, Some(qs)) => qs.0.iter().map(|q| q.quota.clone()).collect(),
                    _ => {
                        return Err(error(format!(
                            "rule {name}, override {}: give either multiply or quotas",
                            j + 1
                        )));
                    }
                };
                let limit = Limit::new(set(&format!("#override{}", j + 1), quotas)?);
                for key in &o.keys {
                    overrides.insert(key.clone(), limit.clone());
                }
            }
            let route = rc
                .matches
                .path
                .as_ref()
                .map(|p| p.text.clone())
                .or_else(|| rc.matches.prefix.clone())
                .unwrap_or_else(|| format!("rule {name}"));
            let mut key = Vec::new();
            for part in &rc.key.0 {
                key.push(match part {
                    KeyPart::PeerIp => RuleKey::Extract(Box::new(peer_ip)),
                    KeyPart::ClientIp => match &client_ip {
                        Some(c) => RuleKey::Extract(Box::new(c.clone())),
                        None => RuleKey::Extract(Box::new(peer_ip)),
                    },
                    KeyPart::Header(h) => RuleKey::Extract(Box::new(HeaderKey::new(h.clone()))),
                    KeyPart::User => RuleKey::Extract(Box::new(ExtensionKey::<UserId>::new())),
                    KeyPart::Global => RuleKey::Extract(Box::new(GlobalKey)),
                    KeyPart::Route => RuleKey::Route(route.clone()),
                });
            }
            rules.push(Rule {
                name,
                matches: rc.matches.clone(),
                key,
                cost: rc.cost,
                count_status: rc.count_status.as_ref().map(|c| c.0.clone()),
                limit: Limit::new(limiter),
                overrides,
            });
        }
        Ok(Compiled {
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
            rules,
            file,
        })
    }

    fn client_addr(&self, parts: &Parts) -> Result<IpAddr, KeyError> {
        match &self.client_ip {
            Some(c) => c.client(parts),
            None => peer_addr(parts).ok_or(KeyError::NoPeerAddress),
        }
    }

    /// The limits a request is checked against, or its verdict when none is
    /// needed (allowlisted, denylisted, no key). The verdict's headers are
    /// inline, a copy cheaper than an allocation per request.
    #[allow(clippy::result_large_err)]
    fn plan<'a>(&'a self, parts: &Parts) -> Result<SmallVec<[Step<'a>; 2]>, Verdict> {
        let lists = (&self.file.allow, &self.file.deny);
        if !lists.0.ips.is_empty() || !lists.1.ips.is_empty() {
            if let Ok(ip) = self.client_addr(parts) {
                if lists.1.ips.iter().any(|n| n.0.contains(&ip)) {
                    return Err(forbidden(&format!("ip:{ip}")));
                }
                if lists.0.ips.iter().any(|n| n.0.contains(&ip)) {
                    return Err(Verdict::pass(Headers::new()));
                }
            }
        }
        let mut steps = SmallVec::new();
        for rule in self.rules.iter().filter(|r| r.applies(parts)) {
            let key = match admit_key(rule.key(parts), DEFAULT_MAX_KEY_LEN, self.on_missing_key) {
                KeyOutcome::Limit(key) => key,
                KeyOutcome::Settled(verdict) if verdict.is_response() => return Err(verdict),
                KeyOutcome::Settled(_) => continue,
            };
            tracing::trace!(
                rule = rule.name.as_str(),
                key = key.as_str(),
                "rule applies"
            );
            if self.file.deny.keys.contains(key.as_str()) {
                return Err(forbidden(key.as_str()));
            }
            if !self.file.allow.keys.contains(key.as_str()) {
                let limit = rule.overrides.get(key.as_str()).unwrap_or(&rule.limit);
                steps.push(Step {
                    limit,
                    key,
                    cost: rule.cost,
                    count_status: rule.count_status.as_ref(),
                });
            }
            if self.matching == MatchMode::First {
                break;
            }
        }
        Ok(steps)
    }
}

impl Compiled {
    /// The verdict so far, with one more limit's decision judged and added.
    fn add(&self, verdict: Verdict, step: &Step<'_>, outcome: Result<Decision, Error>) -> Verdict {
        let judged = step.limit.judge(&self.respond, &step.key, outcome);
        let judged = match step.count_status {
            Some(counts) => judged.charging(Arc::new(step.limit.clone()).charge(
                &self.respond,
                counts,
                step.key.clone(),
                step.cost,
                self.timeout,
            )),
            None => judged,
        };
        verdict.and(judged)
    }
}

struct Step<'a> {
    limit: &'a Limit<AnyBackend>,
    key: Key,
    cost: u64,
    /// Response-aware: look now, charge these statuses after the response.
    count_status: Option<&'a CountStatus>,
}

fn forbidden(key: &str) -> Verdict {
    tracing::debug!(key, "denylisted");
    Verdict::respond(problem(
        StatusCode::FORBIDDEN,
        "about:blank",
        "This client is not allowed.",
        &[],
    ))
}

impl Rule {
    fn applies(&self, parts: &Parts) -> bool {
        let m = &self.matches;
        let path = parts.uri.path();
        m.path.as_ref().is_none_or(|p| p.matches(path))
            && m.prefix
                .as_ref()
                .is_none_or(|p| path.starts_with(p.as_str()))
            && (m.methods.is_empty() || m.methods.iter().any(|x| x.0 == parts.method))
            && m.headers
                .iter()
                .all(|h| match (parts.headers.get(&h.name.0), &h.value) {
                    (Some(v), Some(want)) => v.as_bytes() == want.as_bytes(),
                    (Some(_), None) => true,
                    (None, _) => false,
                })
    }

    fn key(&self, parts: &Parts) -> Result<Key, KeyError> {
        let mut keys: SmallVec<[Key; 2]> = SmallVec::new();
        for part in &self.key {
            keys.push(match part {
                RuleKey::Route(r) => Key::from(format!("route:{} {r}", parts.method)),
                // The built-in extractors never wait.
                RuleKey::Extract(e) => match e.extract(parts).into_ready() {
                    Ok(key) => key?,
                    Err(_) => return Err(KeyError::Missing("key (an extractor would wait)")),
                },
            });
        }
        Ok(if keys.len() == 1 {
            keys.remove(0)
        } else {
            Key::join(&keys)
        })
    }
}

impl Sealed for Rules {}

impl Policy for Rules {
    fn decide_now(&self, parts: &Parts) -> Option<Verdict> {
        let compiled = self.inner.current.load();
        if !compiled.backend.decides_now() {
            return None;
        }
        let steps = match compiled.plan(parts) {
            Ok(steps) => steps,
            Err(verdict) => return Some(verdict),
        };
        if steps.iter().any(|s| s.count_status.is_some()) {
            return None;
        }
        let mut verdict = Verdict::pass(Headers::new());
        for step in steps {
            let outcome = step.limit.limiter.check_now(step.key.as_str(), step.cost)?;
            verdict = compiled.add(verdict, &step, outcome);
            if verdict.is_response() {
                break;
            }
        }
        Some(verdict)
    }

    fn decide<'a>(&'a self, parts: &'a Parts) -> impl Future<Output = Verdict> + Send + 'a {
        let compiled = self.inner.current.load_full();
        async move {
            let steps = match compiled.plan(parts) {
                Ok(steps) => steps,
                Err(verdict) => return verdict,
            };
            let mut verdict = Verdict::pass(Headers::new());
            for step in steps {
                let (limiter, key) = (&step.limit.limiter, &step.key);
                let outcome = match step.count_status {
                    Some(_) => look_within(limiter, key, step.cost, compiled.timeout).await,
                    None => check_within(limiter, key, step.cost, compiled.timeout).await,
                };
                verdict = compiled.add(verdict, &step, outcome);
                if verdict.is_response() {
                    break;
                }
            }
            verdict
        }
    }
}
