//! How decisions are told to clients: rate-limit headers, `Retry-After`, and
//! the problem-details body of a refusal.

use std::fmt::Write;
use std::sync::OnceLock;
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use smallvec::SmallVec;

use crate::decision::Decision;
use crate::quota_set::QuotaSet;

mod kept;

/// Which rate-limit headers responses carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// The IETF draft (draft-ietf-httpapi-ratelimit-headers-11):
    /// structured-field lists with one named policy per quota,
    /// `RateLimit-Policy: "10-per-60s";q=10;w=60` and
    /// `RateLimit: "10-per-60s";r=7;t=6`. `r` is the quota left and `t` the
    /// effective window: the seconds (rounded up) until more than `r` is
    /// available ([`QuotaDecision::replenish`](crate::QuotaDecision::replenish)),
    /// on a refusal never beyond `Retry-After`. The
    /// [headers chapter](crate::guide::headers) has a table of what they
    /// mean per algorithm. With a
    /// [`PartitionKey`](super::PartitionKey), `RateLimit` items carry `pk`.
    #[default]
    Ietf,
    /// The older draft-6 form, for the quota closest to refusing:
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds
    /// until the quota is fully restored).
    Draft6,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
    /// (seconds from now, not an epoch time), and `X-RateLimit-Retry-After`
    /// on a 429.
    Legacy,
    /// No rate-limit headers (a 429 still carries `Retry-After`).
    None,
}

/// The headers a response gains. Two (the IETF pair) fit without
/// allocating; more would make every verdict and response future larger, and
/// they are moved a few times per request.
pub(crate) type Headers = SmallVec<[(Name, HeaderValue); 2]>;

/// A header the layer writes, made a [`HeaderName`] only where it is
/// inserted, from a constant: a few stores. Cloning a kept custom name
/// instead (its bytes are a `Bytes`) is a call through a vtable whose
/// result is then copied piece by piece, which stalled the processor on
/// each response (6% of the layer's time on an AMD EPYC, in
/// `scripts/bench-time.sh layer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Name {
    RateLimit,
    RateLimitPolicy,
    RateLimitLimit,
    RateLimitRemaining,
    RateLimitReset,
    XLimit,
    XRemaining,
    XReset,
    XRetryAfter,
    RetryAfter,
}

impl Name {
    /// The header's name.
    #[inline]
    pub(crate) fn header(self) -> HeaderName {
        match self {
            Name::RateLimit => const { HeaderName::from_static("ratelimit") },
            Name::RateLimitPolicy => const { HeaderName::from_static("ratelimit-policy") },
            Name::RateLimitLimit => const { HeaderName::from_static("ratelimit-limit") },
            Name::RateLimitRemaining => const { HeaderName::from_static("ratelimit-remaining") },
            Name::RateLimitReset => const { HeaderName::from_static("ratelimit-reset") },
            Name::XLimit => const { HeaderName::from_static("x-ratelimit-limit") },
            Name::XRemaining => const { HeaderName::from_static("x-ratelimit-remaining") },
            Name::XReset => const { HeaderName::from_static("x-ratelimit-reset") },
            Name::XRetryAfter => const { HeaderName::from_static("x-ratelimit-retry-after") },
            Name::RetryAfter => http::header::RETRY_AFTER,
        }
    }

    /// Whether the field is a list (the IETF pair), to which a nested
    /// layer's items are appended rather than replacing them.
    fn is_list(self) -> bool {
        matches!(self, Name::RateLimit | Name::RateLimitPolicy)
    }
}

/// Whole seconds, rounded up: a client told to wait 0 s retries straight
/// into another refusal.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `Retry-After` seconds: rounded up, and never 0 on a refusal.
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

/// A number as a header value. Small numbers, which remaining counts and
/// resets mostly are, come from a table made once, without allocating.
pub(crate) fn number(n: u64) -> HeaderValue {
    static SMALL: OnceLock<Vec<HeaderValue>> = OnceLock::new();
    let table = SMALL.get_or_init(|| {
        (0..1024u32)
            .map(|i| HeaderValue::from_static(Box::leak(i.to_string().into_boxed_str())))
            .collect()
    });
    usize::try_from(n)
        .ok()
        .and_then(|i| table.get(i))
        .cloned()
        .unwrap_or_else(|| HeaderValue::from(n))
}

/// Appends `name` as an RFC 9651 string (quota names are printable ASCII,
/// checked when the quota is built).
pub(crate) fn sf_string(out: &mut impl Write, name: &str) {
    let _ = out.write_char('"');
    if name.bytes().any(|b| b == b'"' || b == b'\\') {
        for c in name.chars() {
            if c == '"' || c == '\\' {
                let _ = out.write_char('\\');
            }
            let _ = out.write_char(c);
        }
    } else {
        let _ = out.write_str(name);
    }
    let _ = out.write_char('"');
}

/// Formats a header value on the stack, so that making it costs one exact
/// allocation; a longer value spills into a `String`.
struct Buffer {
    bytes: [u8; 128],
    len: usize,
    spill: Option<String>,
}

impl Buffer {
    fn new() -> Self {
        Buffer {
            bytes: [0; 128],
            len: 0,
            spill: None,
        }
    }

    fn value(&self) -> Option<HeaderValue> {
        match &self.spill {
            Some(s) => HeaderValue::from_str(s).ok(),
            None => HeaderValue::from_bytes(&self.bytes[..self.len]).ok(),
        }
    }
}

impl Buffer {
    /// Appends `s`: inlined where a header is made, where `write_str`
    /// through the `Write` trait was a call per piece (five per quota).
    #[inline]
    fn push(&mut self, s: &str) {
        match self.bytes.get_mut(self.len..self.len + s.len()) {
            Some(room) if self.spill.is_none() => {
                room.copy_from_slice(s.as_bytes());
                self.len += s.len();
            }
            _ => self.spill_push(s),
        }
    }

    /// Appends `s` past the stack's room.
    #[cold]
    fn spill_push(&mut self, s: &str) {
        let spill = self
            .spill
            .get_or_insert_with(|| String::from_utf8_lossy(&self.bytes[..self.len]).into_owned());
        spill.push_str(s);
    }
}

impl Write for Buffer {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push(s);
        Ok(())
    }
}

/// What a quota set's headers repeat on every response, made once: its
/// `RateLimit-Policy` value (each quota's name, capacity and window), and
/// each quota's name as an RFC 9651 string, which starts its `RateLimit`
/// item.
#[derive(Debug, Clone)]
pub(crate) struct PolicyHeader {
    /// Backed by bytes kept for the process (`kept`): a response's copy
    /// is then a pointer, with no count on a line every core writes.
    value: HeaderValue,
    names: Box<[Box<str>]>,
    /// The set, when a quota of it is a calendar's: its `w` is the length
    /// of the period now, which changes (a month of 28 to 31 days, a local
    /// day of 23 to 25 hours), so the value is written per response.
    calendar: Option<QuotaSet>,
}

impl PolicyHeader {
    /// The `RateLimit-Policy` value now.
    fn value(&self) -> HeaderValue {
        match &self.calendar {
            None => self.value.clone(),
            Some(quotas) => {
                let now = crate::clock::Clock::now(&crate::clock::SystemClock);
                policy_value(quotas, now.as_micros())
            }
        }
    }
}

/// The [`PolicyHeader`] of `quotas`.
pub(crate) fn policy_header(quotas: &QuotaSet) -> PolicyHeader {
    let names = quotas
        .quotas()
        .iter()
        .map(|q| {
            let mut name = String::new();
            sf_string(&mut name, q.name());
            name.into_boxed_str()
        })
        .collect();
    let calendar = quotas.quotas().iter().any(|q| q.params.calendar.is_some());
    // A calendar's value is written per response: this one is never sent.
    let value = policy_value(quotas, 0);
    PolicyHeader {
        value: if calendar { value } else { kept::kept(value) },
        names,
        calendar: calendar.then(|| quotas.clone()),
    }
}

/// The `RateLimit-Policy` value of `quotas` at `now` (microseconds since
/// the epoch): `w` is a quota's window in seconds, for a calendar quota
/// the length of the period holding `now` (the draft's window is the one
/// the quota counts in, and a 30-day month is not 31 days long).
fn policy_value(quotas: &QuotaSet, now: u64) -> HeaderValue {
    let mut out = Buffer::new();
    for (i, q) in quotas.quotas().iter().enumerate() {
        if i > 0 {
            let _ = out.write_str(", ");
        }
        let mut name = String::new();
        sf_string(&mut name, q.name());
        let _ = out.write_str(&name);
        let window = match q.params.calendar {
            Some(windows) if now > 0 => {
                let (start, end) = windows.at(now);
                ceil_secs(Duration::from_micros(end.saturating_sub(start)))
            }
            _ => ceil_secs(q.period()),
        };
        let _ = write!(out, ";q={};w={}", q.params.reported_capacity, window.max(1));
    }
    // Printable ASCII and digits only, so this cannot fail.
    out.value().unwrap_or_else(|| HeaderValue::from_static(""))
}

/// The Retry-After of a refusal, in seconds.
pub(crate) fn refusal_wait(decision: &Decision) -> Option<u64> {
    decision
        .retry_after()
        .filter(|_| !decision.allowed())
        .map(retry_after_secs)
}

/// The single-value styles' limit, remaining and reset fields; `None` for
/// the list styles.
pub(crate) fn single_value_names(style: HeaderStyle) -> Option<[Name; 3]> {
    match style {
        HeaderStyle::Draft6 => Some([
            Name::RateLimitLimit,
            Name::RateLimitRemaining,
            Name::RateLimitReset,
        ]),
        HeaderStyle::Legacy => Some([Name::XLimit, Name::XRemaining, Name::XReset]),
        HeaderStyle::Ietf | HeaderStyle::None => None,
    }
}

/// The rate-limit headers for `decision`, and `Retry-After: wait` when the
/// response is a 429 that waits; no `t` points past it (draft-11 section
/// 6). `pk`, a partition key already formatted as a Byte Sequence, goes on
/// each `RateLimit` item.
pub(crate) fn rate_limit_headers(
    style: HeaderStyle,
    policy: &PolicyHeader,
    decision: &Decision,
    wait: Option<u64>,
    pk: Option<&str>,
) -> Headers {
    let mut out = Headers::new();
    match style {
        HeaderStyle::Ietf => {
            let mut state = Buffer::new();
            for (i, (name, d)) in policy.names.iter().zip(decision.quotas()).enumerate() {
                if i > 0 {
                    state.push(", ");
                }
                state.push(name);
                // Both from one reading: each may take a division.
                let (remaining, replenish) = d.left();
                let t = ceil_secs(Duration::from_micros(replenish));
                let t = wait.map_or(t, |wait| t.min(wait));
                // itoa: a tenth of `write!`'s instructions per number.
                let mut digits = itoa::Buffer::new();
                state.push(";r=");
                state.push(digits.format(remaining));
                state.push(";t=");
                state.push(digits.format(t));
                if let Some(pk) = pk {
                    state.push(";pk=");
                    state.push(pk);
                }
            }
            if let Some(state) = state.value() {
                out.push((Name::RateLimitPolicy, policy.value()));
                out.push((Name::RateLimit, state));
            }
        }
        HeaderStyle::Draft6 | HeaderStyle::Legacy => {
            let Some(b) = decision.binding() else {
                return out;
            };
            let Some(names) = single_value_names(style) else {
                return out;
            };
            let values = [b.limit(), b.remaining(), ceil_secs(b.reset())];
            for (name, value) in names.into_iter().zip(values) {
                out.push((name, number(value)));
            }
        }
        HeaderStyle::None => {}
    }
    if let Some(secs) = wait {
        push_retry_after(&mut out, style, secs);
    }
    out
}

/// `Retry-After: secs`, and its legacy twin in the legacy style.
pub(crate) fn push_retry_after(headers: &mut Headers, style: HeaderStyle, secs: u64) {
    headers.push((Name::RetryAfter, number(secs)));
    if style == HeaderStyle::Legacy {
        headers.push((Name::XRetryAfter, number(secs)));
    }
}

/// Adds a concurrency quota's headers (`more`) to a verdict's. The IETF
/// lists take both; the single-value styles show one quota, the one with
/// less remaining (on a tie the one already there, whose reset says more).
pub(crate) fn add_headers(headers: &mut Headers, more: Headers) {
    let remaining = |h: &Headers| {
        h.iter()
            .find(|(n, _)| matches!(n, Name::RateLimitRemaining | Name::XRemaining))
            .and_then(|(_, v)| v.to_str().ok()?.parse::<u64>().ok())
    };
    match (remaining(headers), remaining(&more)) {
        (Some(have), Some(new)) if new >= have => {}
        (Some(_), Some(_)) => {
            let single = [
                Name::RateLimitLimit,
                Name::RateLimitRemaining,
                Name::RateLimitReset,
                Name::XLimit,
                Name::XRemaining,
                Name::XReset,
            ];
            headers.retain(|(n, _)| !single.contains(n));
            headers.extend(more);
        }
        _ => headers.extend(more),
    }
}

/// Adds the layer's headers to a response from the inner service. The IETF
/// fields are lists, so a nested layer's policies are appended to the inner
/// one's; the single-value styles show the outermost layer's numbers.
pub(crate) fn apply(headers: Headers, to: &mut http::HeaderMap) {
    for (name, value) in headers {
        if name.is_list() {
            to.append(name.header(), value);
        } else {
            to.insert(name.header(), value);
        }
    }
}

#[cfg(test)]
mod tests;
