//! What a provider's answer says about sending more: `Retry-After`,
//! draft-11 `RateLimit` and `RateLimit-Policy` (and the draft-7 `RateLimit`
//! dictionary), read from headers that may come from anyone.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

/// The pause taken on a 429 that says not for how long.
const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause a provider may ask for: a broken or hostile answer
/// cannot stop a key for longer.
pub const MAX_PAUSE: Duration = Duration::from_secs(3600);

/// What a provider's answer asks of its sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signal {
    pause: Option<Duration>,
    refused: bool,
    /// Microseconds a unit at the announced rate (0: none).
    announced: u64,
}

impl Signal {
    /// Reads an HTTP answer: a 429 (or a trailers-only gRPC answer with
    /// `grpc-status: 8`), or a 503 with `Retry-After`, pauses the key for
    /// that long (a 429 without one for 1 s) and counts as a refusal; a `RateLimit` field with a policy at `r=0` (or
    /// `remaining=0`) pauses it for that policy's `t` (or `reset`); a
    /// `RateLimit-Policy` announces the strictest of its rates (`q` units a
    /// `w` seconds). `now` reads an HTTP date. Pauses are capped at
    /// [`MAX_PAUSE`]; what cannot be parsed is ignored, except that a 429
    /// always pauses.
    pub fn from_http(status: StatusCode, headers: &HeaderMap, now: SystemTime) -> Signal {
        let mut signal = Signal::default();
        let retry_after = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, now));
        // A gRPC refusal is HTTP 200 with `grpc-status: 8`
        // (RESOURCE_EXHAUSTED) in the headers when it has no body
        // ("trailers-only"), as tollgate's own layer answers.
        let grpc_exhausted = headers
            .get("grpc-status")
            .is_some_and(|v| v.as_bytes() == b"8");
        if status == StatusCode::TOO_MANY_REQUESTS || grpc_exhausted {
            signal.refused = true;
            signal.pause = Some(retry_after.unwrap_or(DEFAULT_PAUSE));
        } else if status == StatusCode::SERVICE_UNAVAILABLE && retry_after.is_some() {
            signal.refused = true;
            signal.pause = retry_after;
        }
        for value in headers.get_all("ratelimit") {
            if let Some(pause) = value.to_str().ok().and_then(exhausted) {
                signal.pause = signal.pause.max(Some(pause));
            }
        }
        for value in headers.get_all("ratelimit-policy") {
            if let Some(interval) = value.to_str().ok().and_then(announced) {
                signal.announced = signal.announced.max(interval);
            }
        }
        signal.pause = signal.pause.map(|p| p.min(MAX_PAUSE));
        signal
    }

    /// How long to send nothing to the key, if at all.
    pub fn pause(&self) -> Option<Duration> {
        self.pause
    }

    /// Whether the provider refused the request for its rate.
    pub fn refused(&self) -> bool {
        self.refused
    }

    /// The interval a unit of the announced rate, in microseconds.
    pub(crate) fn announced(&self) -> Option<u64> {
        (self.announced > 0).then_some(self.announced)
    }
}

/// `Retry-After`: delay-seconds, or an HTTP date (then relative to `now`,
/// and 0 if past).
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits to parse is as long as can be; the cap applies.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Splits `s` at `sep` outside quoted strings.
fn split_outside_quotes(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    let bytes = s.as_bytes();
    let mut cuts = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if b == sep && !quoted {
            cuts.push((start, i));
            start = i + 1;
        }
    }
    cuts.push((start, bytes.len()));
    // The cuts are at ASCII bytes, so every range is on char boundaries.
    cuts.into_iter()
        .map(move |(a, b)| s.get(a..b).unwrap_or(""))
}

/// The parameters of one list item: `"name";a=1;b=2` as (key, value) pairs.
fn params(item: &str) -> impl Iterator<Item = (&str, &str)> {
    split_outside_quotes(item, b';').filter_map(|p| {
        let (k, v) = p.split_once('=')?;
        Some((k.trim(), v.trim()))
    })
}

/// A non-negative integer, at most 15 digits (structured fields' limit).
fn integer(v: &str) -> Option<u64> {
    if v.is_empty() || v.len() > 15 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// The pause a `RateLimit` field asks for: the longest `t` of its policies
/// at `r=0` (draft 11), or `reset` when `remaining=0` (draft 7's
/// dictionary, one item a member).
fn exhausted(value: &str) -> Option<Duration> {
    let mut pause: Option<u64> = None;
    let (mut remaining, mut reset) = (None, None);
    for item in split_outside_quotes(value, b',') {
        let (mut r, mut t) = (None, None);
        for (k, v) in params(item) {
            match k {
                "r" => r = integer(v),
                "t" => t = integer(v),
                _ => {}
            }
        }
        if let (Some(0), Some(t)) = (r, t) {
            pause = pause.max(Some(t));
        }
        if let Some((k, v)) = item.split_once('=') {
            match k.trim() {
                "remaining" => remaining = integer(v.trim()),
                "reset" => reset = integer(v.trim()),
                _ => {}
            }
        }
    }
    if let (Some(0), Some(reset)) = (remaining, reset) {
        pause = pause.max(Some(reset));
    }
    pause.map(Duration::from_secs)
}

/// The interval a unit of the strictest policy in a `RateLimit-Policy`
/// field, in microseconds (`q` units a `w` seconds).
fn announced(value: &str) -> Option<u64> {
    let mut strictest: Option<u64> = None;
    for item in split_outside_quotes(value, b',') {
        let (mut q, mut w) = (None, None);
        for (k, v) in params(item) {
            match k {
                "q" => q = integer(v),
                "w" => w = integer(v),
                _ => {}
            }
        }
        if let (Some(q), Some(w)) = (q, w)
            && q > 0
            && w > 0
        {
            let interval = w.saturating_mul(1_000_000).div_ceil(q);
            strictest = strictest.max(Some(interval));
        }
    }
    strictest
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn signal(status: u16, headers: &[(&str, &str)]) -> Signal {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777);
        Signal::from_http(StatusCode::from_u16(status).unwrap(), &map, now)
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let s = signal(429, &[("retry-after", "7")]);
        assert_eq!(
            (s.pause(), s.refused()),
            (Some(Duration::from_secs(7)), true)
        );
        // Sun, 06 Nov 1994 08:49:37 GMT is 784111777.
        let s = signal(503, &[("retry-after", "Sun, 06 Nov 1994 08:49:47 GMT")]);
        assert_eq!(s.pause(), Some(Duration::from_secs(10)));
        let past = signal(429, &[("retry-after", "Sun, 06 Nov 1994 08:00:00 GMT")]);
        assert_eq!(past.pause(), Some(Duration::ZERO));
    }

    #[test]
    fn a_429_always_pauses_and_pauses_are_capped() {
        assert_eq!(signal(429, &[]).pause(), Some(DEFAULT_PAUSE));
        assert_eq!(
            signal(429, &[("retry-after", "soon")]).pause(),
            Some(DEFAULT_PAUSE)
        );
        let huge = signal(429, &[("retry-after", "99999999999999999999999")]);
        assert_eq!(huge.pause(), Some(MAX_PAUSE));
        let grpc = signal(200, &[("grpc-status", "8"), ("retry-after", "3")]);
        assert_eq!(
            (grpc.pause(), grpc.refused()),
            (Some(Duration::from_secs(3)), true)
        );
        // A 503 without Retry-After may have nothing to do with rates.
        assert_eq!(signal(503, &[]), Signal::default());
        assert_eq!(signal(200, &[("retry-after", "5")]), Signal::default());
    }

    #[test]
    fn ratelimit_fields_at_zero_pause() {
        let s = signal(
            200,
            &[("ratelimit", "\"burst\";r=3;t=1, \"day\";r=0;t=3600")],
        );
        assert_eq!(
            (s.pause(), s.refused()),
            (Some(Duration::from_secs(3600)), false)
        );
        let quoted = signal(200, &[("ratelimit", "\"a,r=0;t=9\";r=1;t=5")]);
        assert_eq!(quoted.pause(), None);
        let draft7 = signal(200, &[("ratelimit", "limit=10, remaining=0, reset=4")]);
        assert_eq!(draft7.pause(), Some(Duration::from_secs(4)));
        assert_eq!(signal(200, &[("ratelimit", "\"a\";r=1;t=5")]).pause(), None);
    }

    #[test]
    fn the_strictest_announced_policy() {
        let s = signal(
            200,
            &[("ratelimit-policy", "\"a\";q=100;w=1, \"b\";q=600;w=60")],
        );
        assert_eq!(s.announced(), Some(100_000));
        let junk = signal(200, &[("ratelimit-policy", "\"a\";q=0;w=1, x;q=-3;w=1")]);
        assert_eq!(junk.announced(), None);
    }
}
