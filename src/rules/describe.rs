//! The rules as understood, in words (what `tollgate check` prints).

use std::fmt;

use super::model::{BackendConfig, RedisUrl, RulesFile};
use super::names::{Case, MatchMode, RedisFailure, TrailingSlash};
use crate::layer::{HeaderStyle, OnBackendError, OnMissingKey, Priority};
use crate::quota::{Mode, Quota};

impl fmt::Display for RulesFile {
    /// The rules as understood, for `tollgate check`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.backend {
            BackendConfig::Memory { max_keys } => {
                writeln!(f, "backend: memory, at most {max_keys} keys")?
            }
            BackendConfig::Redis {
                url,
                cluster,
                sentinel,
                tls,
                prefix,
                timeout,
                on_failure,
                lease,
            } => {
                let failure = match on_failure.0 {
                    RedisFailure::Error => "fail",
                    RedisFailure::Memory => "decide in memory",
                };
                // URLs show through their Display, which hides passwords.
                let list = |urls: &[RedisUrl]| {
                    urls.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let place = match (url, cluster, sentinel) {
                    (Some(url), _, _) => format!("redis at {}", url.value),
                    (_, Some(nodes), _) => format!("redis cluster at {}", list(&nodes.value)),
                    (_, _, Some(s)) => format!(
                        "redis sentinel master {:?} via {}",
                        s.value.master,
                        list(&s.value.urls)
                    ),
                    (None, None, None) => "redis".to_owned(),
                };
                let file = |f: &Option<super::at::At<std::path::PathBuf>>| {
                    f.as_ref().map(|f| f.value.display().to_string())
                };
                let tls = match (file(&tls.ca_file), file(&tls.cert_file)) {
                    (None, None) => String::new(),
                    (ca, cert) => format!(
                        "; TLS CA: {}, client certificate: {}",
                        ca.as_deref().unwrap_or("public roots"),
                        cert.as_deref().unwrap_or("none")
                    ),
                };
                writeln!(
                    f,
                    "backend: {place}, key prefix {prefix:?}; if Redis takes over {:?} or fails: {failure}; leases: {}{tls}",
                    timeout.0, lease.value.0
                )?
            }
        }
        let headers = match self.headers.0 {
            HeaderStyle::Ietf => "ietf",
            HeaderStyle::Draft6 => "draft6",
            HeaderStyle::Legacy => "legacy",
            _ => "none",
        };
        let failure = match self.on_backend_error.0 {
            OnBackendError::Allow => "let requests through",
            OnBackendError::Reject => "answer 503",
        };
        let missing = match self.on_missing_key.0 {
            OnMissingKey::Reject => "refused",
            OnMissingKey::Allow => "let through unlimited",
        };
        writeln!(f, "headers: {headers}")?;
        writeln!(
            f,
            "if the backend fails or takes over {:?}: {failure}",
            self.timeout.0
        )?;
        writeln!(f, "requests without a key: {missing}")?;
        let matching = match self.matching.0 {
            MatchMode::First => "the first rule that matches",
            MatchMode::All => "every rule that matches",
        };
        writeln!(f, "each request is checked against {matching}")?;
        for (what, list) in [
            ("never limited", &self.allow),
            ("always refused (403)", &self.deny),
        ] {
            if !list.ips.is_empty() || !list.keys.is_empty() {
                let ips: Vec<String> = list.ips.iter().map(|c| c.0.to_string()).collect();
                writeln!(
                    f,
                    "{what}: networks [{}], keys [{}]",
                    ips.join(", "),
                    list.keys.iter().cloned().collect::<Vec<_>>().join(", ")
                )?;
            }
        }
        if let Some(s) = &self.shedding {
            let s = &s.value;
            writeln!(
                f,
                "load shedding: full at {} requests in flight or {:?} average latency; {} kept for critical rules",
                s.max_in_flight.value, s.target_latency.value.0, s.reserved.value
            )?;
        }
        for rule in &self.rules {
            writeln!(f, "rule {}:", rule.name.value.0)?;
            let m = &rule.matches;
            let mut when = Vec::new();
            if let Some(p) = &m.path {
                when.push(format!("path {}", p.text));
            }
            if let Some(p) = &m.prefix {
                when.push(format!("path starts with {}", p.0));
            }
            if m.path.is_some() || m.prefix.is_some() {
                let how = m.compare();
                if how.trailing_slash == TrailingSlash::Strict {
                    when.push("a trailing slash counts".into());
                }
                if how.case == Case::Sensitive {
                    when.push("case counts".into());
                }
            }
            if !m.methods.is_empty() {
                let methods: Vec<&str> = m.methods.iter().map(|x| x.0.as_str()).collect();
                when.push(format!("method {}", methods.join("/")));
            }
            for h in &m.headers {
                match &h.value {
                    Some(v) => when.push(format!("header {} = {v:?}", h.name.0)),
                    None => when.push(format!("header {} present", h.name.0)),
                }
            }
            let when = if when.is_empty() {
                "every request".to_owned()
            } else {
                when.join(", ")
            };
            let key: Vec<String> = rule.key.0.iter().map(ToString::to_string).collect();
            writeln!(f, "  applies to: {when}")?;
            writeln!(f, "  key: {}; cost {}", key.join(" + "), rule.cost.value)?;
            for q in &rule.quotas.0 {
                writeln!(f, "  quota {}", describe(&q.quota))?;
            }
            if let Some(c) = &rule.concurrency {
                match &c.elastic {
                    Some(e) => writeln!(
                        f,
                        "  at most {} at once per key, {} while there is room",
                        c.limit.value, e.value
                    )?,
                    None => writeln!(f, "  at most {} at once per key", c.limit.value)?,
                }
            }
            if rule.priority.0 != Priority::Normal {
                writeln!(f, "  priority under load: {}", rule.priority.0.name())?;
            }
            for o in &rule.overrides {
                let o = &o.value;
                let keys = o.keys.iter().cloned().collect::<Vec<_>>().join(", ");
                match (&o.multiply, &o.quotas) {
                    (Some(n), _) => writeln!(f, "  for {keys}: limits x{n}")?,
                    (None, Some(qs)) => {
                        writeln!(f, "  for {keys}:")?;
                        for q in &qs.0 {
                            writeln!(f, "    quota {}", describe(&q.quota))?;
                        }
                    }
                    (None, None) => {}
                }
            }
        }
        Ok(())
    }
}

fn describe(q: &Quota) -> String {
    let per = match q.calendar() {
        Some(c) => match c.period() {
            crate::calendar::CalendarPeriod::Week { starts_on } => {
                format!("week from {} in {}", starts_on.as_str(), c.time_zone())
            }
            crate::calendar::CalendarPeriod::Month { starts_on } => {
                format!("month from day {starts_on} in {}", c.time_zone())
            }
            p => format!("{} in {}", p.unit(), c.time_zone()),
        },
        None => format!("{:?}", q.period()),
    };
    let mut s = format!("{:?}: {} {} per {per}", q.name(), q.algorithm(), q.limit());
    if q.algorithm().has_burst() && q.burst() != q.limit() {
        s.push_str(&format!(", burst {}", q.burst()));
    }
    match q.mode() {
        Mode::Enforce => {}
        Mode::Shadow => s.push_str(", shadow (never refuses)"),
        Mode::Soft { percent } => s.push_str(&format!(", soft (+{percent}%)")),
        Mode::Elastic { percent } => s.push_str(&format!(", elastic (+{percent}% with room)")),
    }
    if q.counts_rejected() {
        s.push_str(", counting refused attempts");
    }
    s
}
