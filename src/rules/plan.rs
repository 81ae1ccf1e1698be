//! Which limits a request is checked against: the lists, the rules that
//! match it, and their keys.

use std::net::IpAddr;

use http::StatusCode;
use http::request::Parts;
use smallvec::SmallVec;

use super::backend::AnyBackend;
use super::compile::{Compiled, Rule, RuleKey};
use super::host::header_matches;
use super::names::MatchMode;
use super::path::normalize_path;
use super::runtime::Found;
use crate::key::{Key, KeyError, peer_addr};
use crate::layer::pipeline::{
    Check, Checks, DEFAULT_MAX_KEY_LEN, KeyOutcome, LimitRef, Pipeline, admit_key,
};
use crate::layer::{Headers, Priority, Reason, Verdict, problem};

impl Compiled {
    /// The steps after the plan, with the file's settings.
    pub(super) fn pipeline(&self) -> Pipeline<'_> {
        Pipeline {
            respond: &self.respond,
            protect: &self.protect,
            timeout: self.timeout,
            decisions: false,
            reasons: &self.reasons,
            waits: &self.waits,
        }
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
    pub(super) fn plan<'a>(&'a self, parts: &Parts) -> Result<Checks<'a, AnyBackend>, Verdict> {
        self.check_head(parts)
            .map_err(|detail| refused(StatusCode::BAD_REQUEST, &detail, Reason::BadRequest))?;
        let path = normalize_path(parts.uri.path()).map_err(|e| {
            tracing::debug!(error = %e, "path refused");
            refused(
                StatusCode::BAD_REQUEST,
                &format!("The request path cannot be read: {e}."),
                Reason::BadRequest,
            )
        })?;
        // Shed before any list, key or quota is looked at: an overloaded
        // server has no room for that work either.
        if self.protect.shedding.is_some() {
            let priority = self
                .rules
                .iter()
                .find(|r| r.applies(parts, &path))
                .map_or(Priority::default(), |r| r.priority);
            if let Some(shed) = self.protect.shed_as(priority) {
                return Err(shed);
            }
        }
        let lists = (&self.file.allow, &self.file.deny);
        if !lists.0.ips.is_empty() || !lists.1.ips.is_empty() {
            // A list that cannot be checked refuses: skipping it would let a
            // denied client in by garbling its forwarding header.
            let ip = self.client_addr(parts).map_err(|e| {
                tracing::debug!(error = %e, "client address unreadable; IP lists cannot be checked");
                refused(
                    e.status(),
                    &format!("The client address cannot be read, so the IP lists cannot be checked: {e}."),
                    Reason::BadRequest,
                )
            })?;
            if lists.1.ips.iter().any(|n| n.0.contains(&ip)) {
                let key = Key::from(format!("ip:{ip}"));
                let reason = Reason::DenyList;
                let key = self.respond.logged_key(&key);
                tracing::debug!(key = key.as_str(), reason = reason.as_str(), "denylisted");
                return Err(forbidden());
            }
            if lists.0.ips.iter().any(|n| n.0.contains(&ip)) {
                return Err(Verdict::pass(Headers::new(), Reason::AllowList));
            }
        }
        let mut checks = SmallVec::new();
        for rule in self.rules.iter().filter(|r| r.applies(parts, &path)) {
            let key = match admit_key(rule.key(parts), DEFAULT_MAX_KEY_LEN, self.on_missing_key) {
                KeyOutcome::Limit(key) => key,
                KeyOutcome::Settled(verdict) if verdict.is_response() => return Err(verdict),
                KeyOutcome::Settled(_) => continue,
            };
            tracing::trace!(
                rule = rule.name.as_str(),
                key = self.respond.logged_key(&key).as_str(),
                "rule applies"
            );
            if self.file.deny.keys.contains(key.as_str()) {
                let reason = Reason::DenyList;
                let key = self.respond.logged_key(&key);
                tracing::debug!(key = key.as_str(), reason = reason.as_str(), "denylisted");
                return Err(forbidden());
            }
            let first = self.matching == MatchMode::First;
            if self.file.allow.keys.contains(key.as_str()) {
                if first {
                    return Err(Verdict::pass(Headers::new(), Reason::AllowList));
                }
            } else {
                let mut limit = (rule.overrides.get(key.as_str()).or(rule.limit.as_ref()))
                    .map(LimitRef::Borrowed);
                // Run-time entries: one load while there are none.
                match self.runtime.find(&rule.name, key.as_str()) {
                    Some(Found::Blocked(ms)) => return Err(blocked(ms)),
                    Some(Found::Override(l)) => limit = Some(LimitRef::Owned(l)),
                    None => {}
                }
                checks.push(Check {
                    watch: Some(rule),
                    limit,
                    key,
                    // A cost from the response reserves its estimate.
                    cost: match &rule.cost_from_response {
                        Some(from) => from.estimate(&parts.headers),
                        None => rule.cost,
                    },
                    count_status: rule.count_status.as_ref(),
                    cost_from_response: rule.cost_from_response.as_ref(),
                    concurrency: rule.concurrency.as_ref(),
                });
            }
            if first {
                break;
            }
        }
        Ok(checks)
    }
}

/// A blocked key's answer: 429, with the block's time left as Retry-After.
fn blocked(ms: u64) -> Verdict {
    let secs = ms.div_ceil(1000).max(1);
    let detail = format!("This client is blocked for {secs} more seconds.");
    let reason = Reason::Blocked;
    let mut response = problem(
        StatusCode::TOO_MANY_REQUESTS,
        "about:blank",
        &detail,
        &[],
        reason,
    );
    (response.headers_mut()).insert(http::header::RETRY_AFTER, http::HeaderValue::from(secs));
    Verdict::respond(response, reason)
}

fn forbidden() -> Verdict {
    refused(
        StatusCode::FORBIDDEN,
        "This client is not allowed.",
        Reason::DenyList,
    )
}

fn refused(status: StatusCode, detail: &str, reason: Reason) -> Verdict {
    Verdict::respond(problem(status, "about:blank", detail, &[], reason), reason)
}

impl Rule {
    /// Whether the rule applies to a request with this normalised path.
    fn applies(&self, parts: &Parts, path: &str) -> bool {
        let m = &self.matches;
        let how = m.compare();
        m.path.as_ref().is_none_or(|p| p.matches(path, how))
            && m.prefix.as_ref().is_none_or(|p| p.matches(path, how))
            // Methods are tokens, but `get` reaches many servers as GET.
            && (m.methods.is_empty()
                || (m.methods.iter())
                    .any(|x| x.0.as_str().eq_ignore_ascii_case(parts.method.as_str())))
            && m.headers.iter().all(|h| header_matches(parts, h))
    }

    fn key(&self, parts: &Parts) -> Result<Key, KeyError> {
        let mut keys: SmallVec<[Key; 2]> = SmallVec::new();
        for part in &self.key {
            keys.push(match part {
                RuleKey::Route(r) => Key::route(&parts.method, r),
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
