//! Costs known only once a request is served (the tokens of an LLM
//! answer): where the real cost is read, what is reserved until then, and
//! the watch over a response that settles the reservation when its body
//! ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName};

/// Where a request's real cost comes from when only its response knows it
/// (the tokens an LLM answer took), and what is reserved until then.
///
/// Before the request, the estimate is reserved: `reserve`, or the number
/// in a request header ([`reserve_header`](Self::reserve_header), such as
/// the `max_tokens` a client asks for). Once served, the reservation is
/// settled with the real cost ([`Settle::Actual`](crate::Settle::Actual)):
/// the handler's [`Usage`] report if it made one, else the named header in
/// the response's trailers (HTTP/2, gRPC), else in its headers. What was
/// reserved beyond the real cost goes back; what it took beyond is charged
/// even past the limit (the key is then in debt, and refused with a
/// `Retry-After` that covers it). A response whose body never ends (the
/// client went away) or that reports no usage keeps its reservation.
///
/// ```
/// use http::HeaderName;
/// use tollgate::layer::CostFromResponse;
///
/// let tokens = CostFromResponse::header(HeaderName::from_static("x-usage-total-tokens"), 500)
///     .reserve_header(HeaderName::from_static("x-max-tokens"));
/// # let _ = tokens;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostFromResponse {
    header: HeaderName,
    reserve: u64,
    reserve_header: Option<HeaderName>,
}

impl CostFromResponse {
    /// The real cost in the response header (or trailer) `header`, a
    /// decimal number; `reserve` reserved until it is known.
    pub fn header(header: HeaderName, reserve: u64) -> Self {
        CostFromResponse {
            header,
            reserve,
            reserve_header: None,
        }
    }

    /// The estimate in the request header `header` rather than the fixed
    /// reserve, when it holds a decimal number; else the reserve.
    pub fn reserve_header(mut self, header: HeaderName) -> Self {
        self.reserve_header = Some(header);
        self
    }

    /// The header (or trailer) with the real cost.
    pub fn cost_header(&self) -> &HeaderName {
        &self.header
    }

    /// What a request with `headers` reserves.
    pub fn estimate(&self, headers: &HeaderMap) -> u64 {
        self.reserve_header
            .as_ref()
            .and_then(|name| number(headers, name))
            .unwrap_or(self.reserve)
    }

    /// The real cost in `headers` (a response's headers or trailers), if
    /// they say it.
    pub fn actual(&self, headers: &HeaderMap) -> Option<u64> {
        number(headers, &self.header)
    }
}

/// The header's value as a decimal number: one value, ASCII digits only
/// (no sign, no spaces), at most 19 of them. Anything else, or the header
/// twice, is no number: a hostile or broken value never becomes a cost.
fn number(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > 19 || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A request's real cost as its handler reports it: found in the request's
/// extensions when the limit takes its cost from the response
/// ([`CostFromResponse`]). Reported before the response body ends, it
/// settles the reservation in place of any header or trailer.
///
/// ```
/// use axum::Extension;
/// use tollgate::layer::Usage;
///
/// async fn answer(Extension(usage): Extension<Usage>) -> &'static str {
///     // ... the answer took 1 234 tokens:
///     usage.report(1_234);
///     "hello"
/// }
/// # let _ = answer;
/// ```
#[derive(Debug, Clone)]
pub struct Usage(Arc<AtomicU64>);

/// No report yet: a cost no request reaches.
const UNREPORTED: u64 = u64::MAX;

impl Default for Usage {
    fn default() -> Self {
        Usage(Arc::new(AtomicU64::new(UNREPORTED)))
    }
}

impl Usage {
    /// Reports the request's real cost; a later report replaces it.
    pub fn report(&self, cost: u64) {
        self.0.store(cost.min(UNREPORTED - 1), Ordering::Release);
    }

    /// The cost reported, if any.
    pub fn reported(&self) -> Option<u64> {
        let cost = self.0.load(Ordering::Acquire);
        (cost != UNREPORTED).then_some(cost)
    }
}

/// Settles a reservation with the real cost, once: spawned, as a body's end
/// cannot wait for the store.
pub(crate) type SettleWith = Box<dyn FnOnce(u64) + Send>;

/// The watch over one response for its real cost: fed its headers and
/// trailers, it settles when the body ends. Dropped before that (the client
/// went away, the body failed), it settles nothing: the reservation stands.
pub(crate) struct UsageWatch {
    from: Arc<CostFromResponse>,
    usage: Usage,
    /// The cost in the response's headers, then replaced by its trailers'.
    found: Option<u64>,
    settle: Option<SettleWith>,
}

impl UsageWatch {
    pub(crate) fn new(from: Arc<CostFromResponse>, usage: Usage, settle: SettleWith) -> Self {
        UsageWatch {
            from,
            usage,
            found: None,
            settle: Some(settle),
        }
    }

    /// The report the handler may fill in.
    pub(crate) fn usage(&self) -> &Usage {
        &self.usage
    }

    /// The response's headers are known.
    pub(crate) fn headers(&mut self, headers: &HeaderMap) {
        if let Some(cost) = self.from.actual(headers) {
            self.found = Some(cost);
        }
    }

    /// The body's trailers came.
    pub(crate) fn trailers(&mut self, trailers: &HeaderMap) {
        if let Some(cost) = self.from.actual(trailers) {
            self.found = Some(cost);
        }
    }

    /// The body ended: settles with the handler's report, else what the
    /// trailers or headers said; with neither, the reservation stands.
    pub(crate) fn ended(&mut self) {
        let Some(actual) = self.usage.reported().or(self.found) else {
            return;
        };
        if let Some(settle) = self.settle.take() {
            settle(actual);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn from() -> CostFromResponse {
        CostFromResponse::header(HeaderName::from_static("x-usage"), 500)
            .reserve_header(HeaderName::from_static("x-max"))
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn estimates_and_actual_costs_refuse_anything_but_one_plain_number() {
        let f = from();
        assert_eq!(f.estimate(&headers(&[])), 500);
        assert_eq!(f.estimate(&headers(&[("x-max", "120")])), 120);
        for bad in [
            "",
            "-1",
            "+5",
            " 5",
            "5 ",
            "1e3",
            "0x10",
            "99999999999999999999",
            "５",
        ] {
            let mut h = HeaderMap::new();
            if let Ok(v) = http::HeaderValue::from_bytes(bad.as_bytes()) {
                h.insert("x-max", v.clone());
                h.insert("x-usage", v);
            }
            assert_eq!(f.estimate(&h), 500, "{bad:?}");
            assert_eq!(f.actual(&h), None, "{bad:?}");
        }
        assert_eq!(f.actual(&headers(&[("x-usage", "42")])), Some(42));
        assert_eq!(
            f.actual(&headers(&[("x-usage", "1"), ("x-usage", "2")])),
            None
        );
    }

    #[test]
    fn the_handler_then_the_trailer_then_the_header_decide() {
        let settled = Arc::new(Mutex::new(Vec::new()));
        let watch = |usage: &Usage| {
            let s = Arc::clone(&settled);
            UsageWatch::new(
                Arc::new(from()),
                usage.clone(),
                Box::new(move |n| s.lock().unwrap().push(n)),
            )
        };
        let usage = Usage::default();
        let mut w = watch(&usage);
        w.headers(&headers(&[("x-usage", "10")]));
        w.ended();
        let mut w = watch(&usage);
        w.headers(&headers(&[("x-usage", "10")]));
        w.trailers(&headers(&[("x-usage", "20")]));
        w.ended();
        usage.report(30);
        let mut w = watch(&usage);
        w.headers(&headers(&[("x-usage", "10")]));
        w.ended();
        w.ended(); // once only
        // No usage said: the reservation stands, nothing settles.
        let mut w = watch(&Usage::default());
        w.headers(&headers(&[]));
        w.ended();
        // Dropped before its end: nothing settles.
        let mut w = watch(&Usage::default());
        w.headers(&headers(&[("x-usage", "99")]));
        drop(w);
        assert_eq!(*settled.lock().unwrap(), vec![10, 20, 30]);
    }
}
